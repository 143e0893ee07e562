//! Netlink XFRM messages as bytes: the requests the agent sends and the
//! parsing of the kernel's replies into [`Policy`] and [`State`]. Pure (no
//! sockets), built on `netlink-packet-xfrm`'s message types; round trips are
//! unit-tested in `codec/tests.rs`.
//!
//! SA dumps are *not* parsed with the crate's full attribute parser: that
//! would copy the algorithm attributes — the SA keys — into owned values.
//! [`parse_state`] reads the fixed `xfrm_usersa_info` header and walks the
//! attributes by type, looking only at the mark and `if_id`.

use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_xfrm::policy::{DelGetMessage, ModifyMessage};
use netlink_packet_xfrm::state::DelGetMessage as StateDelGetMessage;
use netlink_packet_xfrm::{
    Address, LifetimeConfig, UserPolicyId, UserPolicyInfo, UserSaId, UserSaInfo, XFRM_INF,
    XfrmAttrs, XfrmMessage,
};

use crate::model::{Family, Mark, Policy, Selector, State, Template};

/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// `XFRM_MSG_NEWSA` (also the type of each SA in a dump).
pub const XFRM_MSG_NEWSA: u16 = 0x10;
/// `XFRM_MSG_GETSA`.
pub const XFRM_MSG_GETSA: u16 = 0x12;
/// `XFRM_MSG_NEWPOLICY` (also the type of each policy in a dump and of a
/// GETPOLICY reply).
pub const XFRM_MSG_NEWPOLICY: u16 = 0x13;
/// `XFRM_MSG_GETPOLICY`.
pub const XFRM_MSG_GETPOLICY: u16 = 0x15;
const XFRMA_ENCAP: u16 = 4;
const XFRMA_MARK: u16 = 21;
const XFRMA_IF_ID: u16 = 31;
const NLMSG_HDRLEN: usize = 16;
const USERSA_INFO_LEN: usize = 224;

/// A codec failure: the kernel sent something this parser cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed netlink XFRM message: {0}")]
pub struct CodecError(pub String);

fn addr_of(family: Option<Family>, a: &Address) -> IpAddr {
    match family {
        Some(Family::Ipv4) => IpAddr::from([a.addr[0], a.addr[1], a.addr[2], a.addr[3]]),
        _ => IpAddr::from(a.addr),
    }
}

fn address(ip: IpAddr) -> Address {
    let mut addr = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => addr[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => addr.copy_from_slice(&v6.octets()),
    }
    Address { addr }
}

fn selector_from(s: &netlink_packet_xfrm::Selector) -> Selector {
    let family = Family::from_af(s.family);
    Selector {
        family,
        saddr: addr_of(family, &s.saddr),
        prefixlen_s: s.prefixlen_s,
        daddr: addr_of(family, &s.daddr),
        prefixlen_d: s.prefixlen_d,
        proto: s.proto,
        sport: s.sport,
        sport_mask: s.sport_mask,
        dport: s.dport,
        dport_mask: s.dport_mask,
        ifindex: s.ifindex,
    }
}

fn selector_to(s: &Selector) -> netlink_packet_xfrm::Selector {
    netlink_packet_xfrm::Selector {
        daddr: address(s.daddr),
        saddr: address(s.saddr),
        dport: s.dport,
        dport_mask: s.dport_mask,
        sport: s.sport,
        sport_mask: s.sport_mask,
        family: s.family.map_or(0, Family::af),
        prefixlen_d: s.prefixlen_d,
        prefixlen_s: s.prefixlen_s,
        proto: s.proto,
        ifindex: s.ifindex,
        user: 0,
    }
}

fn mark_attrs(p: &Policy) -> Vec<XfrmAttrs> {
    let mut nlas = Vec::new();
    if let Some(m) = p.mark {
        nlas.push(XfrmAttrs::Mark(netlink_packet_xfrm::nlas::mark::Mark {
            value: m.value,
            mask: m.mask,
        }));
    }
    if p.if_id != 0 {
        nlas.push(XfrmAttrs::IfId(p.if_id));
    }
    nlas
}

fn serialize(message_type_flags: u16, seq: u32, inner: XfrmMessage) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = message_type_flags;
    header.sequence_number = seq;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// `XFRM_MSG_NEWPOLICY` (exclusive: the kernel refuses with `EEXIST`
/// instead of replacing a policy with the same key — the agent never
/// overwrites), with an ACK requested. Guards have no templates; policies
/// with templates are only ever added by tests and the bench.
pub fn add_policy_request(p: &Policy, seq: u32) -> Vec<u8> {
    let info = UserPolicyInfo {
        selector: selector_to(&p.selector),
        lifetime_cfg: LifetimeConfig {
            soft_byte_limit: XFRM_INF,
            hard_byte_limit: XFRM_INF,
            soft_packet_limit: XFRM_INF,
            hard_packet_limit: XFRM_INF,
            ..Default::default()
        },
        priority: p.priority,
        index: p.index,
        direction: p.dir,
        action: p.action,
        flags: p.flags,
        ..Default::default()
    };
    let mut nlas = mark_attrs(p);
    if !p.templates.is_empty() {
        nlas.push(XfrmAttrs::Template(
            p.templates
                .iter()
                .map(|t| netlink_packet_xfrm::UserTemplate {
                    id: netlink_packet_xfrm::Id {
                        daddr: Address::default(),
                        spi: 0,
                        proto: t.proto,
                    },
                    family: t.family,
                    saddr: Address::default(),
                    reqid: t.reqid,
                    mode: t.mode,
                    share: 0,
                    optional: u8::from(t.optional),
                    aalgos: u32::MAX,
                    ealgos: u32::MAX,
                    calgos: u32::MAX,
                })
                .collect(),
        ));
    }
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        XfrmMessage::AddPolicy(ModifyMessage {
            user_policy_info: info,
            nlas,
        }),
    )
}

fn policy_id_message(p: &Policy, by_index: bool) -> DelGetMessage {
    // A lookup by index still carries the family in the selector (the
    // "family-correct request"), and always the mark and if_id: the kernel
    // matches them even when looking up by index.
    let selector = if by_index {
        netlink_packet_xfrm::Selector {
            family: p.selector.family.map_or(0, Family::af),
            ..Default::default()
        }
    } else {
        selector_to(&p.selector)
    };
    DelGetMessage {
        user_policy_id: UserPolicyId {
            selector,
            index: if by_index { p.index } else { 0 },
            direction: p.dir,
        },
        nlas: mark_attrs(p),
    }
}

/// `XFRM_MSG_GETPOLICY` for `p.index` (when `by_index`) or for `p`'s
/// selector, mark and direction. The reply is one `XFRM_MSG_NEWPOLICY` or
/// an error (`ENOENT` when absent).
pub fn get_policy_request(p: &Policy, by_index: bool, seq: u32) -> Vec<u8> {
    serialize(
        NLM_F_REQUEST,
        seq,
        XfrmMessage::GetPolicy(policy_id_message(p, by_index)),
    )
}

/// `XFRM_MSG_DELPOLICY` of the policy with `p.index` (and `p`'s mark and
/// direction), with an ACK.
pub fn delete_policy_request(p: &Policy, seq: u32) -> Vec<u8> {
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        XfrmMessage::DeletePolicy(policy_id_message(p, true)),
    )
}

/// `XFRM_MSG_DELSA` of the SA with `s`'s full identity — destination,
/// SPI, protocol and family, plus its source address and mark (the kernel
/// matches both when given) — with an ACK. Never a flush.
pub fn delete_state_request(s: &State, seq: u32) -> Vec<u8> {
    let mut nlas = vec![XfrmAttrs::SrcAddr(address(s.saddr))];
    if let Some(m) = s.mark {
        nlas.push(XfrmAttrs::Mark(netlink_packet_xfrm::nlas::mark::Mark {
            value: m.value,
            mask: m.mask,
        }));
    }
    serialize(
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        XfrmMessage::DeleteSa(StateDelGetMessage {
            user_sa_id: UserSaId {
                daddr: address(s.daddr),
                spi: s.spi,
                family: s
                    .family
                    .unwrap_or(if s.daddr.is_ipv4() {
                        Family::Ipv4
                    } else {
                        Family::Ipv6
                    })
                    .af(),
                proto: s.proto,
            },
            nlas,
        }),
    )
}

/// `XFRM_MSG_ALLOCSPI` for the larval state `s` (found by its acquire
/// sequence number, as the IKE daemon answering the acquire would find it):
/// the kernel gives it an SPI in `[min, max]` and replies with the state,
/// which can then be deleted by its full identity. A larval state has no
/// SPI, so nothing else can name it.
pub fn alloc_spi_request(s: &State, min: u32, max: u32, seq: u32) -> Vec<u8> {
    let family = s
        .family
        .unwrap_or(if s.daddr.is_ipv4() {
            Family::Ipv4
        } else {
            Family::Ipv6
        })
        .af();
    let info = UserSaInfo {
        selector: selector_to(&s.selector),
        id: netlink_packet_xfrm::Id {
            daddr: address(s.daddr),
            spi: 0,
            proto: s.proto,
        },
        saddr: address(s.saddr),
        seq: s.seq,
        reqid: s.reqid,
        family,
        mode: s.mode,
        ..Default::default()
    };
    let mut nlas = Vec::new();
    if let Some(m) = s.mark {
        nlas.push(XfrmAttrs::Mark(netlink_packet_xfrm::nlas::mark::Mark {
            value: m.value,
            mask: m.mask,
        }));
    }
    if s.if_id != 0 {
        nlas.push(XfrmAttrs::IfId(s.if_id));
    }
    serialize(
        NLM_F_REQUEST,
        seq,
        XfrmMessage::AllocSpi(netlink_packet_xfrm::state::AllocSpiMessage {
            spi_info: netlink_packet_xfrm::UserSpiInfo { info, min, max },
            nlas,
        }),
    )
}

/// A header-only dump request (`XFRM_MSG_GETPOLICY` or `XFRM_MSG_GETSA`
/// with `NLM_F_DUMP`), as `ip xfrm ... list` sends it.
pub fn dump_request(message_type: u16, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN);
    buf.extend_from_slice(&(NLMSG_HDRLEN as u32).to_ne_bytes());
    buf.extend_from_slice(&message_type.to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf
}

/// One netlink message in a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMessage<'a> {
    /// `nlmsg_type`.
    pub message_type: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// The payload after the header.
    pub body: &'a [u8],
}

/// Splits a receive buffer into its netlink messages.
pub fn split_messages(mut buf: &[u8]) -> Result<Vec<RawMessage<'_>>, CodecError> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(CodecError(format!(
                "netlink length {len} of {} bytes",
                buf.len()
            )));
        }
        out.push(RawMessage {
            message_type: u16::from_ne_bytes([buf[4], buf[5]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            body: &buf[NLMSG_HDRLEN..len],
        });
        let next = len.div_ceil(4) * 4;
        buf = buf.get(next..).unwrap_or_default();
    }
    Ok(out)
}

/// The errno of an `NLMSG_ERROR` body (0 for an ACK).
pub fn error_code(body: &[u8]) -> Result<i32, CodecError> {
    body.get(..4)
        .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| CodecError("short NLMSG_ERROR".into()))
}

/// Parses the body of an `XFRM_MSG_NEWPOLICY` message.
pub fn parse_policy(body: &[u8]) -> Result<Policy, CodecError> {
    use netlink_packet_core::Parseable;
    let msg = ModifyMessage::parse(body).map_err(|e| CodecError(e.to_string()))?;
    let info = msg.user_policy_info;
    let mut policy = Policy {
        selector: selector_from(&info.selector),
        dir: info.direction,
        action: info.action,
        priority: info.priority,
        index: info.index,
        mark: None,
        if_id: 0,
        ptype: 0,
        flags: info.flags,
        templates: Vec::new(),
    };
    for nla in msg.nlas {
        match nla {
            XfrmAttrs::Mark(m) => {
                policy.mark = Some(Mark {
                    value: m.value,
                    mask: m.mask,
                })
            }
            XfrmAttrs::IfId(id) => policy.if_id = id,
            XfrmAttrs::PolicyType(t) => policy.ptype = t.ptype,
            XfrmAttrs::Template(ts) => {
                policy.templates = ts
                    .iter()
                    .map(|t| Template {
                        proto: t.id.proto,
                        reqid: t.reqid,
                        mode: t.mode,
                        family: t.family,
                        optional: t.optional != 0,
                    })
                    .collect()
            }
            _ => {}
        }
    }
    Ok(policy)
}

/// Parses the body of an `XFRM_MSG_NEWSA` message without touching its
/// algorithm (key) attributes.
pub fn parse_state(body: &[u8]) -> Result<State, CodecError> {
    let head = body
        .get(..USERSA_INFO_LEN)
        .ok_or_else(|| CodecError(format!("short xfrm_usersa_info: {}", body.len())))?;
    let info = UserSaInfo::parse(head).map_err(|e| CodecError(e.to_string()))?;
    let family = Family::from_af(info.family);
    let mut state = State {
        family,
        saddr: addr_of(family, &info.saddr),
        daddr: addr_of(family, &info.id.daddr),
        proto: info.id.proto,
        spi: info.id.spi,
        reqid: info.reqid,
        mode: info.mode,
        mark: None,
        if_id: 0,
        selector: selector_from(&info.selector),
        bytes: info.lifetime_cur.bytes,
        packets: info.lifetime_cur.packets,
        seq: info.seq,
        encap: false,
    };
    let mut rest = body.get(USERSA_INFO_LEN..).unwrap_or_default();
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        if len < 4 || len > rest.len() {
            return Err(CodecError(format!("attribute length {len}")));
        }
        let value = &rest[4..len];
        match (kind, value.len()) {
            (XFRMA_MARK, 8) => {
                state.mark = Some(Mark {
                    value: u32::from_ne_bytes([value[0], value[1], value[2], value[3]]),
                    mask: u32::from_ne_bytes([value[4], value[5], value[6], value[7]]),
                })
            }
            // Only its presence: the SA is UDP-encapsulated (NAT-T).
            (XFRMA_ENCAP, _) => state.encap = true,
            (XFRMA_IF_ID, 4) => {
                state.if_id = u32::from_ne_bytes([value[0], value[1], value[2], value[3]])
            }
            // Everything else — above all the algorithm attributes with
            // the keys — is skipped unread.
            _ => {}
        }
        rest = rest.get(len.div_ceil(4) * 4..).unwrap_or_default();
    }
    Ok(state)
}

#[cfg(test)]
mod tests;
