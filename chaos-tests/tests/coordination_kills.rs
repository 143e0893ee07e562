//! Enable and disable under kills, with the real agents and the real
//! controller: the embedded API server with RBAC on, real OVN NB/SB and
//! ovn-northd, the controller's coordinator, and two simulated nodes on one
//! underlay segment, each an agent process (`--coordination cluster`, its
//! Pod-bound token) with its own ovsdb-server, real strongSwan and the
//! patched ovs-monitor-ipsec, then `kube-ovn-ipsec cleanup` as the
//! `ipsec-cleanup` init container of its next Pod (docs/chaos.md).
//!
//! One cluster goes through six enables and five disables, the test
//! playing the operator (`--enable-ipsec`), the DaemonSet controller and
//! the kubelet as `runtime/tests/coordination_disable.rs` does. Each
//! transition takes a fault:
//!
//! - **an agent**: the first to publish the receipt that satisfies the
//!   `Prepare` (or `Arm`) barrier is stopped right there (the chaos build,
//!   `chaos::inject::receipt_point`) and SIGKILLed with everything it
//!   started, then started again as the same Pod (a container restart:
//!   the receipt is on the Node, the process that wrote it is gone);
//! - **the controller's leader**: a standby replica runs beside it, and
//!   the leader crashes (its task aborted: no clean stop, no last write) as
//!   soon as the record reads `Prepare`, `Arm`, `Disabling` or `Release`;
//!   the standby takes the Lease over and the transition must complete.
//! - **the controller process**: the replica runs as the real binary
//!   (its ServiceAccount's token, RBAC on) and is SIGKILLed as soon as the
//!   record reads `Prepare`, `Arm`, `Disabling`, `Cleanup` or `Release`
//!   (one transition each), then started again as the same Pod
//!   (a container restart: it renews its own Lease and resumes from the
//!   stored record). The same at every boundary, with stand-in nodes, is
//!   `controller/tests/coordination_restart.rs`.
//!
//! Sampled every 100 ms throughout (invariant 6): while the record reads
//! `Enabled`, or `NB_Global.ipsec` reads true, every target has its lease
//! published in OVSDB and both guards of that lease in its XFRM dump;
//! while it reads `Disabled`, no node holds a lease key or a policy of
//! ours; the phases only move forward and the epoch never goes back. At a
//! `Prepare` receipt the node has nothing published or armed; at an `Arm`
//! receipt it is armed, and its guards are in every dump until it is ready
//! again (2). After each enable: every node ready and armed within the
//! bound (4). After each disable: every node's XFRM dump is the one taken
//! before its agent first ran and OVSDB keeps only what is not ours (5).
//! At the end: no half-written file in a key directory (3), no key
//! material in a log or in `/status` (7).
//!
//! The kernel here has no ESP, so no tunnel is given intent: the record,
//! the leases, the guards and the releases are what is exercised. Ignored
//! by the workspace run: scripts/test.sh runs it in the chaos section.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_node::{
    AgentNode, Env, add_unrelated_keys, env, kill_tree, only_unrelated_left, roll_to_cleanup,
    roll_to_ipsec, start_node_with, xfrm_dump,
};
use chaos::check;
use chaos::inject::{StopFile, receipt_point};
use chaos::report::{Row, print_run};
use common::{FOREIGN, GuardSampler, foreign, install_foreign, policies, proc_state};
use harness::controller_cluster as cc;
use harness::controller_cluster::coordination::{
    flags_wanting, lease, nb_sb, nb_sb_at, record, status,
};
use kube_ovn_ipsec_api::coordination::CoordinationPhase;
use kube_ovn_ipsec_api::names::ovs;
use testbed::ipsec::IpsecNode;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use xfrm::Xfrm;
use xfrm::model::{Family, Policy, compare_guard};

use CoordinationPhase::{Arm, Cleanup, Disabled, Disabling, Enabled, Prepare, Release};

/// From a transition's start to its last phase, a fault's recovery
/// included.
const TRANSITION_BOUND: Duration = Duration::from_secs(150);
/// From the hit to every node ready and armed again: the backoff's cap
/// plus the processes' start (invariant 4).
const RECOVERY_BOUND: Duration = Duration::from_secs(45);
/// How long the cluster stays `Enabled`, every node ready, before the
/// next disable.
const SOAK: Duration = Duration::from_secs(3);
/// The phases of a cycle in the order the record walks them.
const CYCLE: [CoordinationPhase; 7] =
    [Prepare, Arm, Enabled, Disabling, Cleanup, Release, Disabled];

/// What one transition's fault kills, and where.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The first agent to publish its receipt satisfying the phase's
    /// barrier, SIGKILLed there and started again as the same Pod.
    Agent(CoordinationPhase),
    /// The controller's leader crashed as soon as the record reads the
    /// phase; a standby replica takes over.
    Leader(CoordinationPhase),
    /// The controller, a process, SIGKILLed as soon as the record reads
    /// the phase and started again as the same replica.
    Controller(CoordinationPhase),
    /// None: what a wait that handles no agent fault is given.
    None,
}

impl Fault {
    fn point(self) -> String {
        match self {
            Fault::Agent(p) => receipt_point(p),
            Fault::Leader(p) | Fault::Controller(p) => format!("record reads {p:?}"),
            Fault::None => "—".into(),
        }
    }

    fn victim(self) -> &'static str {
        match self {
            Fault::Agent(_) => "agent (SIGKILL)",
            Fault::Leader(_) => "leader (crash)",
            Fault::Controller(_) => "controller (SIGKILL)",
            Fault::None => "none",
        }
    }
}

/// The run: (enable?, fault) for each transition, in order.
/// The controller process is killed at each phase a transition passes
/// through on its way to `Enabled` or `Disabled`.
const PLAN: [(bool, Fault); 11] = [
    (true, Fault::Agent(Prepare)),
    (false, Fault::Leader(Disabling)),
    (true, Fault::Agent(Arm)),
    (false, Fault::Leader(Release)),
    (true, Fault::Leader(Prepare)),
    (false, Fault::Controller(Disabling)),
    (true, Fault::Leader(Arm)),
    (false, Fault::Controller(Cleanup)),
    (true, Fault::Controller(Arm)),
    (false, Fault::Controller(Release)),
    (true, Fault::Controller(Prepare)),
];

/// A node as the sampler reads it from outside: its name, its network
/// namespace and its ovsdb-server's socket (all blocking reads).
#[derive(Debug, Clone)]
struct Probe {
    name: String,
    ns: String,
    db: String,
}

impl Probe {
    fn of(n: &AgentNode, name: &str) -> Probe {
        Probe {
            name: name.to_owned(),
            ns: n.node.netns().name().to_owned(),
            db: format!("unix:{}", n.node.run_path("openvswitch/db.sock").display()),
        }
    }

    /// `Open_vSwitch .` `external_ids` (empty if the server does not
    /// answer).
    fn external_ids(&self) -> BTreeMap<String, String> {
        let out = std::process::Command::new("ovs-vsctl")
            .args([&format!("--db={}", self.db), "--no-wait", "--timeout=5"])
            .args(["get", "Open_vSwitch", ".", "external_ids"])
            .output();
        match out {
            Ok(o) if o.status.success() => {
                harness::cluster::parse_ovs_map(String::from_utf8_lossy(&o.stdout).trim())
            }
            _ => BTreeMap::new(),
        }
    }

    /// One look at the node, OVSDB read once: whether it is armed
    /// ([`Probe::armed`]) and what of ours it holds ([`Probe::holds`]).
    fn read(&self) -> (Result<(), String>, Vec<String>) {
        let ext = self.external_ids();
        (self.armed(&ext), self.holds(&ext))
    }

    /// Armed as the barrier means it: the lease published in OVSDB (`ext`)
    /// and both guards of that lease in the kernel; why not, if not.
    fn armed(&self, ext: &BTreeMap<String, String>) -> Result<(), String> {
        if !ext.contains_key(ovs::EXTERNAL_ID_PROTECTION_LEASE) {
            return Err("no lease published".into());
        }
        let mark: u32 = ext
            .get(ovs::EXTERNAL_ID_PROTECTION_MARK)
            .and_then(|m| m.trim_matches('"').parse().ok())
            .ok_or_else(|| format!("the lease has no mark: {ext:?}"))?;
        let mut h = xfrm::XfrmHandle::in_netns(&self.ns).map_err(|e| e.to_string())?;
        let dump = h.dump_policies().map_err(|e| e.to_string())?;
        if guards_armed(&dump, mark) {
            Ok(())
        } else {
            Err(format!(
                "the guards of lease mark {mark:#x} are not in the XFRM dump"
            ))
        }
    }

    /// What of ours the node holds: lease keys in OVSDB (`ext`), marked
    /// policies that are not the foreign ones.
    fn holds(&self, ext: &BTreeMap<String, String>) -> Vec<String> {
        let mut held: Vec<String> = ovs::PROTECTION_KEYS
            .iter()
            .filter(|k| ext.contains_key(**k))
            .map(|k| format!("external_ids:{k}"))
            .collect();
        held.extend(
            policies(&self.ns)
                .into_iter()
                .filter(|p| !p.starts_with(FOREIGN)),
        );
        held
    }
}

/// Both guards of `mark` are among `policies`.
fn guards_armed(policies: &[Policy], mark: u32) -> bool {
    let found = policies
        .iter()
        .filter(|p| {
            Family::ALL
                .iter()
                .any(|f| compare_guard(&Policy::guard(*f, mark), p).is_empty())
        })
        .count();
    found == Family::ALL.len()
}

/// Invariant 6, sampled every 100 ms until stopped.
struct RecordSampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<(Vec<String>, BTreeMap<String, usize>)>,
}

impl RecordSampler {
    fn start(admin: kube::Client, nb: String, sb: String, probes: Vec<Probe>) -> RecordSampler {
        let (stop, mut rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut violations: BTreeSet<String> = BTreeSet::new();
            let mut last: Option<(CoordinationPhase, u64, u64)> = None;
            let mut samples: BTreeMap<String, usize> = BTreeMap::new();
            loop {
                let r = record(&admin).await;
                let (nb_on, _) = nb_sb_at(&nb, &sb).await;
                let p = probes.clone();
                let states = tokio::task::spawn_blocking(move || {
                    p.iter().map(Probe::read).collect::<Vec<_>>()
                })
                .await
                .unwrap();
                if let Some(r) = &r {
                    if let Some((phase, epoch, generation)) = last {
                        if r.epoch < epoch {
                            violations.insert(format!(
                                "6: the epoch went back from {epoch} to {}",
                                r.epoch
                            ));
                        }
                        if r.generation < generation {
                            violations.insert(format!(
                                "6: the generation went back from {generation} to {}",
                                r.generation
                            ));
                        }
                        let next_transition = r.generation > generation;
                        if r.phase != phase && !forward(phase, r.phase, next_transition) {
                            violations.insert(format!(
                                "6: the record went from {phase:?} to {:?}",
                                r.phase
                            ));
                        }
                    }
                    last = Some((r.phase, r.epoch, r.generation));
                }
                let phase = r.as_ref().map(|r| r.phase);
                *samples
                    .entry(phase.map_or("none".into(), |p| format!("{p:?}")))
                    .or_default() += 1;
                for (probe, (armed, held)) in probes.iter().zip(&states) {
                    let target = r
                        .as_ref()
                        .is_some_and(|r| r.targets.contains_key(&probe.name));
                    if let Err(why) = armed
                        && ((phase == Some(Enabled) && target) || nb_on)
                    {
                        let claim = if nb_on {
                            "NB_Global.ipsec is true"
                        } else {
                            "the record reads Enabled"
                        };
                        violations
                            .insert(format!("6: {claim} while {} is unarmed: {why}", probe.name));
                    }
                    if phase == Some(Disabled) && !held.is_empty() {
                        violations.insert(format!(
                            "6: the record reads Disabled while {} holds {held:?}",
                            probe.name
                        ));
                    }
                }
                if rx.try_recv().is_ok() {
                    return (violations.into_iter().collect(), samples);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        RecordSampler { stop, task }
    }

    /// Its violations, and a violation if it never saw `Enabled` and
    /// `Disabled` (the checks would have held vacuously).
    async fn finish(self) -> Vec<String> {
        let _ = self.stop.send(());
        let (mut violations, samples) = self.task.await.unwrap();
        println!("chaos: record samples by phase {samples:?}");
        for p in [Enabled, Disabled] {
            if !samples.contains_key(&format!("{p:?}")) {
                violations.push(format!("0: the sampler never saw the record read {p:?}"));
            }
        }
        violations
    }
}

/// Whether the record may go from `a` to `b`: forward within a transition,
/// phases possibly unseen between (a sample can fall either side of a
/// short phase); a new generation (`next_transition`: an enable or a
/// disable begins) moves to the other transition's phases, whatever the
/// last one seen of the old.
fn forward(a: CoordinationPhase, b: CoordinationPhase, next_transition: bool) -> bool {
    let at = |p| CYCLE.iter().position(|q| *q == p).unwrap();
    let enabling = |p| at(p) <= at(Enabled);
    if next_transition {
        enabling(a) != enabling(b)
    } else {
        at(b) > at(a)
    }
}

/// Crashes the leader as soon as the record reads `phase`: aborts
/// whichever of `replicas` (name, task) holds the Lease then. The hit's
/// time, or `None` if the phase went by unseen within `bound`.
fn crash_leader_at(
    admin: kube::Client,
    phase: CoordinationPhase,
    replicas: Vec<(String, tokio::task::AbortHandle)>,
    bound: Duration,
) -> JoinHandle<Option<Instant>> {
    tokio::spawn(async move {
        let deadline = Instant::now() + bound;
        while reads(&admin, phase, deadline).await {
            let holder = lease(&admin).await.and_then(|s| s.holder_identity);
            for (name, task) in &replicas {
                if holder.as_deref() == Some(name) {
                    task.abort();
                    return Some(Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    })
}

/// Polls every 50 ms until the record reads `phase` (true) or `deadline`
/// passes (false).
async fn reads(admin: &kube::Client, phase: CoordinationPhase, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        if record(admin).await.is_some_and(|r| r.phase == phase) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// How to start the controller as its binary: replica `controller-0`
/// with its ServiceAccount's kubeconfig, wanting `enable`, each run
/// logging to its own file in `dir`.
#[derive(Debug, Clone)]
struct ControllerSpec {
    kubeconfig: PathBuf,
    nb: String,
    sb: String,
    enable: bool,
    dir: PathBuf,
}

/// One run of the controller binary; SIGKILLed and reaped when dropped
/// (a process left behind would hold the Lease against the next replica).
struct ControllerProcess {
    child: Child,
}

impl ControllerSpec {
    /// Starts run `n`.
    fn spawn(&self, n: usize) -> ControllerProcess {
        let log = std::fs::File::create(self.dir.join(format!("controller-{n}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-chaos-controller"))
            .args(["--namespace", cc::NS, "--metrics-addr", "127.0.0.1:0"])
            .args(flags_wanting(
                self.enable,
                &self.nb,
                &self.sb,
                "controller-0",
            ))
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        ControllerProcess { child }
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILLs the controller process in `slot` as soon as the record reads
/// `phase` and starts it again at once as the same replica (the kubelet's
/// first restart of a crashed container is immediate); the kill's time,
/// or `None` if the phase went by unseen within `bound`.
fn kill_controller_at(
    admin: kube::Client,
    phase: CoordinationPhase,
    spec: ControllerSpec,
    slot: Arc<Mutex<Option<ControllerProcess>>>,
    bound: Duration,
) -> JoinHandle<Option<Instant>> {
    tokio::spawn(async move {
        if !reads(&admin, phase, Instant::now() + bound).await {
            return None;
        }
        let mut held = slot.lock().unwrap();
        // Dropped: SIGKILL, reaped.
        held.take();
        let at = Instant::now();
        *held = Some(spec.spawn(1));
        Some(at)
    })
}

/// The template hash of cycle `cycle`'s `shape` Pods (the first enable's
/// is the fixtures').
fn hash(enable: bool, cycle: usize) -> String {
    if enable && cycle == 0 {
        cc::HASH.to_owned()
    } else {
        format!("{}{cycle:08x}", if enable { 'e' } else { 'c' })
    }
}

/// The world of the run.
struct Run {
    e: Env,
    nodes: Vec<AgentNode>,
    /// XFRM dumps taken before each agent first ran.
    before: Vec<String>,
    /// Policies with marks before each agent first ran (the foreign ones).
    baselines: Vec<BTreeSet<String>>,
    /// The template hash the nodes' Pods run.
    hash: String,
    /// The controller process of a transition with a controller fault.
    process: Arc<Mutex<Option<ControllerProcess>>>,
}

impl Run {
    /// Waits for the record to read `phase`, handling an agent fault on
    /// the way; the hit's time and node, if the fault is an agent's.
    async fn until(
        &mut self,
        phase: CoordinationPhase,
        fault: Fault,
        t0: Instant,
        violations: &mut Vec<String>,
        sampler: &mut Option<GuardSampler>,
    ) -> Option<(Instant, usize)> {
        let mut hit = None;
        loop {
            if let Fault::Agent(p) = fault
                && hit.is_none()
            {
                hit = self.agent_fault(p, violations, sampler);
            }
            if record(&self.e.admin)
                .await
                .is_some_and(|r| r.phase == phase)
            {
                return hit;
            }
            if t0.elapsed() >= TRANSITION_BOUND {
                violations.push(format!(
                    "4: not {phase:?} within {TRANSITION_BOUND:?}: {}",
                    status(&self.e.admin).await
                ));
                return hit;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// If an agent stopped at its receipt for `p`: the checks there, the
    /// kill and the restart.
    fn agent_fault(
        &mut self,
        p: CoordinationPhase,
        violations: &mut Vec<String>,
        sampler: &mut Option<GuardSampler>,
    ) -> Option<(Instant, usize)> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.agent_pid().and_then(proc_state) == Some('T'))?;
        let name = self.e.fxs[i].name.clone();
        let probe = Probe::of(&self.nodes[i], &name);
        let ns = probe.ns.clone();
        let (armed, held) = tokio::task::block_in_place(|| probe.read());
        if p == Prepare && !held.is_empty() {
            violations.push(format!(
                "6: {name} published its Prepare receipt holding {held:?}"
            ));
        }
        if p == Arm
            && let Err(why) = armed
        {
            violations.push(format!(
                "6: {name} published its Arm receipt unarmed: {why}"
            ));
        }
        if p == Arm {
            *sampler = Some(GuardSampler::start(&ns, policies(&ns)));
        }
        let at = Instant::now();
        let n = &mut self.nodes[i];
        kill_tree(n);
        let flags = [
            "--coordination",
            "cluster",
            "--pod-template-hash",
            self.hash.as_str(),
        ];
        n.respawn(
            harness::binaries::agent(),
            &self.e.fxs[i],
            &self.e.api,
            self.e.script,
            &flags,
        )
        .unwrap();
        Some((at, i))
    }

    /// Every node ready and armed by `until`; the time it took from
    /// `from`.
    async fn all_ready(
        &self,
        from: Instant,
        until: Instant,
        violations: &mut Vec<String>,
    ) -> Option<Duration> {
        loop {
            let mut all = true;
            for n in &self.nodes {
                let s = n.status().await.unwrap_or_default();
                all &= n.ready().await
                    && s["protectionArmed"] == true
                    && s["configurationApplied"] == true;
            }
            if all {
                return Some(from.elapsed());
            }
            if Instant::now() >= until {
                let mut states = Vec::new();
                for n in &self.nodes {
                    states.push(format!("{:?}", n.status().await));
                }
                violations.push(format!(
                    "4: not every node ready and armed after {:?}: {states:?}",
                    from.elapsed()
                ));
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One enable: the intent, new Pods after a disable, the fault; its row.
    async fn enable(&mut self, index: usize, cycle: usize, fault: Fault, stop: &StopFile) -> Row {
        let t0 = Instant::now();
        let mut violations = Vec::new();
        if cycle > 0 {
            // (The first enable's is armed before its agents start.)
            if let Fault::Agent(p) = fault {
                stop.arm(&receipt_point(p)).unwrap();
            }
        }
        let killer = self.restart_controller(true, cycle, fault).await;
        let standby = self.standby(true, fault).await;
        let crash = self.crash(fault, &standby).or(killer);
        if cycle > 0 {
            self.hash = hash(true, cycle);
            cc::set_template(&self.e.admin, &self.e.ds_uid, cc::Shape::Ipsec, &self.hash).await;
            for (i, n) in self.nodes.iter_mut().enumerate() {
                roll_to_ipsec(&mut self.e, n, i, &self.hash).await;
            }
        }
        let mut sampler = None;
        let agent_hit = self
            .until(Enabled, fault, t0, &mut violations, &mut sampler)
            .await;
        let hit = landed(fault, agent_hit, crash, &mut violations).await;
        // An agent must be back within the backoff's bound; a leader's
        // crash only delays the transition, whose own bound holds.
        let from = hit.map_or(t0, |(at, _)| at);
        let deadline = match fault {
            Fault::Agent(_) => from + RECOVERY_BOUND,
            _ => (t0 + TRANSITION_BOUND).max(Instant::now() + RECOVERY_BOUND),
        };
        let recovery = self.all_ready(from, deadline, &mut violations).await;
        // Enabled for a while before the next disable: the sampler's
        // claims about `Enabled` need samples.
        tokio::time::sleep(SOAK).await;
        if let Some(s) = sampler
            && let Some(v) = s.finish().await
        {
            violations.push(v);
        }
        if let Some(t) = standby {
            t.abort();
        }
        self.stop_process(cycle, true, &mut violations);
        let _ = std::fs::remove_file(&stop.0);
        println!(
            "chaos: enable {cycle} ({} at {}) after {:?}",
            fault.victim(),
            fault.point(),
            t0.elapsed()
        );
        row(
            index,
            fault,
            hit.map_or(0, |(_, n)| n),
            recovery,
            violations,
        )
    }

    /// One disable: the intent, NB off, the cleanup shape rolled node by
    /// node, the fault; its row.
    async fn disable(&mut self, index: usize, cycle: usize, fault: Fault) -> Row {
        let t0 = Instant::now();
        let mut violations = Vec::new();
        let killer = self.restart_controller(false, cycle, fault).await;
        let standby = self.standby(false, fault).await;
        let crash = self.crash(fault, &standby).or(killer);
        // The rollout follows NB and SB off, as the operator's runbook has it.
        while nb_sb(&self.e.central).await != (false, false) && t0.elapsed() < TRANSITION_BOUND {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.hash = hash(false, cycle);
        cc::set_template(
            &self.e.admin,
            &self.e.ds_uid,
            cc::Shape::Cleanup,
            &self.hash,
        )
        .await;
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if let Err(e) = roll_to_cleanup(&mut self.e, n, i, &self.hash).await {
                violations.push(format!("4: {e}"));
            }
        }
        let mut none = None;
        self.until(Disabled, Fault::None, t0, &mut violations, &mut none)
            .await;
        let hit = landed(fault, None, crash, &mut violations).await;
        let recovery = hit.map(|(at, _)| at.elapsed());
        for (i, n) in self.nodes.iter().enumerate() {
            let name = &self.e.fxs[i].name;
            let dump = tokio::task::block_in_place(|| xfrm_dump(&n.node));
            if dump != self.before[i] {
                violations.push(format!(
                    "5: {name}: XFRM differs from before the agent first ran:\n{dump}\nbefore:\n{}",
                    self.before[i]
                ));
            }
            if let Err(e) = tokio::task::block_in_place(|| only_unrelated_left(&n.node)) {
                violations.push(format!("5: {name}: {e}"));
            }
        }
        if let Some(t) = standby {
            t.abort();
        }
        self.stop_process(cycle, false, &mut violations);
        println!(
            "chaos: disable {cycle} ({} at {}) after {:?}",
            fault.victim(),
            fault.point(),
            t0.elapsed()
        );
        row(index, fault, 0, recovery, violations)
    }

    /// The controller for a transition wanting `enable`: for a controller
    /// fault, the binary as replica `controller-0` (the in-process one
    /// stopped) with its kill armed; otherwise the in-process replica
    /// restarted with the new intent (the first enable's already wants it).
    async fn restart_controller(
        &mut self,
        enable: bool,
        cycle: usize,
        fault: Fault,
    ) -> Option<JoinHandle<Option<Instant>>> {
        let Fault::Controller(p) = fault else {
            if !enable || cycle > 0 {
                agent_node::restart_controller(&mut self.e, enable).await;
            }
            return None;
        };
        self.e.controller.abort();
        let spec = self.controller_spec(enable, cycle).await;
        *self.process.lock().unwrap() = Some(spec.spawn(0));
        Some(kill_controller_at(
            self.e.admin.clone(),
            p,
            spec,
            self.process.clone(),
            TRANSITION_BOUND,
        ))
    }

    /// The binary's settings for the transition (`cycle`, `enable`): its
    /// own kubeconfig with a fresh ServiceAccount token, its log directory.
    async fn controller_spec(&self, enable: bool, cycle: usize) -> ControllerSpec {
        let dir = self.controller_logs(enable, cycle);
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = self.e.dir.path().join("controller.kubeconfig");
        let token = cc::mint_token(&self.e.admin, cc::CONTROLLER_SA, None).await;
        self.e.api.write_kubeconfig(&kubeconfig, &token).unwrap();
        ControllerSpec {
            kubeconfig,
            nb: self.e.central.nb.address(),
            sb: self.e.central.sb.address(),
            enable,
            dir,
        }
    }

    /// Where the controller processes of transition (`enable`, `cycle`) log.
    fn controller_logs(&self, enable: bool, cycle: usize) -> PathBuf {
        let kind = if enable { "enable" } else { "disable" };
        self.e.dir.path().join(format!("controller-{kind}-{cycle}"))
    }

    /// Stops the transition's controller process, if any, and checks its
    /// logs for key material (invariant 7).
    fn stop_process(&self, cycle: usize, enable: bool, violations: &mut Vec<String>) {
        if self.process.lock().unwrap().take().is_none() {
            return;
        }
        let mut logs = String::new();
        for e in std::fs::read_dir(self.controller_logs(enable, cycle))
            .unwrap()
            .flatten()
        {
            logs += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
        if logs.is_empty() {
            violations.push("0: the controller process logged nothing".into());
        }
        if let Some(what) = check::key_material(&logs) {
            violations.push(format!("7: the controller's log carries {what}"));
        }
    }

    /// A standby replica wanting `enable`, for a leader fault.
    async fn standby(&self, enable: bool, fault: Fault) -> Option<JoinHandle<()>> {
        let Fault::Leader(_) = fault else { return None };
        let (nb, sb) = (self.e.central.nb.address(), self.e.central.sb.address());
        let (task, _) = harness::cluster::start_controller(
            &self.e.api,
            &self.e.admin,
            &flags_wanting(enable, &nb, &sb, "controller-1"),
        )
        .await;
        Some(task)
    }

    /// The crash of a leader fault, armed.
    fn crash(
        &self,
        fault: Fault,
        standby: &Option<JoinHandle<()>>,
    ) -> Option<JoinHandle<Option<Instant>>> {
        let (Fault::Leader(p), Some(standby)) = (fault, standby) else {
            return None;
        };
        Some(crash_leader_at(
            self.e.admin.clone(),
            p,
            vec![
                ("controller-0".into(), self.e.controller.abort_handle()),
                ("controller-1".into(), standby.abort_handle()),
            ],
            TRANSITION_BOUND,
        ))
    }
}

/// The fault's hit, from the agent's or the crash's side; a violation if
/// it never landed.
async fn landed(
    fault: Fault,
    agent: Option<(Instant, usize)>,
    crash: Option<JoinHandle<Option<Instant>>>,
    violations: &mut Vec<String>,
) -> Option<(Instant, usize)> {
    let hit = match crash {
        Some(c) => {
            c.abort();
            c.await.ok().flatten().map(|at| (at, 0))
        }
        None => agent,
    };
    if hit.is_none() && !matches!(fault, Fault::None) {
        violations.push(format!(
            "0: the fault at {} was never injected",
            fault.point()
        ));
    }
    hit
}

fn row(
    index: usize,
    fault: Fault,
    node: usize,
    recovery: Option<Duration>,
    violations: Vec<String>,
) -> Row {
    Row {
        index,
        point: fault.point(),
        victim: fault.victim().into(),
        seed: 0,
        node,
        recovery,
        violations,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn enable_and_disable_survive_agent_and_leader_kills_at_each_barrier() {
    harness::use_agent_binary!();
    let t0 = Instant::now();
    let e = env(2).await;
    let chassis: Vec<String> = e.fxs.iter().map(|f| f.chassis.clone()).collect();
    let chassis: Vec<&str> = chassis.iter().map(String::as_str).collect();
    let mut mesh = IpsecNode::mesh("koi-ck", &chassis).unwrap();
    let stop = StopFile(e.dir.path().join("stop-at"));
    let stop_env = vec![(
        "CHAOS_STOP_FILE".to_string(),
        stop.0.to_string_lossy().into_owned(),
    )];
    // The first enable's fault is armed before its agents start.
    if let (true, Fault::Agent(p)) = PLAN[0] {
        stop.arm(&receipt_point(p)).unwrap();
    }
    let (mut before, mut baselines, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
    for (n, fx) in std::mem::take(&mut mesh.nodes).into_iter().zip(&e.fxs) {
        install_foreign(n.netns().name());
        before.push(xfrm_dump(&n));
        baselines.push(policies(n.netns().name()));
        nodes.push(start_node_with(
            n,
            fx,
            &e.api,
            e.dir.path(),
            e.script,
            &agent_node::AGENT_FLAGS,
            stop_env.clone(),
        ));
    }
    for n in &nodes {
        add_unrelated_keys(&n.node);
    }
    let probes: Vec<Probe> = nodes
        .iter()
        .zip(&e.fxs)
        .map(|(n, fx)| Probe::of(n, &fx.name))
        .collect();
    let sampler = RecordSampler::start(
        e.admin.clone(),
        e.central.nb.address(),
        e.central.sb.address(),
        probes,
    );
    let mut run = Run {
        e,
        nodes,
        before,
        baselines,
        hash: cc::HASH.to_owned(),
        process: Arc::default(),
    };

    let mut rows = Vec::new();
    for (index, (enable, fault)) in PLAN.into_iter().enumerate() {
        let cycle = index / 2;
        let r = if enable {
            run.enable(index, cycle, fault, &stop).await
        } else {
            run.disable(index, cycle, fault).await
        };
        if !matches!(fault, Fault::None) || !r.violations.is_empty() {
            rows.push(r);
        }
    }

    // Over the whole run.
    let mut end = sampler.finish().await;
    for (i, n) in run.nodes.iter().enumerate() {
        let name = &run.e.fxs[i].name;
        let ns = n.node.netns().name();
        if let Err(why) =
            check::foreign_unchanged(&foreign(&run.baselines[i]), &foreign(&policies(ns)))
        {
            end.push(format!("5: {name}: {why}"));
        }
        if let Err(why) = check::no_half_written(&n.key_dir) {
            end.push(format!("3: {name}: {why}"));
        }
        if let Some(what) = check::key_material(&n.logs()) {
            end.push(format!("7: {name}'s log carries {what}"));
        }
        if let Some(s) = n.status().await
            && let Some(what) = check::key_material(&s.to_string())
        {
            end.push(format!("7: {name}'s /status carries {what}"));
        }
    }
    if !end.is_empty() {
        rows.push(Row {
            index: PLAN.len(),
            point: "the whole run".into(),
            victim: "—".into(),
            seed: 0,
            node: 0,
            recovery: None,
            violations: end,
        });
    }
    let (report, failed) = print_run(0, &rows, "faults", t0.elapsed());
    if failed > 0 && std::env::var_os("CHAOS_TRACE").is_some() {
        for n in &run.nodes {
            eprintln!("chaos: {} log:\n{}", n.node.chassis(), n.logs());
        }
    }
    assert_eq!(failed, 0, "invariants violated:\n{report}");
}

#[test]
fn the_record_moves_forward_through_a_cycle_and_into_the_next() {
    assert!(forward(Prepare, Arm, false));
    assert!(forward(Prepare, Enabled, false));
    assert!(forward(Enabled, Disabling, false));
    assert!(forward(Enabled, Disabling, true));
    assert!(!forward(Enabled, Prepare, true));
    assert!(forward(Disabling, Release, false));
    assert!(forward(Disabled, Prepare, true));
    // Disabled fell between two samples.
    assert!(forward(Release, Prepare, true));
    assert!(!forward(Arm, Prepare, false));
    assert!(!forward(Release, Cleanup, false));
    assert!(!forward(Enabled, Prepare, false));
    assert!(!forward(Disabled, Prepare, false));
    assert!(!forward(Disabled, Disabling, true));
}
