//! What the chaos tests that run agents share (on the one-node cluster or
//! on the overlay's nodes):
//! the foreign policies, the reads of a node (XFRM, `/status`, OVSDB,
//! `state.json`), the guard sampler of invariant 2 and the checks after a
//! fault (invariants 1, 3, 5 and 7).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use actors::keydir::{KeyDirState, STATE_FILE};
use actors::ports::OvsdbIdentityKeys;
use chaos::check;
use tokio::sync::oneshot;
use xfrm::Xfrm;

use harness::cluster::{Cluster, NODE, http_get};

/// The high half of the marks of the foreign policies each node's
/// namespace holds: state this project did not create, which must survive
/// every fault.
pub const FOREIGN_MARK_HIGH: u32 = 0x4b4f;
/// How a foreign policy's line starts in [`policies`].
pub const FOREIGN: &str = "foreign ";

/// Installs the two foreign policies (marks `0x4b4f000x`) in `ns`.
pub fn install_foreign(ns: &str) {
    for (i, net) in ["198.51.100.0/24", "203.0.113.0/24"].iter().enumerate() {
        let out = std::process::Command::new("ip")
            .args(["-n", ns, "xfrm", "policy", "add", "src", net])
            .args(["dst", "192.0.2.0/24", "dir", "out"])
            .args(["priority", &(1000 + i).to_string()])
            .args(["mark", &format!("0x4b4f000{i}"), "mask", "0xffff0000"])
            .args(["action", "allow"])
            .output()
            .unwrap();
        assert!(out.status.success(), "foreign policy: {out:?}");
    }
}

/// The policies in `ns` that carry a mark — the guards, the foreign ones
/// (flagged) and any of charon's under the lease — one line each. The
/// IKE daemon's own socket policies carry none: they come and go with it.
pub fn policies(ns: &str) -> BTreeSet<String> {
    policies_where(ns, |_| true)
}

/// The guards and the foreign policies in `ns`, as [`policies`] prints
/// them: what must survive a fault where the IKE daemon's own policies
/// come and go with it (its traps, its SAs' policies, its shunts).
pub fn guards_and_foreign(ns: &str) -> BTreeSet<String> {
    policies_where(ns, |p| {
        let guard = p.action == xfrm::model::ACTION_BLOCK
            && p.priority == kube_ovn_ipsec_api::names::defaults::GUARD_PRIORITY
            && p.templates.is_empty();
        guard || p.mark.is_some_and(|m| m.value >> 16 == FOREIGN_MARK_HIGH)
    })
}

/// The marked policies in `ns` that `keep` keeps, one line each.
fn policies_where(ns: &str, keep: impl Fn(&xfrm::model::Policy) -> bool) -> BTreeSet<String> {
    let mut h = xfrm::XfrmHandle::in_netns(ns).unwrap();
    h.dump_policies()
        .unwrap()
        .iter()
        .filter(|p| p.mark.is_some() && keep(p))
        .map(|p| {
            let mut p = p.clone();
            // The kernel's index is not the policy's identity.
            p.index = 0;
            let foreign = p.mark.is_some_and(|m| m.value >> 16 == FOREIGN_MARK_HIGH);
            format!("{}{p:?}", if foreign { FOREIGN } else { "" })
        })
        .collect()
}

/// The foreign lines of `policies`.
pub fn foreign(policies: &BTreeSet<String>) -> String {
    policies
        .iter()
        .filter(|p| p.starts_with(FOREIGN))
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

/// `/readyz` (200 or not) and `/status`, once the agent answers.
pub async fn status(port: u16) -> Option<(bool, serde_json::Value)> {
    let ready = http_get(port, "/readyz").await.map(|(c, _)| c) == Some(200);
    let (code, body) = http_get(port, "/status").await?;
    (code == 200 || code == 503)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
        .map(|s| (ready, s))
}

/// The generation `/status` reports (0 when it does not answer).
pub async fn generation(port: u16) -> u64 {
    status(port)
        .await
        .map(|(_, s)| s["generation"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

/// Waits until `/readyz` is 200 with generation `min` or later active (the
/// agent on `port`); the generation, or what `/status` last said when
/// `bound` ran out.
pub async fn wait_ready(port: u16, bound: Duration, min: u64) -> Result<u64, String> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut last = String::from("/status never answered");
    loop {
        if let Some((ready, s)) = status(port).await {
            let g = s["generation"].as_u64().unwrap_or(0);
            if ready && g >= min {
                return Ok(g);
            }
            last = format!(
                "ready {ready}, generation {g} (want {min}), phase {}, reason {}",
                s["phase"], s["reason"]
            );
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("not ready within {bound:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `state.json` (default when absent or unreadable).
pub fn read_state(key_dir: &Path) -> KeyDirState {
    std::fs::read(key_dir.join(STATE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// A node's OVSDB `Open_vSwitch` `other_config`, read anew at each call
/// (the one-node cluster's [`Cluster::other_config`], or an overlay node's).
pub type OtherConfig<'a> = &'a (dyn Fn() -> BTreeMap<String, String> + Sync);

/// The identity keys in OVSDB's `other_config`.
pub fn ovsdb_keys(other_config: OtherConfig<'_>) -> OvsdbIdentityKeys {
    let oc = other_config();
    OvsdbIdentityKeys {
        private_key: oc.get("private_key").cloned(),
        certificate: oc.get("certificate").cloned(),
        ca_cert: oc.get("ca_cert").cloned(),
    }
}

/// OVSDB's identity keys and `state.json` as of one moment: the agent
/// keeps renewing, so the state is read between two equal reads of OVSDB.
/// The key directory records a generation as issued-pending before OVSDB
/// is switched to it and as active after, so a state read while OVSDB
/// stood still must name OVSDB's.
pub fn snapshot(other_config: OtherConfig<'_>, key_dir: &Path) -> (OvsdbIdentityKeys, KeyDirState) {
    let mut keys = ovsdb_keys(other_config);
    for _ in 0..20 {
        let state = read_state(key_dir);
        let again = ovsdb_keys(other_config);
        if again == keys {
            return (keys, state);
        }
        keys = again;
    }
    panic!("OVSDB's identity keys never stood still across a read of state.json");
}

/// Samples the policies of `ns` every 100 ms until stopped: invariant 2's
/// evidence while an agent recovers.
pub struct GuardSampler {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, Option<String>)>,
}

impl GuardSampler {
    /// Starts sampling; every line of `baseline` must be in every dump.
    pub fn start(ns: &str, baseline: BTreeSet<String>) -> GuardSampler {
        let ns = ns.to_owned();
        let (stop, mut rx) = oneshot::channel::<()>();
        let task = tokio::task::spawn_blocking(move || {
            let mut missing = None;
            let mut samples = 0;
            loop {
                let now = policies(&ns);
                samples += 1;
                if missing.is_none()
                    && let Some(gone) = baseline.difference(&now).next()
                {
                    missing = Some(gone.clone());
                }
                if rx.try_recv().is_ok() || samples > 2000 {
                    return (samples, missing);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        GuardSampler { stop, task }
    }

    /// Stops sampling; a violation of invariant 2 if a line was missing.
    pub async fn finish(self) -> Option<String> {
        let _ = self.stop.send(());
        let (samples, missing) = self.task.await.unwrap();
        missing.map(|p| format!("2: a guard was missing from one of {samples} dumps: {p}"))
    }
}

/// Invariants 1, 3, 5 and 7 once the agent is back: OVSDB on one complete
/// generation that `state.json` names; the generation active before the
/// fault (`before`) kept or succeeded; no half-written file, no temporary
/// file left; the foreign policies of `baseline` unchanged; no key
/// material in `/status` or in `logs`.
pub async fn after_fault(
    other_config: OtherConfig<'_>,
    ns: &str,
    key_dir: &Path,
    port: u16,
    before: Option<u64>,
    baseline: &BTreeSet<String>,
    logs: &str,
) -> Vec<String> {
    let mut violations = Vec::new();
    let (keys, state) = snapshot(other_config, key_dir);
    if let Err(e) = check::one_generation(key_dir, &keys, &state) {
        violations.push(format!("1: {e}"));
    }
    if let Err(e) = check::identity_kept(before, &state) {
        violations.push(format!("3: {e}"));
    }
    if let Err(e) = check::no_half_written(key_dir) {
        violations.push(format!("3: {e}"));
    }
    let seen = check::temporary_files(key_dir);
    if !seen.is_empty() {
        // The agent keeps renewing: one seen may be a write in progress.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left: Vec<_> = check::temporary_files(key_dir)
            .intersection(&seen)
            .map(|p| p.display().to_string())
            .collect();
        if !left.is_empty() {
            violations.push(format!("3: temporary files left behind: {left:?}"));
        }
    }
    let now = policies(ns);
    if let Err(e) = check::foreign_unchanged(&foreign(baseline), &foreign(&now)) {
        violations.push(format!("5: {e}"));
    }
    if let Some((_, s)) = status(port).await
        && let Some(what) = check::key_material(&s.to_string())
    {
        violations.push(format!("7: /status carries {what}"));
    }
    if let Some(what) = check::key_material(logs) {
        violations.push(format!("7: the logs carry {what}"));
    }
    violations
}

/// The process state letter of `pid` (`/proc/<pid>/stat`), if it lives.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits (polling, without blocking the runtime: the embedded API server
/// runs on it) until `pid` is stopped (true), or has exited or become a
/// zombie without stopping (false); `None` if neither within `bound`.
pub async fn until_stopped(pid: u32, bound: Duration) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match proc_state(pid) {
            Some('T') => return Some(true),
            None | Some('Z') => return Some(false),
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the in-process agents log (the test's tracing writer), for
/// invariant 7.
#[derive(Clone, Default)]
pub struct Logs(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Sends the test binary's tracing (JSON, info) here.
    pub fn install(&self) {
        let writer = self.clone();
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter("info")
            .with_writer(move || writer.clone())
            .try_init();
    }

    /// What was logged since `from` (which moves to the end).
    pub fn since(&self, from: &mut usize) -> String {
        let l = self.0.lock().unwrap();
        let t = String::from_utf8_lossy(&l[(*from).min(l.len())..]).into_owned();
        *from = l.len();
        t
    }
}

/// An agent run in-process (`runtime::agent::run::run_with`, the start-up
/// of `kube-ovn-ipsec run` from the same flags) on `cluster` with the
/// stand-in runtime, its seams the test's.
pub struct InProcessAgent {
    /// The node supervisor (to kill a child by name).
    pub supervisor: ractor::ActorRef<actors::supervisor::SupervisorMsg>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), kube_ovn_ipsec_runtime::agent::AgentError>>,
}

impl InProcessAgent {
    /// Starts the agent with `key_dir`, its status server on `port`, and
    /// `seams` (whose `started` is the test's own), armed at start without
    /// the cluster's coordination; returns once its tree started.
    pub async fn start(
        cluster: &Cluster,
        key_dir: &Path,
        port: u16,
        seams: kube_ovn_ipsec_runtime::agent::Seams,
    ) -> InProcessAgent {
        Self::start_with(cluster, key_dir, port, seams, false).await
    }

    /// [`InProcessAgent::start`]; `coordinated`: the agent follows the
    /// cluster's coordination (`--coordination cluster`, with its node
    /// coordinator among the actors) and the cluster's record is written
    /// first, `Enabled` with this node a target, so it arms at once as an
    /// agent restarted in an encrypted cluster does.
    pub async fn start_with(
        cluster: &Cluster,
        key_dir: &Path,
        port: u16,
        mut seams: kube_ovn_ipsec_runtime::agent::Seams,
        coordinated: bool,
    ) -> InProcessAgent {
        if coordinated {
            write_enabled_record(cluster).await;
        }
        let mut argv: Vec<String> = [
            "run",
            "--node-name",
            NODE,
            "--coordination",
            if coordinated { "cluster" } else { "off" },
            "--pod-name",
            &cluster.pod.name,
            "--pod-namespace",
            "kube-system",
            "--pod-uid",
            &cluster.pod.uid,
            "--ovsdb",
            &cluster.ovs.address(),
            "--certificate-lifetime",
            "600",
            "--key-algorithm",
            "ecdsa-p256",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if coordinated {
            argv.extend(["--pod-template-hash".into(), TEMPLATE_HASH.into()]);
        }
        argv.extend([
            "--key-dir".into(),
            key_dir.display().to_string(),
            "--status-addr".into(),
            format!("127.0.0.1:{port}"),
            "--kubeconfig".into(),
            cluster.kubeconfig.display().to_string(),
            "--ctl-socket".into(),
            key_dir.with_extension("ctl").display().to_string(),
        ]);
        for (flag, value) in cluster.standin_flags() {
            argv.push(flag);
            argv.push(value);
        }
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: kube_ovn_ipsec_runtime::agent::RunArgs,
        }
        let args = <Cli as clap::Parser>::try_parse_from(&argv).unwrap().run;
        let (started_tx, started) = oneshot::channel();
        seams.started = Some(started_tx);
        let (shutdown, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(kube_ovn_ipsec_runtime::agent::run::run_with(
            args, rx, seams,
        ));
        let supervisor = tokio::time::timeout(Duration::from_secs(60), started)
            .await
            .expect("the agent's tree did not start within 60 s")
            .unwrap();
        InProcessAgent {
            supervisor,
            shutdown,
            task,
        }
    }

    /// Stops the agent (as SIGTERM does) and waits for it.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.task).await;
    }
}

/// The template hash of the coordinated agents' Pod and record.
pub const TEMPLATE_HASH: &str = "chaos0";

/// Writes `cluster`'s coordination record as the controller leaves it once
/// IPsec is on: `Enabled`, the one node a target with its UID.
pub async fn write_enabled_record(cluster: &Cluster) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
    use kube_ovn_ipsec_api::ident::Uid;
    use kube_ovn_ipsec_api::names::k8s;
    let trust = kube_ovn_ipsec_api::pki::TrustBundle::from_pem(cluster.ca_pem.as_bytes()).unwrap();
    let record = CoordinationRecord {
        generation: 1,
        epoch: 3,
        phase: CoordinationPhase::Enabled,
        daemon_set_uid: Some(Uid::new("00000000-0000-4000-8000-00000000c4a0").unwrap()),
        template_hash: Some(TEMPLATE_HASH.into()),
        trust_hash: Some(trust.digest()),
        targets: [(NODE.to_owned(), Uid::new(cluster.node_uid.clone()).unwrap())].into(),
        ..CoordinationRecord::initial()
    };
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(k8s::COORDINATION_CONFIGMAP.into()),
            ..Default::default()
        },
        data: Some(
            [(
                k8s::COORDINATION_CONFIGMAP_KEY.to_owned(),
                record.encode().unwrap(),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let admin = cluster.api.client(apiserver::ADMIN_TOKEN).await.unwrap();
    kube::Api::<ConfigMap>::namespaced(admin, "kube-system")
        .create(&kube::api::PostParams::default(), &cm)
        .await
        .unwrap();
}

/// The run's seed: `CHAOS_SEED` (a replay), else drawn from the clock.
pub fn seed() -> u64 {
    env_u64(
        "CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    )
}

/// The PID a pidfile names, if that process lives.
pub fn live_pid(pidfile: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// Waits until `pidfile` names a live process other than `old` (the one
/// killed); why not, by `deadline`.
pub async fn restarted(
    pidfile: &Path,
    old: i32,
    deadline: std::time::Instant,
) -> Result<(), String> {
    loop {
        if live_pid(pidfile).is_some_and(|p| p != old) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{} still names no new process after the kill of {old}",
                pidfile.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An environment variable as a number (decimal, or hex with `0x`).
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            v.strip_prefix("0x")
                .map_or_else(|| v.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
        })
        .unwrap_or(default)
}
