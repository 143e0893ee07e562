//! SA attribution (SPEC §3): which kernel SAs and policies are this
//! node's, by reqid + mark + exact tunnel selector — a pure function over
//! dumped states and policies — and the observation record written to the
//! key directory with the boot ID. SA keys are never read (the dump parser
//! skips them), so they cannot reach logs, status or the record.

use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::lease::Lease;
use xfrm::model::{DIR_OUT, Family, Policy, State, compare_guard};

/// File name of the observation record in the key directory.
pub const OBSERVATIONS_FILE: &str = "sa-observations.json";

/// One tunnel of this node: the endpoints its IPsec traffic uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelEndpoints {
    /// Local underlay address.
    pub local: IpAddr,
    /// Remote underlay address.
    pub remote: IpAddr,
}

/// One tunnel interface of this node under the lease: its endpoints, the
/// peer's chassis (`remote_name`) and the interface type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTunnel {
    /// The endpoints.
    pub endpoints: TunnelEndpoints,
    /// `options:remote_name`.
    pub chassis: Option<String>,
    /// The interface type (`geneve`, `vxlan`).
    pub kind: String,
}

/// This node's tunnels from the rows of OVS's `Interface` table (their
/// `type` and `options` map): interfaces whose `options:ipsec_reqid` is the
/// lease's reqid (the patched ovn-controller sets it where `remote_name` is
/// present), from `options:local_ip` — or, without it, each of
/// `external_ids:ovn-encap-ip` (a comma-separated list in newer OVN) — to
/// `options:remote_ip`. Rows whose addresses do not parse (e.g.
/// `remote_ip=flow`) are skipped: they name no exact selector.
pub fn peers_from_interfaces<'a>(
    reqid: u32,
    encap_ip: Option<&str>,
    interfaces: impl IntoIterator<Item = (&'a str, &'a std::collections::BTreeMap<String, String>)>,
) -> Vec<PeerTunnel> {
    let encap: Vec<IpAddr> = encap_ip
        .unwrap_or("")
        .split(',')
        .filter_map(|a| a.trim().parse().ok())
        .collect();
    let want = reqid.to_string();
    let mut out: Vec<PeerTunnel> = Vec::new();
    for (kind, options) in interfaces {
        if options.get("ipsec_reqid") != Some(&want) {
            continue;
        }
        let Some(remote) = options
            .get("remote_ip")
            .and_then(|r| r.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let locals: Vec<IpAddr> = match options.get("local_ip") {
            Some(l) => l.parse().ok().into_iter().collect(),
            None => encap.clone(),
        };
        for local in locals {
            let endpoints = TunnelEndpoints { local, remote };
            if local.is_ipv4() == remote.is_ipv4() && !out.iter().any(|p| p.endpoints == endpoints)
            {
                out.push(PeerTunnel {
                    endpoints,
                    chassis: options.get("remote_name").cloned(),
                    kind: kind.to_owned(),
                });
            }
        }
    }
    out
}

/// The endpoints of [`peers_from_interfaces`], for rows without a type.
pub fn tunnels_from_interfaces<'a>(
    reqid: u32,
    encap_ip: Option<&str>,
    interfaces: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, String>>,
) -> Vec<TunnelEndpoints> {
    peers_from_interfaces(reqid, encap_ip, interfaces.into_iter().map(|o| ("", o)))
        .into_iter()
        .map(|p| p.endpoints)
        .collect()
}

/// Reads this node's tunnels (see [`tunnels_from_interfaces`]) from OVSDB
/// in one transaction.
pub async fn read_tunnels(ovs: &ovsdb::Client, reqid: u32) -> Result<Vec<TunnelEndpoints>, Error> {
    Ok(read_peers(ovs, reqid)
        .await?
        .into_iter()
        .map(|p| p.endpoints)
        .collect())
}

/// Reads this node's tunnels with their peers (see
/// [`peers_from_interfaces`]) from OVSDB in one transaction.
pub async fn read_peers(ovs: &ovsdb::Client, reqid: u32) -> Result<Vec<PeerTunnel>, Error> {
    use ovsdb::protocol::Operation;
    let ops = [
        Operation::Select {
            table: "Interface".into(),
            conditions: vec![],
            columns: Some(vec!["type".into(), "options".into()]),
        },
        Operation::Select {
            table: "Open_vSwitch".into(),
            conditions: vec![],
            columns: Some(vec!["external_ids".into()]),
        },
    ];
    let mut results = ovs
        .transact("Open_vSwitch", &ops)
        .await
        .map_err(Error::Ovsdb)?
        .into_iter();
    let interfaces: Vec<(String, std::collections::BTreeMap<String, String>)> = results
        .next()
        .and_then(|r| r.rows)
        .unwrap_or_default()
        .iter()
        .filter_map(|r| {
            let kind = r
                .get("type")
                .and_then(|d| d.as_set())
                .and_then(|s| s.first().and_then(|a| a.as_str()).map(str::to_owned))
                .unwrap_or_default();
            r.get("options")
                .and_then(|d| d.as_string_map())
                .map(|o| (kind, o))
        })
        .collect();
    let external_ids: Vec<_> = results
        .next()
        .and_then(|r| r.rows)
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.get("external_ids").and_then(|d| d.as_string_map()))
        .collect();
    let encap = external_ids
        .first()
        .and_then(|m| m.get("ovn-encap-ip"))
        .map(String::as_str);
    Ok(peers_from_interfaces(
        reqid,
        encap,
        interfaces.iter().map(|(k, o)| (k.as_str(), o)),
    ))
}

/// Per peer, this node's SAs of each direction (attributed to the lease
/// like [`attribute`] does; larval acquire states left out): the datapath
/// actor's sample.
pub fn peer_samples(
    lease: &Lease,
    states: &[State],
    peers: &[PeerTunnel],
) -> Vec<actors::ports::PeerSample> {
    use actors::ports::{PeerSample, SaSample};
    let all: Vec<TunnelEndpoints> = peers.iter().map(|p| p.endpoints).collect();
    let own: Vec<&State> = states
        .iter()
        .filter(|s| !s.is_larval() && is_own_state(lease, s, &all))
        .collect();
    let sample = |s: &&State| SaSample {
        spi: s.spi,
        bytes: s.bytes,
        packets: s.packets,
    };
    peers
        .iter()
        .map(|p| {
            let TunnelEndpoints { local, remote } = p.endpoints;
            let dir = |src: IpAddr, dst: IpAddr| {
                own.iter().filter(move |s| s.saddr == src && s.daddr == dst)
            };
            PeerSample {
                peer: remote,
                local,
                chassis: p.chassis.clone(),
                encapsulation: kube_ovn_ipsec_api::datapath::Encapsulation::from_ovs_type(&p.kind),
                outbound: dir(local, remote).map(sample).collect(),
                inbound: dir(remote, local).map(sample).collect(),
                nat_traversal: dir(local, remote)
                    .chain(dir(remote, local))
                    .any(|s| s.encap),
            }
        })
        .collect()
}

/// An SA attributed to this node (public fields only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedSa {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// SPI (hex).
    pub spi: String,
    /// Protocol number.
    pub proto: u8,
    /// reqid.
    pub reqid: u32,
}

/// A policy attributed to this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPolicy {
    /// Kernel index.
    pub index: u32,
    /// Direction.
    pub dir: u8,
    /// Selector source.
    pub src: IpAddr,
    /// Selector destination.
    pub dst: IpAddr,
    /// Whether it is one of the lease's guards.
    pub guard: bool,
}

/// What is this node's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attribution {
    /// SAs with the lease's reqid and mark between a tunnel's endpoints.
    pub sas: Vec<ObservedSa>,
    /// Policies with the lease's reqid (template) and mark on a tunnel's
    /// exact selector, plus the guards.
    pub policies: Vec<ObservedPolicy>,
}

fn host_prefix(a: IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

fn is_tunnel(src: IpAddr, dst: IpAddr, tunnels: &[TunnelEndpoints]) -> bool {
    tunnels
        .iter()
        .any(|t| (t.local == src && t.remote == dst) || (t.local == dst && t.remote == src))
}

/// Whether SA `s` is the lease's: its reqid is the lease's, its mark (if
/// any) is exactly `<mark>/0xffffffff` (outbound) or absent (inbound:
/// strongSwan marks only `out`), and its addresses are a tunnel's.
fn is_own_state(lease: &Lease, s: &State, tunnels: &[TunnelEndpoints]) -> bool {
    let exact = xfrm::model::Mark::exact(lease.mark);
    s.reqid == lease.reqid
        && s.mark.is_none_or(|m| m == exact)
        && is_tunnel(s.saddr, s.daddr, tunnels)
}

/// Whether policy `p` is one of the lease's guards.
fn is_guard(lease: &Lease, p: &Policy) -> bool {
    Family::ALL
        .iter()
        .any(|f| compare_guard(&Policy::guard(*f, lease.mark), p).is_empty())
}

/// Whether policy `p` is one the node's IKE daemon installed under the
/// lease: a template with the lease's reqid, a selector that is exactly a
/// tunnel's host pair, and — outbound — exactly the lease's mark.
fn is_own_tunnel_policy(lease: &Lease, p: &Policy, tunnels: &[TunnelEndpoints]) -> bool {
    let sel = &p.selector;
    p.templates.iter().any(|t| t.reqid == lease.reqid)
        && sel.prefixlen_s == host_prefix(sel.saddr)
        && sel.prefixlen_d == host_prefix(sel.daddr)
        && is_tunnel(sel.saddr, sel.daddr, tunnels)
        && (p.dir != DIR_OUT || p.mark == Some(xfrm::model::Mark::exact(lease.mark)))
}

/// Attributes kernel SAs and policies to the lease. An SA is ours when its
/// reqid is the lease's, its mark (if any) is exactly `<mark>/0xffffffff`
/// (outbound) or absent (inbound: strongSwan marks only `out`), and its
/// addresses are a tunnel's. A policy is ours when it is a guard, or when
/// it has a template with the lease's reqid and its selector is exactly a
/// tunnel's host pair.
pub fn attribute(
    lease: &Lease,
    states: &[State],
    policies: &[Policy],
    tunnels: &[TunnelEndpoints],
) -> Attribution {
    let mut out = Attribution::default();
    for s in states {
        if is_own_state(lease, s, tunnels) {
            out.sas.push(ObservedSa {
                src: s.saddr,
                dst: s.daddr,
                spi: format!("{:08x}", s.spi),
                proto: s.proto,
                reqid: s.reqid,
            });
        }
    }
    for p in policies {
        let guard = is_guard(lease, p);
        if guard || is_own_tunnel_policy(lease, p, tunnels) {
            out.policies.push(ObservedPolicy {
                index: p.index,
                dir: p.dir,
                src: p.selector.saddr,
                dst: p.selector.daddr,
                guard,
            });
        }
    }
    out
}

/// What the cleanup path may remove, and what stops it (SPEC §8, "Drain").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drain {
    /// SAs this node's IKE daemon installed under the lease.
    pub states: Vec<State>,
    /// Tunnel policies it installed under the lease (not the guards).
    pub policies: Vec<Policy>,
    /// The lease's guards as the kernel holds them.
    pub guards: Vec<Policy>,
    /// Everything else that carries the lease's mark or reqid, described
    /// for the operator (no keys): a foreign owner this node must not
    /// touch and cannot reason about.
    pub foreign: Vec<String>,
}

impl Drain {
    /// Nothing of the lease's SAs and tunnel policies is left (guards
    /// aside).
    pub fn drained(&self) -> bool {
        self.states.is_empty() && self.policies.is_empty()
    }
}

/// Whether `m` selects packets carrying `mark` (a zero mask selects
/// everything and names no mark: it is not "carrying" the lease's).
fn carries_mark(m: Option<xfrm::model::Mark>, mark: u32) -> bool {
    m.is_some_and(|m| m.mask != 0 && m.matches(mark))
}

fn describe_mark(m: Option<xfrm::model::Mark>) -> String {
    m.map_or_else(
        || "no mark".to_owned(),
        |m| format!("mark {:#x}/{:#x}", m.value, m.mask),
    )
}

/// Sorts the kernel's SAs and policies for the cleanup path: the lease's
/// own (the same attribution as [`attribute`], over the tunnels this node
/// recorded), its guards, and foreign owners of its mark or reqid.
pub fn plan_drain(
    lease: &Lease,
    states: &[State],
    policies: &[Policy],
    tunnels: &[TunnelEndpoints],
) -> Drain {
    let mut out = Drain::default();
    for s in states {
        if is_own_state(lease, s, tunnels) {
            out.states.push(s.clone());
        } else if s.reqid == lease.reqid || carries_mark(s.mark, lease.mark) {
            out.foreign.push(format!(
                "SA {} -> {} spi {:#010x} proto {} reqid {} {}",
                s.saddr,
                s.daddr,
                s.spi,
                s.proto,
                s.reqid,
                describe_mark(s.mark)
            ));
        }
    }
    for p in policies {
        if is_guard(lease, p) {
            out.guards.push(p.clone());
        } else if is_own_tunnel_policy(lease, p, tunnels) {
            out.policies.push(p.clone());
        } else if p.templates.iter().any(|t| t.reqid == lease.reqid)
            || carries_mark(p.mark, lease.mark)
        {
            let reqids: Vec<String> = p.templates.iter().map(|t| t.reqid.to_string()).collect();
            out.foreign.push(format!(
                "policy index {} dir {} {}/{} -> {}/{} priority {} reqid [{}] {}",
                p.index,
                p.dir,
                p.selector.saddr,
                p.selector.prefixlen_s,
                p.selector.daddr,
                p.selector.prefixlen_d,
                p.priority,
                reqids.join(","),
                describe_mark(p.mark)
            ));
        }
    }
    out
}

/// The observation record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observations {
    /// `/proc/sys/kernel/random/boot_id` when observed.
    pub boot_id: String,
    /// RFC 3339 time of the observation.
    pub observed_at: String,
    /// The lease's id.
    pub lease_id: String,
    /// What was attributed.
    pub attribution: Attribution,
    /// Every tunnel seen under this lease since it was allocated (a union:
    /// a peer that left may still have SAs). The cleanup path drains over
    /// these: by then no interface carries the lease's reqid any more.
    #[serde(default)]
    pub tunnels: Vec<TunnelEndpoints>,
}

/// Reads the observation record of `dir`; `None` when there is none.
pub fn load(dir: &Path) -> Result<Option<Observations>, Error> {
    let path = dir.join(OBSERVATIONS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path, source }),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path,
            reason: e.to_string(),
        })
}

/// `recorded` plus each of `seen` it lacks, in order.
pub fn union_tunnels(
    recorded: &[TunnelEndpoints],
    seen: &[TunnelEndpoints],
) -> Vec<TunnelEndpoints> {
    let mut out = recorded.to_vec();
    for t in seen {
        if !out.contains(t) {
            out.push(*t);
        }
    }
    out
}

/// Writes the record (0600, atomically) into the key directory. `tunnels`
/// is what the record keeps (the caller's union with what it recorded
/// before under the same lease).
pub fn record(
    dir: &Path,
    lease: &Lease,
    attribution: Attribution,
    tunnels: Vec<TunnelEndpoints>,
    now_rfc3339: String,
) -> Result<Observations, Error> {
    let obs = Observations {
        boot_id: crate::fsutil::boot_id()?,
        observed_at: now_rfc3339,
        lease_id: lease.lease_id.clone(),
        attribution,
        tunnels,
    };
    let path = dir.join(OBSERVATIONS_FILE);
    let bytes = serde_json::to_vec_pretty(&obs).map_err(|e| Error::Corrupt {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    actors::keydir::write_atomic(&path, &bytes, 0o600).map_err(|e| Error::Io {
        path: e.path,
        source: e.source,
    })?;
    Ok(obs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfrm::model::{Mark, PROTO_ESP, Selector, Template};

    fn lease() -> Lease {
        Lease {
            version: 1,
            lease_id: "l".into(),
            node_uid: "u".into(),
            mark: 0x77,
            reqid: 9,
            guards: vec![],
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sa(src: &str, dst: &str, reqid: u32, mark: Option<Mark>) -> State {
        State {
            family: Some(Family::Ipv4),
            saddr: ip(src),
            daddr: ip(dst),
            proto: PROTO_ESP,
            spi: 0xabcd,
            reqid,
            mode: 0,
            mark,
            if_id: 0,
            selector: Selector::wildcard(Family::Ipv4),
            bytes: 0,
            packets: 0,
            seq: 0,
            encap: false,
        }
    }

    fn tunnel_policy(dir: u8, reqid: u32, mark: Option<Mark>, plen: u8) -> Policy {
        Policy {
            selector: Selector {
                saddr: ip("10.0.0.1"),
                daddr: ip("10.0.0.2"),
                prefixlen_s: plen,
                prefixlen_d: plen,
                proto: 17,
                ..Selector::wildcard(Family::Ipv4)
            },
            dir,
            action: 0,
            priority: 100,
            index: 5,
            mark,
            if_id: 0,
            ptype: 0,
            flags: 0,
            templates: vec![Template {
                proto: PROTO_ESP,
                reqid,
                mode: 0,
                family: 2,
                optional: false,
            }],
        }
    }

    #[test]
    fn attribution_by_reqid_mark_and_exact_selector() {
        let t = [TunnelEndpoints {
            local: ip("10.0.0.1"),
            remote: ip("10.0.0.2"),
        }];
        let m = Some(Mark::exact(0x77));
        let states = [
            sa("10.0.0.1", "10.0.0.2", 9, m),    // ours, outbound
            sa("10.0.0.2", "10.0.0.1", 9, None), // ours, inbound
            sa("10.0.0.1", "10.0.0.2", 10, m),   // other reqid
            sa(
                "10.0.0.1",
                "10.0.0.2",
                9,
                Some(Mark {
                    value: 0x77,
                    mask: 0xff,
                }),
            ), // other mask
            sa("10.0.0.1", "10.0.0.3", 9, m),    // not a tunnel
        ];
        let mut guard = Policy::guard(Family::Ipv6, 0x77);
        guard.index = 99;
        let policies = [
            tunnel_policy(DIR_OUT, 9, m, 32),
            tunnel_policy(0, 9, None, 32),
            tunnel_policy(DIR_OUT, 9, None, 32), // outbound without the mark
            tunnel_policy(DIR_OUT, 9, m, 24),    // not the exact selector
            tunnel_policy(DIR_OUT, 8, m, 32),    // other reqid
            guard,
        ];
        let a = attribute(&lease(), &states, &policies, &t);
        assert_eq!(a.sas.len(), 2, "{a:?}");
        assert_eq!(a.policies.len(), 3, "{a:?}");
        assert!(a.policies[2].guard);
        let json = serde_json::to_string(&a).unwrap();
        assert!(!json.contains("key"), "{json}");
    }

    #[test]
    fn drain_takes_exactly_the_leases_own_and_names_foreign_owners() {
        let t = [TunnelEndpoints {
            local: ip("10.0.0.1"),
            remote: ip("10.0.0.2"),
        }];
        let m = Some(Mark::exact(0x77));
        let mut guard = Policy::guard(Family::Ipv4, 0x77);
        guard.index = 99;
        // Foreign neighbours that must be neither drained nor blamed: a
        // mark differing only under another mask, and a reqid neighbour.
        let neighbour_mark = Some(Mark {
            value: 0x76,
            mask: 0xff,
        });
        let clean_states = [
            sa("10.0.0.1", "10.0.0.2", 9, m),
            sa("10.0.0.2", "10.0.0.1", 9, None),
            sa("10.0.0.1", "10.0.0.2", 10, neighbour_mark),
        ];
        let clean_policies = [
            tunnel_policy(DIR_OUT, 9, m, 32),
            tunnel_policy(0, 9, None, 32),
            tunnel_policy(DIR_OUT, 10, None, 32),
            guard.clone(),
        ];
        let d = plan_drain(&lease(), &clean_states, &clean_policies, &t);
        assert_eq!(
            (d.states.len(), d.policies.len(), d.guards.len()),
            (2, 2, 1)
        );
        assert!(d.foreign.is_empty(), "{:?}", d.foreign);
        assert!(!d.drained());
        // Without the recorded tunnel nothing is attributable: the same SAs
        // are then foreign owners of the lease's reqid.
        let d = plan_drain(&lease(), &clean_states, &clean_policies, &[]);
        assert!(d.states.is_empty() && d.policies.is_empty());
        assert_eq!(d.foreign.len(), 4, "{:?}", d.foreign);
        // The lease's mark on a selector this node never recorded, and the
        // lease's reqid with another mark: foreign, and named.
        let states = [sa(
            "10.0.0.1",
            "10.0.0.2",
            9,
            Some(Mark {
                value: 0x77,
                mask: 0xfff,
            }),
        )];
        let mut stray = tunnel_policy(DIR_OUT, 3, m, 24);
        stray.index = 4242;
        let d = plan_drain(&lease(), &states, &[stray, guard], &t);
        assert_eq!(d.foreign.len(), 2, "{:?}", d.foreign);
        assert!(d.foreign[0].contains("reqid 9"), "{}", d.foreign[0]);
        assert!(d.foreign[1].contains("index 4242"), "{}", d.foreign[1]);
        assert!(d.drained());
    }

    #[test]
    fn tunnels_are_the_interfaces_with_the_lease_reqid() {
        let row = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let rows = [
            row(&[
                ("remote_ip", "10.0.0.2"),
                ("local_ip", "10.0.0.1"),
                ("ipsec_reqid", "9"),
            ]),
            row(&[("remote_ip", "10.0.0.3"), ("ipsec_reqid", "9")]),
            row(&[("remote_ip", "10.0.0.4"), ("ipsec_reqid", "8")]), // other reqid
            row(&[("remote_ip", "10.0.0.5")]),                       // no IPsec
            row(&[("remote_ip", "flow"), ("ipsec_reqid", "9")]),     // no exact selector
            row(&[("remote_ip", "fd00::2"), ("ipsec_reqid", "9")]),  // v6 remote, v4 encap
            row(&[
                ("remote_ip", "10.0.0.2"),
                ("local_ip", "10.0.0.1"),
                ("ipsec_reqid", "9"),
            ]),
        ];
        let t = tunnels_from_interfaces(9, Some("10.0.0.1, fd00::1"), &rows);
        let pair = |l: &str, r: &str| TunnelEndpoints {
            local: ip(l),
            remote: ip(r),
        };
        assert_eq!(
            t,
            vec![
                pair("10.0.0.1", "10.0.0.2"),
                pair("10.0.0.1", "10.0.0.3"),
                pair("fd00::1", "fd00::2"),
            ]
        );
        assert!(tunnels_from_interfaces(9, None, &rows[1..2]).is_empty());
    }

    #[test]
    fn record_has_boot_id_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let t = vec![TunnelEndpoints {
            local: ip("10.0.0.1"),
            remote: ip("10.0.0.2"),
        }];
        let obs = record(
            dir.path(),
            &lease(),
            Attribution::default(),
            t.clone(),
            "2025-01-01T00:00:00Z".into(),
        )
        .unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(obs.clone()));
        assert_eq!(obs.boot_id.len(), 36);
        let p = dir.path().join(OBSERVATIONS_FILE);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
