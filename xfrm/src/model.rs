//! The pure part of output protection: what a policy or SA is (as far as
//! the agent cares), what a guard must look like, and the checks the lease
//! allocation and the read-back make. No sockets; unit-tested in
//! `model/tests.rs`.

use std::net::IpAddr;

use kube_ovn_ipsec_api::names::defaults::{GUARD_PRIORITY, MARK_MASK};
use serde::{Deserialize, Serialize};

/// `XFRM_POLICY_OUT`.
pub const DIR_OUT: u8 = 1;
/// `XFRM_POLICY_IN`.
pub const DIR_IN: u8 = 0;
/// `XFRM_POLICY_ALLOW`.
pub const ACTION_ALLOW: u8 = 0;
/// `XFRM_POLICY_BLOCK`.
pub const ACTION_BLOCK: u8 = 1;
/// `IPPROTO_ESP`.
pub const PROTO_ESP: u8 = 50;
/// `IPPROTO_UDP`.
pub const PROTO_UDP: u8 = 17;
/// The UDP destination ports of the overlay tunnels (geneve, vxlan): what
/// a bypass policy would have to let through to leak marked traffic.
pub const TUNNEL_PORTS: [u16; 2] = [6081, 4789];

/// An address family of XFRM selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `AF_INET`.
    Ipv4,
    /// `AF_INET6`.
    Ipv6,
}

impl Family {
    /// Both families, in the order guards are armed.
    pub const ALL: [Family; 2] = [Family::Ipv4, Family::Ipv6];

    /// The kernel's `AF_*` value.
    pub fn af(self) -> u16 {
        match self {
            Family::Ipv4 => 2,
            Family::Ipv6 => 10,
        }
    }

    /// The family of an `AF_*` value, if it is one of the two.
    pub fn from_af(af: u16) -> Option<Self> {
        match af {
            2 => Some(Family::Ipv4),
            10 => Some(Family::Ipv6),
            _ => None,
        }
    }

    /// The unspecified address of the family (`0.0.0.0` / `::`).
    pub fn any(self) -> IpAddr {
        match self {
            Family::Ipv4 => IpAddr::from([0u8; 4]),
            Family::Ipv6 => IpAddr::from([0u8; 16]),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        })
    }
}

/// An XFRM mark: a packet's mark `m` matches when `m & mask == value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Mark {
    /// The value.
    pub value: u32,
    /// The mask (0: no mark, matches every packet).
    pub mask: u32,
}

impl Mark {
    /// The exact mark `<value>/0xffffffff`.
    pub fn exact(value: u32) -> Self {
        Self {
            value,
            mask: MARK_MASK,
        }
    }

    /// Whether a packet carrying `packet_mark` matches this mark.
    pub fn matches(self, packet_mark: u32) -> bool {
        packet_mark & self.mask == self.value
    }
}

/// A selector, with addresses read by its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Selector {
    /// The family, or `None` for a family the agent does not know.
    pub family: Option<Family>,
    /// Source address.
    pub saddr: IpAddr,
    /// Source prefix length.
    pub prefixlen_s: u8,
    /// Destination address.
    pub daddr: IpAddr,
    /// Destination prefix length.
    pub prefixlen_d: u8,
    /// IP protocol (0: any).
    pub proto: u8,
    /// Source port (host order).
    pub sport: u16,
    /// Source port mask.
    pub sport_mask: u16,
    /// Destination port (host order).
    pub dport: u16,
    /// Destination port mask.
    pub dport_mask: u16,
    /// Interface index (0: any).
    pub ifindex: i32,
}

impl Selector {
    /// The wildcard selector of `family`: any address, protocol and port.
    pub fn wildcard(family: Family) -> Self {
        Self {
            family: Some(family),
            saddr: family.any(),
            prefixlen_s: 0,
            daddr: family.any(),
            prefixlen_d: 0,
            proto: 0,
            sport: 0,
            sport_mask: 0,
            dport: 0,
            dport_mask: 0,
            ifindex: 0,
        }
    }

    /// Whether a UDP packet to one of the overlay [`TUNNEL_PORTS`] (any
    /// addresses, any source port) can match. Conservative: an address or
    /// interface restriction still counts as "can match", because tunnel
    /// peers can be anywhere.
    pub fn admits_tunnel_traffic(&self) -> bool {
        (self.proto == 0 || self.proto == PROTO_UDP)
            && TUNNEL_PORTS
                .iter()
                .any(|p| p & self.dport_mask == self.dport & self.dport_mask)
    }
}

/// A policy template, without anything the agent does not use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Template {
    /// IPsec protocol (`PROTO_ESP`, AH = 51, COMP = 108).
    pub proto: u8,
    /// The reqid tying SAs to the policy.
    pub reqid: u32,
    /// Mode (0 transport, 1 tunnel, ...).
    pub mode: u8,
    /// Family of the template's addresses.
    pub family: u16,
    /// Whether the template is optional (`level use`).
    pub optional: bool,
}

/// An XFRM policy as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// The selector.
    pub selector: Selector,
    /// Direction (`DIR_OUT`, `DIR_IN`, 2 = fwd).
    pub dir: u8,
    /// Action (`ACTION_ALLOW`, `ACTION_BLOCK`).
    pub action: u8,
    /// Priority (lower wins).
    pub priority: u32,
    /// The kernel's index (0 in a request: let the kernel pick).
    pub index: u32,
    /// The mark, when the policy has one.
    pub mark: Option<Mark>,
    /// The `if_id` (xfrm interfaces), 0 when absent.
    pub if_id: u32,
    /// The policy type (0 main, 1 sub).
    pub ptype: u8,
    /// Policy flags (`XFRM_POLICY_LOCALOK`, ...).
    pub flags: u8,
    /// The templates.
    pub templates: Vec<Template>,
}

impl Policy {
    /// The mark, treating "none" as `0/0`.
    pub fn mark_or_none(&self) -> Mark {
        self.mark.unwrap_or_default()
    }

    /// The guard of `family` for lease mark `mark` (SPEC §4): outbound,
    /// wildcard selector, `action block`, priority 2^31-1, mark
    /// `<mark>/0xffffffff`, no template.
    pub fn guard(family: Family, mark: u32) -> Self {
        Self {
            selector: Selector::wildcard(family),
            dir: DIR_OUT,
            action: ACTION_BLOCK,
            priority: GUARD_PRIORITY,
            index: 0,
            mark: Some(Mark::exact(mark)),
            if_id: 0,
            ptype: 0,
            flags: 0,
            templates: Vec::new(),
        }
    }

    /// Whether this policy occupies the kernel key of `other`: the kernel
    /// refuses to add a second policy with the same type, direction,
    /// selector, mark and `if_id` (and would replace it on update).
    pub fn same_kernel_key(&self, other: &Policy) -> bool {
        self.ptype == other.ptype
            && self.dir == other.dir
            && self.selector == other.selector
            && self.mark_or_none() == other.mark_or_none()
            && self.if_id == other.if_id
    }
}

/// An XFRM state (SA), without keys: the dump parser never copies
/// algorithm attributes out of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct State {
    /// Family of the state's addresses.
    pub family: Option<Family>,
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// IPsec protocol.
    pub proto: u8,
    /// SPI (host order).
    pub spi: u32,
    /// reqid.
    pub reqid: u32,
    /// Mode (0 transport, 1 tunnel).
    pub mode: u8,
    /// The mark, when the state has one.
    pub mark: Option<Mark>,
    /// The `if_id`, 0 when absent.
    pub if_id: u32,
    /// The state's selector.
    pub selector: Selector,
    /// Bytes the SA has carried (the kernel's current lifetime), the
    /// data-path evidence that traffic flows through it.
    #[serde(default)]
    pub bytes: u64,
    /// Packets the SA has carried (the kernel's current lifetime).
    #[serde(default)]
    pub packets: u64,
    /// The acquire sequence number of a larval state (the kernel's
    /// placeholder for an SA an IKE daemon was asked to negotiate; SPI 0),
    /// 0 otherwise.
    #[serde(default)]
    pub seq: u32,
    /// Whether the SA is UDP-encapsulated (NAT-T, `XFRMA_ENCAP`): ESP then
    /// costs 8 more bytes per packet.
    #[serde(default)]
    pub encap: bool,
}

impl State {
    /// A larval (acquire) state: no SPI yet, no keys; it names what an
    /// IKE daemon was asked to negotiate and expires by itself.
    pub fn is_larval(&self) -> bool {
        self.spi == 0
    }
}

/// One field where a read-back policy differs from the guard it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMismatch {
    /// Field name.
    pub field: &'static str,
    /// What the guard must have.
    pub expected: String,
    /// What the kernel has.
    pub actual: String,
}

/// Compares a read-back policy with the guard it should be, field by field
/// (the index and the kernel's lifetime counters are not compared: the
/// index is how it was fetched). Empty when identical.
pub fn compare_guard(expected: &Policy, actual: &Policy) -> Vec<FieldMismatch> {
    let mut out = Vec::new();
    let mut check = |field: &'static str, e: String, a: String| {
        if e != a {
            out.push(FieldMismatch {
                field,
                expected: e,
                actual: a,
            });
        }
    };
    check(
        "selector",
        format!("{:?}", expected.selector),
        format!("{:?}", actual.selector),
    );
    check("dir", expected.dir.to_string(), actual.dir.to_string());
    check(
        "action",
        expected.action.to_string(),
        actual.action.to_string(),
    );
    check(
        "priority",
        expected.priority.to_string(),
        actual.priority.to_string(),
    );
    check(
        "mark",
        format!("{:?}", expected.mark),
        format!("{:?}", actual.mark),
    );
    check(
        "if_id",
        expected.if_id.to_string(),
        actual.if_id.to_string(),
    );
    check("type", expected.ptype.to_string(), actual.ptype.to_string());
    check(
        "templates",
        format!("{:?}", expected.templates),
        format!("{:?}", actual.templates),
    );
    out
}

/// Why a lease candidate was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CandidateRejection {
    /// Mark 0 would make the guards block every unmarked packet.
    ZeroMark,
    /// The mark has reserved bits (kube-proxy's by default).
    ReservedBits {
        /// The overlapping bits.
        bits: u32,
    },
    /// The mark falls under an existing policy's mark.
    PolicyMarkAlias {
        /// The policy's index.
        index: u32,
        /// Its mark.
        mark: Mark,
    },
    /// The mark falls under an existing state's mark.
    StateMarkAlias {
        /// The state's SPI.
        spi: u32,
        /// Its mark.
        mark: Mark,
    },
    /// The reqid is used by an existing policy template.
    PolicyReqid {
        /// The policy's index.
        index: u32,
    },
    /// The reqid is used by an existing state.
    StateReqid {
        /// The state's SPI.
        spi: u32,
    },
    /// The reqid is outside 1..2^31-1.
    ReqidRange,
}

/// Checks a `(mark, reqid)` candidate against the kernel's policies and
/// states and the reserved bits (SPEC §4 (a), (b)). `Ok` when usable.
///
/// "Aliases a mark under its mask" means a packet carrying the candidate
/// mark would match that policy's or state's mark. Policies and states
/// without a mark (mask 0) match every packet; they are not aliases (else
/// no mark could ever be allocated next to strongSwan's inbound policies)
/// — an unmarked outbound *bypass* is what [`find_bypass`] refuses.
pub fn check_candidate(
    mark: u32,
    reqid: u32,
    reserved_bits: u32,
    policies: &[Policy],
    states: &[State],
) -> Result<(), CandidateRejection> {
    use kube_ovn_ipsec_api::names::defaults::{REQID_MAX, REQID_MIN};
    if mark == 0 {
        return Err(CandidateRejection::ZeroMark);
    }
    if mark & reserved_bits != 0 {
        return Err(CandidateRejection::ReservedBits {
            bits: mark & reserved_bits,
        });
    }
    if !(REQID_MIN..=REQID_MAX).contains(&reqid) {
        return Err(CandidateRejection::ReqidRange);
    }
    for p in policies {
        if let Some(m) = p.mark
            && m.mask != 0
            && m.matches(mark)
        {
            return Err(CandidateRejection::PolicyMarkAlias {
                index: p.index,
                mark: m,
            });
        }
        if p.templates.iter().any(|t| t.reqid == reqid) {
            return Err(CandidateRejection::PolicyReqid { index: p.index });
        }
    }
    for s in states {
        if let Some(m) = s.mark
            && m.mask != 0
            && m.matches(mark)
        {
            return Err(CandidateRejection::StateMarkAlias {
                spi: s.spi,
                mark: m,
            });
        }
        if s.reqid == reqid {
            return Err(CandidateRejection::StateReqid { spi: s.spi });
        }
    }
    Ok(())
}

/// A policy that would let marked tunnel traffic out in plaintext ahead of
/// the guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    /// The policy's index.
    pub index: u32,
    /// Its family.
    pub family: Option<Family>,
    /// Its priority.
    pub priority: u32,
    /// Its mark.
    pub mark: Option<Mark>,
}

impl std::fmt::Display for Bypass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "outbound allow policy without ESP template (index {}, family {}, priority {}, mark {})",
            self.index,
            self.family
                .map_or_else(|| "?".to_string(), |f| f.to_string()),
            self.priority,
            self.mark.map_or_else(
                || "none".to_string(),
                |m| format!("{:#x}/{:#x}", m.value, m.mask)
            ),
        )
    }
}

/// Finds a bypass for packets marked `mark` (SPEC §4): an outbound `allow`
/// policy with no ESP template, whose mark matches `mark`, whose selector
/// admits UDP to the overlay ports, with no `if_id` (a policy with one only
/// sees xfrm-interface traffic) and a priority the guard does not beat
/// (the guard has the lowest precedence, 2^31-1; a tie goes to whichever
/// the kernel finds first, so it counts as a bypass).
pub fn find_bypass(mark: u32, policies: &[Policy]) -> Option<Bypass> {
    policies
        .iter()
        .find(|p| {
            p.dir == DIR_OUT
                && p.action == ACTION_ALLOW
                && !p.templates.iter().any(|t| t.proto == PROTO_ESP)
                && p.mark_or_none().matches(mark)
                && p.if_id == 0
                && p.priority <= GUARD_PRIORITY
                && p.selector.admits_tunnel_traffic()
        })
        .map(|p| Bypass {
            index: p.index,
            family: p.selector.family,
            priority: p.priority,
            mark: p.mark,
        })
}

#[cfg(test)]
mod tests;
