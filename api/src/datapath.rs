//! The data path as the agent reports it (SPEC §10): per peer, whether
//! encrypted traffic flows both ways and, when it does not, which cause the
//! kernel's counters point at; and the MTU arithmetic of an encrypted
//! overlay.
//!
//! Pure types and arithmetic: the agent's datapath actor fills them from
//! SA counters and `/proc/net/xfrm_stat`, `/status`, the metrics and
//! `ovs-appctl ipsec/show` show them. Nothing here can hold key material:
//! addresses, counters, validated chassis names, timestamps and reasons
//! whose messages are static text.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::ident::Chassis;
use crate::reason::Reason;
use crate::time::Timestamp;

/// `/proc/net/xfrm_stat`: outbound packets dropped by a `block` policy —
/// the guards' drops (marked traffic no IPsec policy claimed).
pub const OUT_POL_BLOCK: &str = "XfrmOutPolBlock";
/// `/proc/net/xfrm_stat`: outbound packets with a matching policy but no
/// usable state (an acquire pending: negotiation not done).
pub const OUT_NO_STATES: &str = "XfrmOutNoStates";
/// `/proc/net/xfrm_stat`: inbound ESP for which no state exists.
pub const IN_NO_STATES: &str = "XfrmInNoStates";
/// `/proc/net/xfrm_stat`: inbound packets that needed a policy's SA but
/// arrived without one.
pub const IN_TMPL_MISMATCH: &str = "XfrmInTmplMismatch";

/// How much a kernel counter grew from `before` to `now`. A counter that
/// went down (its namespace was recreated) counts again from zero — never
/// an underflow, never a negative growth.
pub fn counter_growth(before: u64, now: u64) -> u64 {
    if now >= before { now - before } else { now }
}

/// What the data path towards one peer looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PeerState {
    /// Encrypted traffic moves, and nothing points at loss: both
    /// directions' SAs count packets (or only inbound does: the peer's
    /// traffic arrives and this node has nothing to send).
    Healthy,
    /// The outbound SA counts packets, the inbound SA stayed flat for the
    /// whole window: what this node sends is not answered — ESP (IP proto
    /// 50) or UDP 4500 dropped on the underlay, or MTU.
    InboundMissing,
    /// No outbound SA to the peer and the guards dropped marked traffic
    /// (`XfrmOutPolBlock` grew): the IKE daemon is down or holds no
    /// CHILD_SA for the tunnel.
    GuardDrop,
    /// The tunnel has IPsec intent and one direction (or both) has no SA,
    /// with no guard drops: negotiation pending or failing.
    #[serde(rename = "NoSA")]
    NoSa,
    /// SAs exist in both directions and neither counted a packet in the
    /// window: no traffic to judge.
    Idle,
    /// A state from a newer agent that this build does not know.
    #[serde(other)]
    Unknown,
}

impl PeerState {
    /// Every state, in the order metrics list them.
    pub const ALL: [PeerState; 5] = [
        PeerState::Healthy,
        PeerState::InboundMissing,
        PeerState::GuardDrop,
        PeerState::NoSa,
        PeerState::Idle,
    ];

    /// The status reason of a problem state, `None` for `Healthy`/`Idle`.
    pub fn reason(self) -> Option<Reason> {
        match self {
            PeerState::InboundMissing => Some(Reason::InboundMissing),
            PeerState::GuardDrop => Some(Reason::GuardDrop),
            PeerState::NoSa => Some(Reason::NoSa),
            PeerState::Healthy | PeerState::Idle | PeerState::Unknown => None,
        }
    }

    /// The name in JSON, metrics and `ipsec/show`.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Healthy => "Healthy",
            PeerState::InboundMissing => "InboundMissing",
            PeerState::GuardDrop => "GuardDrop",
            PeerState::NoSa => "NoSA",
            PeerState::Idle => "Idle",
            PeerState::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for PeerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kernel's lifetime counters of one direction's SAs towards a peer,
/// summed over the SAs installed now (two during a rekey).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SaCounters {
    /// Installed SAs (larval acquire states not counted).
    pub sas: u32,
    /// Bytes carried.
    pub bytes: u64,
    /// Packets carried.
    pub packets: u64,
}

/// One peer of this node: a tunnel with IPsec intent (`remote_name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerHealth {
    /// The peer's underlay address (the tunnel's `remote_ip`).
    pub peer: IpAddr,
    /// The peer's chassis (the tunnel's `remote_name`), when it is a valid
    /// name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis: Option<Chassis>,
    /// The state.
    pub state: PeerState,
    /// The reason of a problem state (its message says what to check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Whether this peer counts against `datapathHealthy` (a problem state
    /// that outlasted its settling time).
    pub healthy: bool,
    /// When the peer entered its state.
    pub since: Timestamp,
    /// Outbound SAs (this node to the peer).
    pub outbound: SaCounters,
    /// Inbound SAs (the peer to this node).
    pub inbound: SaCounters,
    /// Whether the SAs are UDP-encapsulated (NAT traversal, port 4500).
    #[serde(default)]
    pub nat_traversal: bool,
    /// The enable window (SPEC §4): milliseconds from the tunnel's intent
    /// first seen to the first packets through its outbound SA; `None`
    /// while open, or when the SA already carried traffic when the agent
    /// first saw the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_window_millis: Option<u64>,
}

impl PeerHealth {
    /// The operator message of the peer's reason.
    pub fn message(&self) -> Option<&'static str> {
        self.reason.map(Reason::message)
    }
}

/// The overlay's encapsulation, as OVS names the interface type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encapsulation {
    /// Geneve (UDP 6081), OVN's default.
    Geneve,
    /// VXLAN (UDP 4789).
    Vxlan,
}

impl Encapsulation {
    /// The interface type in OVS's `Interface` table.
    pub fn from_ovs_type(t: &str) -> Option<Self> {
        match t {
            "geneve" => Some(Encapsulation::Geneve),
            "vxlan" => Some(Encapsulation::Vxlan),
            _ => None,
        }
    }

    /// Bytes the encapsulation adds to an inner IP packet, outer IP header
    /// included: inner Ethernet (14) + the tunnel header + UDP (8) + outer
    /// IPv4 (20) or IPv6 (40). Geneve's header is 8 bytes plus OVN's one
    /// option (4 header + 4 data: the logical ports), VXLAN's 8.
    pub fn overhead(self, outer_ipv6: bool) -> u32 {
        let ip = if outer_ipv6 { 40 } else { 20 };
        let tunnel = match self {
            Encapsulation::Geneve => 8 + 8,
            Encapsulation::Vxlan => 8,
        };
        14 + tunnel + 8 + ip
    }
}

/// ESP in transport mode with AES-GCM-16 (RFC 4106; the one proposal
/// ovs-monitor-ipsec configures) around the payload: SPI + sequence number
/// (8) and explicit IV (8) before it, ICV (16) after it.
pub const ESP_HEADER_IV_ICV: u32 = 8 + 8 + 16;
/// ESP's trailer after the payload: pad length and next header; payload
/// plus trailer are padded to a multiple of 4 (AES-GCM's block size is 1).
pub const ESP_TRAILER: u32 = 2;
/// The UDP header of NAT-T encapsulation (RFC 3948, port 4500).
pub const NAT_T_OVERHEAD: u32 = 8;

fn outer_ip(outer_ipv6: bool) -> u32 {
    if outer_ipv6 { 40 } else { 20 }
}

/// The size on the underlay of an inner packet of `inner` bytes, once
/// encapsulated and encrypted: exact, padding included.
pub fn encrypted_size(inner: u32, encap: Encapsulation, outer_ipv6: bool, nat_t: bool) -> u32 {
    let ip = outer_ip(outer_ipv6);
    // The ESP payload in transport mode: everything after the outer IP
    // header (UDP, tunnel header, inner frame).
    let payload = inner + encap.overhead(outer_ipv6) - ip;
    ip + if nat_t { NAT_T_OVERHEAD } else { 0 }
        + ESP_HEADER_IV_ICV
        + (payload + ESP_TRAILER).div_ceil(4) * 4
}

/// The largest inner packet that fits `underlay` once encapsulated and
/// encrypted ([`encrypted_size`] `<= underlay`): the room left after the
/// outer IP header, NAT-T and ESP's header, IV and ICV, rounded down to
/// ESP's 4-byte alignment, minus the trailer and the encapsulation. The
/// kernel's `xfrm_state_mtu` computes the same bound for the outer packet.
pub fn max_inner(underlay: u32, encap: Encapsulation, outer_ipv6: bool, nat_t: bool) -> u32 {
    let ip = outer_ip(outer_ipv6);
    let fixed = ip + if nat_t { NAT_T_OVERHEAD } else { 0 } + ESP_HEADER_IV_ICV;
    let room = underlay.saturating_sub(fixed) & !3;
    room.saturating_sub(ESP_TRAILER + encap.overhead(outer_ipv6) - ip)
}

/// The MTU check of the encrypted overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MtuReport {
    /// The MTU of the underlay interface carrying the tunnels.
    pub underlay: u32,
    /// The tunnel (Pod) MTU: the largest inner packet the overlay accepts.
    pub tunnel: u32,
    /// The encapsulation.
    pub encapsulation: Encapsulation,
    /// Whether the outer header is IPv6.
    pub outer_ipv6: bool,
    /// Whether the SAs use NAT-T UDP encapsulation.
    pub nat_traversal: bool,
    /// Bytes between the largest inner packet and the underlay MTU:
    /// encapsulation, ESP and its alignment (92 for Geneve over IPv4 on a
    /// 1500-byte underlay).
    pub overhead: u32,
    /// The largest tunnel MTU that fits every packet: the value to set.
    pub max_tunnel: u32,
    /// `tunnel <= max_tunnel`.
    pub ok: bool,
}

impl MtuReport {
    /// Checks `tunnel` against `underlay` for the given encapsulation
    /// ([`max_inner`]).
    pub fn check(
        underlay: u32,
        tunnel: u32,
        encapsulation: Encapsulation,
        outer_ipv6: bool,
        nat_traversal: bool,
    ) -> Self {
        let max_tunnel = max_inner(underlay, encapsulation, outer_ipv6, nat_traversal);
        let overhead = underlay.saturating_sub(max_tunnel);
        MtuReport {
            underlay,
            tunnel,
            encapsulation,
            outer_ipv6,
            nat_traversal,
            overhead,
            max_tunnel,
            ok: tunnel <= max_tunnel,
        }
    }
}

impl std::fmt::Display for MtuReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tunnel MTU {} + {} bytes ({:?}{} + ESP AES-GCM{}) {} underlay MTU {}",
            self.tunnel,
            self.overhead,
            self.encapsulation,
            if self.outer_ipv6 { " over IPv6" } else { "" },
            if self.nat_traversal { " + NAT-T" } else { "" },
            if self.ok { "fits" } else { "exceeds" },
            self.underlay,
        )?;
        if !self.ok {
            write!(
                f,
                ": set the tunnel (Pod) MTU to {} or less",
                self.max_tunnel
            )?;
        }
        Ok(())
    }
}

/// What the datapath actor last measured: `/status`'s `datapathHealthy`,
/// `peers` and `mtu`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatapathReport {
    /// Every peer's health, by address.
    pub peers: Vec<PeerHealth>,
    /// The MTU check, when both MTUs could be read.
    pub mtu: Option<MtuReport>,
}

impl DatapathReport {
    /// `datapathHealthy`: no peer counts as unhealthy and the MTU fits.
    pub fn healthy(&self) -> bool {
        self.peers.iter().all(|p| p.healthy) && self.mtu.is_none_or(|m| m.ok)
    }

    /// The reason to show for the node: the first unhealthy peer's, else
    /// the MTU's.
    pub fn reason(&self) -> Option<Reason> {
        self.peers
            .iter()
            .find(|p| !p.healthy)
            .and_then(|p| p.reason)
            .or_else(|| {
                self.mtu
                    .is_some_and(|m| !m.ok)
                    .then_some(Reason::MtuTooSmall)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geneve_over_ipv4_on_1500_leaves_1408_for_pods() {
        let r = MtuReport::check(1500, 1400, Encapsulation::Geneve, false, false);
        assert_eq!((r.overhead, r.max_tunnel), (58 + 34, 1408));
        assert!(r.ok);
        // Kube-OVN's default Pod MTU (underlay - 100) fits NAT-T exactly.
        let natt = MtuReport::check(1500, 1400, Encapsulation::Geneve, false, true);
        assert_eq!(natt.max_tunnel, 1400);
        assert!(natt.ok);
        // The plain Geneve maximum does not fit ESP.
        let plain_max = MtuReport::check(1500, 1442, Encapsulation::Geneve, false, false);
        assert!(!plain_max.ok);
        assert!(
            plain_max
                .to_string()
                .contains("set the tunnel (Pod) MTU to 1408"),
            "{plain_max}"
        );
        // The alignment costs up to 3 bytes more on other underlay MTUs.
        assert_eq!(
            MtuReport::check(1450, 0, Encapsulation::Geneve, false, false).max_tunnel,
            1356
        );
        assert_eq!(
            MtuReport::check(9000, 1500, Encapsulation::Vxlan, true, false).max_tunnel,
            9000 - 40 - 32 - 2 - 30
        );
    }

    #[test]
    fn the_limit_is_exact_for_every_underlay() {
        for underlay in 1280..=1500 {
            for ipv6 in [false, true] {
                for natt in [false, true] {
                    for encap in [Encapsulation::Geneve, Encapsulation::Vxlan] {
                        let max = max_inner(underlay, encap, ipv6, natt);
                        assert!(encrypted_size(max, encap, ipv6, natt) <= underlay);
                        assert!(encrypted_size(max + 1, encap, ipv6, natt) > underlay);
                    }
                }
            }
        }
    }

    #[test]
    fn report_health_and_reason() {
        let peer = crate::test_util::peer_health;
        let mut r = DatapathReport {
            peers: vec![peer(PeerState::Healthy, true), peer(PeerState::NoSa, true)],
            mtu: None,
        };
        assert!(r.healthy());
        assert_eq!(r.reason(), None);
        r.peers.push(peer(PeerState::InboundMissing, false));
        assert!(!r.healthy());
        assert_eq!(r.reason(), Some(Reason::InboundMissing));
        r.peers.pop();
        r.mtu = Some(MtuReport::check(
            1500,
            1442,
            Encapsulation::Geneve,
            false,
            false,
        ));
        assert_eq!(r.reason(), Some(Reason::MtuTooSmall));
        let json = serde_json::to_value(PeerHealth {
            chassis: None,
            ..peer(PeerState::NoSa, false)
        })
        .unwrap();
        assert_eq!(json["state"], "NoSA");
        assert_eq!(json["reason"], "NoSA");
        assert!(json.get("chassis").is_none());
    }
}
