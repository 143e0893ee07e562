//! The emulated ovn-controller: a thread per node that does what the
//! patched ovn-controller's tunnel management does, from the same inputs —
//! SB (`SB_Global.ipsec`, the `Encap` rows of the other chassis) and the
//! node's own OVSDB (the lease in `Open_vSwitch . external_ids`, the
//! tunnels it built) — and nothing more: no logical flows; forwarding
//! between the pod port and the tunnels is a hand-written split horizon
//! whose packets carry OVN's Geneve option, so the wire format (and what
//! the MTU must leave room for) is the real one's.
//!
//! Each pass reads both databases (one transaction each, so a pass sees a
//! consistent SB and a consistent node) and writes what differs:
//! - IPsec off: a plain Geneve tunnel to every other chassis, no intent,
//!   no marks.
//! - IPsec on with a usable lease ([`PublishedLease::read`], the patch's
//!   rules): every tunnel with `remote_name` and the lease's marks, set in
//!   one transaction with the tunnel or on it.
//! - IPsec on without one: no tunnel at all, the reason logged once per
//!   change (a joining node never sends overlay plaintext).
//!
//! Its log (`ovn-controller-emulated.log` in the node's directory) says
//! what it wrote and why it built nothing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use kube_ovn_ipsec_api::lease::PublishedLease;
use kube_ovn_ipsec_api::names::ovs;
use ovsdb::{Client, Datum, Operation, Row};
use testbed::ipsec::{IpsecError, Switch, Tunnel, tunnel_name};
use testbed::netns::Entry;
use testbed::overlay;

/// How often a pass runs: well inside the lab's 100 ms probe resolution
/// for what ovn-controller does on an SB or OVSDB change.
const PASS: Duration = Duration::from_millis(100);

/// What one node's emulation needs: its chassis and underlay address, its
/// switch and OVSDB, SB, and (for traffic) the pod port to forward.
#[derive(Debug, Clone)]
pub struct EmulationConfig {
    /// The node's chassis (its `system-id`).
    pub chassis: String,
    /// The node's underlay address (its Geneve encap).
    pub ip: Ipv4Addr,
    /// The node's switch, for the writes.
    pub switch: Switch,
    /// The node's OVSDB as the host reaches it (`unix:<path>`).
    pub ovsdb: String,
    /// SB (`unix:<path>`).
    pub sb: String,
    /// The node's namespaces and pod port, when traffic is forwarded
    /// between the pod and the tunnels (ovs-vswitchd must run).
    pub forward: Option<(Entry, String)>,
    /// The emulation's log.
    pub log: PathBuf,
}

/// A running emulation; stopped (its thread joined) on drop.
#[derive(Debug)]
pub struct Emulation {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Emulation {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Emulation {
    /// Registers the chassis in SB with its Geneve encap (what a real
    /// ovn-controller does when it starts) and starts the passes.
    pub fn start(config: EmulationConfig) -> Result<Self, IpsecError> {
        let ip = config.ip.to_string();
        testbed::ovs::run(
            "ovn-sbctl",
            &[
                &format!("--db={}", config.sb),
                "--may-exist",
                "chassis-add",
                &config.chassis,
                "geneve",
                &ip,
            ],
        )
        .map_err(|e| IpsecError::Failed {
            what: format!("registering chassis {} in SB", config.chassis),
            detail: e.to_string(),
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ovn-emu-{}", config.chassis))
            .spawn(move || run(config, &flag))
            .map_err(|e| IpsecError::Failed {
                what: "starting the emulated ovn-controller".into(),
                detail: e.to_string(),
            })?;
        Ok(Emulation {
            stop,
            thread: Some(thread),
        })
    }
}

/// The thread: passes until stopped, on a runtime of its own (the caller
/// may or may not be inside one).
fn run(config: EmulationConfig, stop: &AtomicBool) {
    let mut log = Log::open(&config.log);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return log.line(&format!("no runtime: {e}")),
    };
    rt.block_on(async {
        let (sb, node) = match (
            Client::connect_str(&config.sb).await,
            Client::connect_str(&config.ovsdb).await,
        ) {
            (Ok(sb), Ok(node)) => (sb, node),
            (Err(e), _) | (_, Err(e)) => return log.line(&format!("cannot connect: {e}")),
        };
        let mut state = PassState::default();
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = pass(&config, &sb, &node, &mut state, &mut log).await {
                log.once(&mut state.last_error, Some(e));
            } else {
                state.last_error = None;
            }
            tokio::time::sleep(PASS).await;
        }
    });
}

/// What passes remember: the last problems logged (each logged once per
/// change) and the tunnels the forwarding was last written for.
#[derive(Default)]
struct PassState {
    lease_problem: Option<String>,
    last_error: Option<String>,
    forwarded: Option<Vec<String>>,
}

/// One tunnel as the node's OVSDB has it.
struct Existing {
    remote_ip: Option<String>,
    options: BTreeMap<String, String>,
}

/// `SB_Global.ipsec` and the other chassis' Geneve encaps (chassis →
/// address), from one transaction.
async fn read_sb(
    config: &EmulationConfig,
    sb: &Client,
) -> Result<(bool, BTreeMap<String, String>), String> {
    let read = sb
        .transact(
            "OVN_Southbound",
            &[
                Operation::select("SB_Global", &["ipsec"]),
                Operation::select("Encap", &["chassis_name", "type", "ip"]),
            ],
        )
        .await
        .map_err(|e| format!("reading SB: {e}"))?;
    let ipsec = rows(&read, 0)
        .first()
        .and_then(|r| r.get("ipsec"))
        .and_then(Datum::as_bool)
        .unwrap_or(false);
    let peers = rows(&read, 1)
        .iter()
        .filter_map(
            |r| match (text(r, "chassis_name"), text(r, "type"), text(r, "ip")) {
                (Some(chassis), Some("geneve"), Some(ip)) if chassis != config.chassis => {
                    Some((chassis.to_owned(), ip.to_owned()))
                }
                _ => None,
            },
        )
        .collect();
    Ok((ipsec, peers))
}

/// The node's `external_ids` and its geneve tunnels, from one transaction.
async fn read_node(
    node: &Client,
) -> Result<(BTreeMap<String, String>, BTreeMap<String, Existing>), String> {
    let read = node
        .transact(
            "Open_vSwitch",
            &[
                Operation::select("Open_vSwitch", &["external_ids"]),
                Operation::select("Interface", &["name", "type", "options"]),
            ],
        )
        .await
        .map_err(|e| format!("reading the node's OVSDB: {e}"))?;
    let external_ids = rows(&read, 0)
        .first()
        .and_then(|r| r.get("external_ids"))
        .and_then(Datum::as_string_map)
        .unwrap_or_default();
    let existing = rows(&read, 1)
        .iter()
        .filter_map(|r| {
            let (Some(name), Some("geneve")) = (text(r, "name"), text(r, "type")) else {
                return None;
            };
            let options = r
                .get("options")
                .and_then(Datum::as_string_map)
                .unwrap_or_default();
            let remote_ip = options.get("remote_ip").cloned();
            Some((name.to_owned(), Existing { remote_ip, options }))
        })
        .collect();
    Ok((external_ids, existing))
}

/// Reads SB and the node, writes what differs.
async fn pass(
    config: &EmulationConfig,
    sb: &Client,
    node: &Client,
    state: &mut PassState,
    log: &mut Log,
) -> Result<(), String> {
    let (ipsec, mut peers) = read_sb(config, sb).await?;
    let (external_ids, existing) = read_node(node).await?;

    // The lease matters only while IPsec is on; then without one there
    // are no tunnels.
    let lease = if ipsec {
        match PublishedLease::read(&external_ids) {
            Ok(l) => {
                log.once(&mut state.lease_problem, None);
                Some(l)
            }
            Err(problem) => {
                log.once(
                    &mut state.lease_problem,
                    Some(format!(
                        "IPsec is enabled but the output protection lease is not usable, so no tunnels are built: {problem}"
                    )),
                );
                peers.clear();
                None
            }
        }
    } else {
        state.lease_problem = None;
        None
    };

    let wanted: BTreeMap<String, (String, &String)> = peers
        .iter()
        .map(|(chassis, ip)| (tunnel_name(chassis, 0), (chassis.clone(), ip)))
        .collect();
    for name in existing.keys() {
        if name.starts_with("ovn-") && !wanted.contains_key(name) {
            config
                .switch
                .remove_tunnel(name)
                .map_err(|e| e.to_string())?;
            log.line(&format!("removed tunnel {name}"));
        }
    }
    // Intent given or taken in one transaction for every tunnel of the
    // pass, as ovn-controller commits one engine run.
    let mut protect = Vec::new();
    let mut unprotect = Vec::new();
    for (name, (chassis, ip)) in &wanted {
        let tunnel = Tunnel {
            name: name.clone(),
            remote_ip: ip.parse().map_err(|e| format!("SB encap ip {ip:?}: {e}"))?,
            remote_name: chassis.clone(),
            mark: lease.map_or(0, |l| l.mark),
            reqid: lease.map_or(0, |l| l.reqid),
        };
        match existing.get(name) {
            Some(have) if have.remote_ip.as_ref() != Some(*ip) => {
                // The peer moved: a new tunnel, as OVN replaces it.
                config
                    .switch
                    .remove_tunnel(name)
                    .map_err(|e| e.to_string())?;
                add(config, &tunnel, lease.is_some(), log)?;
            }
            Some(have) => {
                let want = lease.map(|l| l.intent_options(chassis));
                if !intent_matches(&have.options, want.as_ref()) {
                    match want {
                        Some(want) => protect.push((tunnel, want)),
                        None => unprotect.push(name.as_str()),
                    }
                }
            }
            None => add(config, &tunnel, lease.is_some(), log)?,
        }
    }
    if !protect.is_empty() {
        let tunnels: Vec<Tunnel> = protect.iter().map(|(t, _)| t.clone()).collect();
        config
            .switch
            .protect_tunnels(&tunnels)
            .map_err(|e| e.to_string())?;
        for (tunnel, want) in &protect {
            log.line(&format!(
                "gave tunnel {} intent and marks: {}",
                tunnel.name,
                describe(Some(want))
            ));
        }
    }
    if !unprotect.is_empty() {
        config
            .switch
            .unprotect_tunnels(&unprotect)
            .map_err(|e| e.to_string())?;
        for name in &unprotect {
            log.line(&format!("removed intent and marks from tunnel {name}"));
        }
    }

    if let Some((entry, pod)) = &config.forward {
        let names: Vec<String> = wanted.keys().cloned().collect();
        if state.forwarded.as_ref() != Some(&names) {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            overlay::split_horizon(entry, pod, &refs).map_err(|e| e.to_string())?;
            log.line(&format!("forwarding {pod} <-> [{}]", names.join(", ")));
            state.forwarded = Some(names);
        }
    }
    Ok(())
}

/// Adds `tunnel`, with intent and marks in the same transaction when
/// `intent`.
fn add(
    config: &EmulationConfig,
    tunnel: &Tunnel,
    intent: bool,
    log: &mut Log,
) -> Result<(), String> {
    if intent {
        config
            .switch
            .add_tunnel(tunnel)
            .map_err(|e| e.to_string())?;
        log.line(&format!(
            "added tunnel {} to {} with intent and marks: mark {} reqid {}",
            tunnel.name, tunnel.remote_ip, tunnel.mark, tunnel.reqid
        ));
    } else {
        config
            .switch
            .add_plain_tunnel(&tunnel.name, tunnel.remote_ip)
            .map_err(|e| e.to_string())?;
        log.line(&format!(
            "added plain tunnel {} to {}",
            tunnel.name, tunnel.remote_ip
        ));
    }
    Ok(())
}

/// Whether a tunnel's `options` carry exactly `want`'s intent (or, for
/// `None`, none of the intent options).
fn intent_matches(options: &BTreeMap<String, String>, want: Option<&[(&str, String); 4]>) -> bool {
    match want {
        Some(want) => want.iter().all(|(k, v)| options.get(*k) == Some(v)),
        None => ovs::TUNNEL_PROTECTION_OPTIONS
            .iter()
            .all(|k| !options.contains_key(*k)),
    }
}

fn describe(want: Option<&[(&str, String); 4]>) -> String {
    let mut s = String::new();
    for (k, v) in want.into_iter().flatten() {
        let _ = write!(s, "{k}={v} ");
    }
    s.trim_end().to_owned()
}

/// The rows of the `i`th operation's result.
fn rows(results: &[ovsdb::OperationResult], i: usize) -> &[Row] {
    results
        .get(i)
        .and_then(|r| r.rows.as_deref())
        .unwrap_or_default()
}

fn text<'r>(row: &'r Row, column: &str) -> Option<&'r str> {
    match row.get(column)? {
        Datum::Atom(a) => a.as_str(),
        _ => None,
    }
}

/// The emulation's log: one timestamped line per write or problem.
struct Log {
    file: Option<std::fs::File>,
}

impl Log {
    fn open(path: &std::path::Path) -> Self {
        Log {
            file: std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok(),
        }
    }

    fn line(&mut self, text: &str) {
        if let Some(f) = &mut self.file {
            let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ");
            let _ = writeln!(f, "{now} {text}");
        }
    }

    /// Logs `now` when it differs from `*last` (its end as "resolved"),
    /// and remembers it: a problem is logged once per change, not per pass.
    fn once(&mut self, last: &mut Option<String>, now: Option<String>) {
        if *last == now {
            return;
        }
        match (&now, &*last) {
            (Some(problem), _) => self.line(problem),
            (None, Some(was)) => self.line(&format!("resolved: {was}")),
            (None, None) => {}
        }
        *last = now;
    }
}
