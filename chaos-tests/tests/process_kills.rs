//! Whole processes killed at each point of an activation: the agent
//! process (`kube-ovn-ipsec-chaos`, the agent binary that stops itself at
//! the point a file names) runs with real strongSwan and the patched
//! ovs-monitor-ipsec in a node's namespaces, against the one-node cluster
//! (the embedded API server with a signer that issues short-lived
//! certificates, so a renewal passes every point every few seconds, and a
//! real ovsdb-server). At the point the agent is stopped, and the victim
//! is SIGKILLed: the agent with everything it started (a node crash or an
//! OOM kill of the container; a new agent is started on the same key
//! directory), or charon, or the monitor (the agent is then continued).
//! The invariants after every fault are the actor kills' (docs/chaos.md):
//! guards in every dump (2), one complete generation in OVSDB (1), the
//! identity kept and no half-written file (3), ready again within the
//! bound (4), foreign policies untouched (5), no key material served or
//! logged (7).
//!
//! `CHAOS_SEED` replays a run; `CHAOS_PROCESS_NODES` (default 2) sets the
//! nodes that take faults in parallel, each its share of one matrix of the
//! eight points × three victims (`CHAOS_ROUNDS` rounds, default 1).
//! The kernel here has no ESP, so charon's CHILD_SAs fail; the points,
//! the processes and the guards are what is exercised. Ignored by the
//! workspace run: scripts/test.sh runs it in the chaos section.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

#[allow(unused)]
use harness::agent_node;
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use agent_node::{kill_tree_of, prerequisites};
use chaos::inject::{STOPPED, StopFile};
use chaos::plan::{Fault, Named, ProcessVictim, matrix};
use chaos::report::{Row, print_run};
use common::{
    FOREIGN, GuardSampler, after_fault, env_u64, generation, install_foreign, live_pid, policies,
    read_state, restarted, until_stopped, wait_ready,
};
use harness::cluster::{CHASSIS, Cluster};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::ipsec::IpsecNode;
use testbed::netns::wait_for;

/// The signer's certificate lifetime: a renewal (a pass through every
/// activation point, the monitor's reload included) every 6–9 s.
const LIFETIME: Duration = Duration::from_secs(15);
/// How long a point may take to be reached.
const REACH: Duration = Duration::from_secs(40);
/// Invariant 4's bound: the backoff's 30 s plus the processes' start.
const RECOVERY_BOUND: Duration = Duration::from_secs(45);

/// One node: the cluster, its namespaces and the agent process.
struct Node {
    index: usize,
    // Field order is drop order: the agent before what it uses.
    agent: Child,
    node: IpsecNode,
    cluster: Cluster,
    key_dir: PathBuf,
    port: u16,
    flags: Vec<String>,
    stop: StopFile,
    /// Guards and foreign policies at the first ready.
    baseline: BTreeSet<String>,
    /// How much of the agent's log the checks have read.
    log_from: usize,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM: the agent stops its IKE daemon and monitor itself; a
        // stopped agent is continued first.
        let pid = Pid::from_raw(self.agent.id() as i32);
        let _ = kill(pid, Signal::SIGCONT);
        let _ = kill(pid, Signal::SIGTERM);
        let _ = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
            self.agent.try_wait().ok().flatten()
        });
        kill_tree_of(&mut self.agent);
    }
}

impl Node {
    async fn start(index: usize, script: &Path) -> Node {
        let cluster = Cluster::start(LIFETIME).await;
        let node = IpsecNode::new(
            &format!("koi-pk{index}"),
            CHASSIS,
            [10, 79, u8::try_from(index).unwrap(), 1].into(),
        )
        .unwrap();
        let ns = node.netns().name().to_string();
        install_foreign(&ns);
        let appctl = harness::cluster::write_capability_standins(&cluster.standins).unwrap();
        let mut flags =
            harness::cluster::real_runtime_flags(&node, &cluster.standins, &appctl, script);
        flags.extend(["--guard-readback-ms", "200"].map(String::from));
        let key_dir = cluster.dir.path().join("keys");
        let port = Cluster::free_port();
        let stop = StopFile(cluster.dir.path().join("stop-at"));
        let agent = spawn(&cluster, &key_dir, port, &flags, &stop);
        let mut n = Node {
            index,
            agent,
            node,
            cluster,
            key_dir,
            port,
            flags,
            stop,
            baseline: BTreeSet::new(),
            log_from: 0,
        };
        if let Err(e) = wait_ready(n.port, Duration::from_secs(90), 1).await {
            panic!(
                "node {index}: {e}\n{}\n{}",
                n.cluster.agent_logs(),
                n.node.diagnostics()
            );
        }
        n.baseline = policies(&ns);
        assert!(
            n.baseline.iter().any(|p| !p.starts_with(FOREIGN)),
            "no guard in the namespace once ready: {:?}",
            n.baseline
        );
        n
    }

    /// One fault: arm the point, wait for the agent to stop there, kill
    /// the victim, sample the guards until ready again, check.
    async fn inject(&mut self, fault: Fault<ProcessVictim>) -> Row {
        let mut violations = Vec::new();
        let before = read_state(&self.key_dir).active.map(|a| a.generation);
        let gen_before = generation(self.port).await;
        self.stop.arm(fault.point.name()).unwrap();
        let pid = self.agent.id();
        let stopped = until_stopped(pid, REACH).await;
        if stopped != Some(true) {
            let _ = std::fs::remove_file(&self.stop.0);
            let log = std::fs::read_to_string(self.cluster.agent_log()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            if std::env::var_os("CHAOS_TRACE").is_some() {
                eprintln!("chaos: node {} log tail:\n{}", self.index, tail.join("\n"));
            }
            self.log_from = log.len();
            return Row::of(
                fault,
                self.index,
                None,
                vec![format!(
                    "0: the agent did not stop at {:?} within {REACH:?} ({stopped:?})",
                    fault.point.name()
                )],
            );
        }
        let hit = Instant::now();
        let ns = self.node.netns().name().to_string();
        let sampler = GuardSampler::start(&ns, self.baseline.clone());
        let mut killed: Option<(PathBuf, i32)> = None;
        match fault.victim {
            ProcessVictim::Agent => {
                kill_tree_of(&mut self.agent);
                self.agent = spawn(
                    &self.cluster,
                    &self.key_dir,
                    self.port,
                    &self.flags,
                    &self.stop,
                );
            }
            ProcessVictim::IkeDaemon | ProcessVictim::Monitor => {
                let pidfile = match fault.victim {
                    ProcessVictim::IkeDaemon => self.node.run_path("starter.charon.pid"),
                    _ => self.node.run_path("openvswitch/ovs-monitor-ipsec.pid"),
                };
                match live_pid(&pidfile) {
                    Some(p) => {
                        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                        killed = Some((pidfile.clone(), p));
                    }
                    None => violations.push(format!(
                        "0: {} was not running at the stop ({})",
                        fault.victim.name(),
                        pidfile.display()
                    )),
                }
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
            }
        }
        let min = if fault.point.activating() {
            gen_before + 1
        } else {
            gen_before
        };
        // A killed process must be running again, started anew: until the
        // agent notices the loss, its readiness is still the one from
        // before the kill (and the next fault would find no victim).
        let restarted = match &killed {
            Some((pidfile, old)) => restarted(pidfile, *old, hit + RECOVERY_BOUND).await,
            None => Ok(()),
        };
        let recovery = match restarted {
            Err(e) => {
                violations.push(format!("4: {e}"));
                None
            }
            Ok(()) => match wait_ready(self.port, RECOVERY_BOUND, min).await {
                Ok(_) => Some(hit.elapsed()),
                Err(e) => {
                    violations.push(format!("4: {e}"));
                    None
                }
            },
        };
        violations.extend(sampler.finish().await);
        let log = std::fs::read(self.cluster.agent_log()).unwrap_or_default();
        let text = String::from_utf8_lossy(&log[self.log_from.min(log.len())..]).into_owned();
        self.log_from = log.len();
        if !text.contains(&format!("{STOPPED}{}", fault.point.name())) {
            violations.push(format!(
                "0: the agent's log does not say it stopped at {:?}",
                fault.point.name()
            ));
        }
        violations.extend(
            after_fault(
                &|| self.cluster.other_config(),
                &ns,
                &self.key_dir,
                self.port,
                before,
                &self.baseline,
                &text,
            )
            .await,
        );
        Row::of(fault, self.index, recovery, violations)
    }
}

/// The chaos agent on `cluster`, with the real runtime `flags` and its
/// stops armed through `stop`.
fn spawn(cluster: &Cluster, key_dir: &Path, port: u16, flags: &[String], stop: &StopFile) -> Child {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let file = stop.0.display().to_string();
    cluster.spawn_agent_env(key_dir, port, 600, &flags, &[("CHAOS_STOP_FILE", &file)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn agent_charon_and_monitor_killed_at_every_activation_point_keep_every_invariant() {
    harness::use_agent_binary!();
    let script = prerequisites(&["python3"]);
    let seed = common::seed();
    let rounds = env_u64("CHAOS_ROUNDS", 1) as usize;
    let nodes = env_u64("CHAOS_PROCESS_NODES", 2).clamp(1, 8) as usize;
    println!(
        "chaos: seed {seed:#x} (CHAOS_SEED={seed:#x} replays), {rounds} round(s), {nodes} nodes"
    );
    let faults = matrix(seed, rounds, &ProcessVictim::ALL);
    let t0 = Instant::now();
    let started = futures::future::join_all((0..nodes).map(|i| Node::start(i, script))).await;
    println!(
        "{nodes} agents ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Node n takes faults n, n + nodes, …: each a share of one matrix.
    let tasks: Vec<_> = started
        .into_iter()
        .map(|mut node| {
            let mine: Vec<_> = faults
                .iter()
                .copied()
                .skip(node.index)
                .step_by(nodes)
                .collect();
            tokio::spawn(async move {
                let mut rows = Vec::new();
                for f in mine {
                    let row = node.inject(f).await;
                    eprintln!("{}", row.progress());
                    rows.push(row);
                }
                (rows, node)
            })
        })
        .collect();
    let mut rows = Vec::new();
    let mut done = Vec::new();
    for t in tasks {
        let (r, node) = t.await.expect("a node's fault loop panicked");
        rows.extend(r);
        done.push(node);
    }
    rows.sort_by_key(|r| r.index);
    let (report, failed) = print_run(seed, &rows, "faults", t0.elapsed());
    drop(done);
    assert_eq!(
        failed,
        0,
        "{failed} of {} faults violated an invariant (replay with CHAOS_SEED={seed:#x}):\n{report}",
        rows.len()
    );
}
