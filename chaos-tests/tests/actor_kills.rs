//! Actors of running agents killed at each point of an activation: every
//! (point, victim) pair of the matrix a seed draws, on agents that run
//! in-process on the real components — the embedded API server with a
//! signer, a real ovsdb-server each, real XFRM guards in a network
//! namespace each — with the invariants checked after every fault
//! (docs/chaos.md). The agents follow the cluster's coordination (an
//! `Enabled` record names each node a target), so the node coordinator is
//! among the actors. The IKE daemon and the monitor are the runtime
//! tests' stand-in processes here (this host's kernel has no ESP).
//!
//! `CHAOS_SEED` replays a run; `CHAOS_NODES` (default 4) sets the agents
//! that take faults in parallel, `CHAOS_SHARES` (default 1) how many of
//! them split one matrix, and `CHAOS_ROUNDS` (default 1) the matrix's
//! rounds: 72 faults per round and matrix (8 points × 9 victims).
//! `scripts/chaos.sh --long` runs the long form. Ignored by the workspace
//! run: scripts/test.sh runs it in a section of its own, so its table is
//! in the log.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actors::supervisor;
use chaos::inject::Injector;
use chaos::plan::{Fault, Victim, matrix};
use chaos::report::{Row, print_run};
use common::{
    FOREIGN, GuardSampler, InProcessAgent, Logs, after_fault, env_u64, generation, install_foreign,
    policies, read_state, status,
};
use harness::cluster::Cluster;
use kube_ovn_ipsec_runtime::agent::Seams;

/// The signer's certificate lifetime: a renewal (and so a pass through
/// every activation point) every 4–6 s.
const LIFETIME: Duration = Duration::from_secs(10);
/// How long a point may take to be reached (a renewal, or a read-back).
const REACH: Duration = Duration::from_secs(30);
/// Invariant 4's bound: the backoff's 30 s plus the processes' start.
const RECOVERY_BOUND: Duration = Duration::from_secs(45);
/// One agent under faults.
struct Node {
    index: usize,
    cluster: Cluster,
    key_dir: PathBuf,
    port: u16,
    injector: Arc<Injector>,
    agent: InProcessAgent,
    /// Guards and foreign policies at the first ready: what every later
    /// dump must hold.
    baseline: BTreeSet<String>,
}

impl Node {
    async fn start(index: usize) -> Node {
        let cluster = Cluster::start(LIFETIME).await;
        let ns = cluster.netns.name().to_string();
        install_foreign(&ns);
        let key_dir = cluster.dir.path().join("keys");
        let port = Cluster::free_port();
        let injector = Injector::new(Duration::from_millis(300));
        let inj = injector.clone();
        // Coordinated, as in a cluster: the node coordinator is a victim.
        let agent = InProcessAgent::start_with(
            &cluster,
            &key_dir,
            port,
            Seams {
                wrap: Some(Box::new(move |a| inj.wrap(a))),
                ..Seams::default()
            },
            true,
        )
        .await;
        let mut node = Node {
            index,
            cluster,
            key_dir,
            port,
            injector,
            agent,
            baseline: BTreeSet::new(),
        };
        node.wait_ready(Duration::from_secs(60), 1).await.unwrap();
        node.baseline = policies(&ns);
        assert!(
            node.baseline.iter().any(|p| !p.starts_with(FOREIGN)),
            "no guard in the namespace once ready: {:?}",
            node.baseline
        );
        node
    }

    /// Ready (readyz 200, every child alive) on generation `min` or later;
    /// the generation, or why not within `bound`.
    async fn wait_ready(&self, bound: Duration, min: u64) -> Result<u64, String> {
        let deadline = Instant::now() + bound;
        let mut last = String::new();
        loop {
            if let Some((ready, s)) = status(self.port).await {
                let g = s["generation"].as_u64().unwrap_or(0);
                let report = supervisor::report(&self.agent.supervisor)
                    .await
                    .unwrap_or_default();
                let dead: Vec<_> = report
                    .iter()
                    .filter(|c| !c.alive)
                    .map(|c| c.name.clone())
                    .collect();
                if ready && g >= min && dead.is_empty() && !report.is_empty() {
                    return Ok(g);
                }
                last = format!(
                    "ready {ready}, generation {g} (want {min}), not running {dead:?}, phase {}",
                    s["phase"]
                );
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready within {bound:?}: {last}"));
            }
            if std::env::var_os("CHAOS_TRACE").is_some() {
                eprintln!("chaos: node {} waiting: {last}", self.index);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One fault: arm, kill at the hit, sample the guards until ready again,
    /// check the invariants.
    async fn inject(&mut self, fault: Fault, logs: &Logs, log_from: &mut usize) -> Row {
        let mut violations = Vec::new();
        let before = read_state(&self.key_dir).active.map(|a| a.generation);
        let gen_before = generation(self.port).await;
        let hit = self.injector.arm(fault.point);
        let hit = match tokio::time::timeout(REACH, hit).await {
            Ok(Ok(hit)) => hit,
            _ => {
                self.injector.disarm();
                return Row::of(
                    fault,
                    self.index,
                    None,
                    vec![format!("0: the point was not reached within {REACH:?}")],
                );
            }
        };
        match fault.victim {
            Victim::Actor(name) => match supervisor::child_cell(&self.agent.supervisor, name).await
            {
                Ok(Some(cell)) => cell.kill(),
                other => {
                    violations.push(format!("0: {name} was not running at the hit: {other:?}"))
                }
            },
            Victim::OvsdbServer => {
                if let Err(e) = self.cluster.ovs.kill() {
                    violations.push(format!("0: ovsdb-server could not be killed: {e}"));
                }
                // Down for a second (the agent's calls fail, its client
                // reconnects with backoff), then back on the same database.
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Err(e) = self.cluster.ovs.restart() {
                    violations.push(format!("0: ovsdb-server did not start again: {e}"));
                }
            }
        }
        // Sample the guards while the agent recovers (invariant 2).
        let ns = self.cluster.netns.name().to_string();
        let sampler = GuardSampler::start(&ns, self.baseline.clone());
        let min = if fault.point.activating() {
            gen_before + 1
        } else {
            gen_before
        };
        let recovery = match self.wait_ready(RECOVERY_BOUND, min).await {
            Ok(_) => Some(hit.at.elapsed()),
            Err(e) => {
                violations.push(format!("4: {e}"));
                None
            }
        };
        violations.extend(sampler.finish().await);
        let text = logs.since(log_from);
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

    async fn stop(self) {
        self.agent.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn actors_killed_at_every_activation_point_keep_every_invariant() {
    harness::use_agent_binary!();
    let logs = Logs::default();
    logs.install();
    let seed = common::seed();
    let rounds = env_u64("CHAOS_ROUNDS", 1) as usize;
    let nodes = env_u64("CHAOS_NODES", 4).max(1) as usize;
    // `CHAOS_SHARES` agents split one matrix between them, each a
    // contiguous part (so no victim twice in a row on one agent): more
    // agents, fewer faults each, the same total in less time.
    let shares = (env_u64("CHAOS_SHARES", 1).max(1) as usize).min(nodes);
    println!(
        "chaos: seed {seed:#x} (CHAOS_SEED={seed:#x} replays), {rounds} round(s), {nodes} agents, \
         {shares} to a matrix"
    );
    // `CHAOS_VICTIMS` (comma-separated names) narrows the victims.
    let victims: Vec<Victim> = match std::env::var("CHAOS_VICTIMS") {
        Ok(names) => Victim::ALL
            .into_iter()
            .filter(|v| names.split(',').any(|n| n.trim() == v.name()))
            .collect(),
        Err(_) => Victim::ALL.to_vec(),
    };
    assert!(!victims.is_empty(), "CHAOS_VICTIMS names no victim");
    // Each group of `shares` agents its own matrix (drawn from the run's
    // seed and the group's index): every (point, victim) pair once per
    // round, never one victim twice in a row on one agent.
    let per_node: Vec<Vec<Fault>> = (0..nodes)
        .map(|n| {
            let group = (n / shares) as u64;
            let group_seed = seed.wrapping_add(group.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let m = matrix(group_seed, rounds, &victims);
            let part = m.len().div_ceil(shares);
            let mut mine: Vec<Fault> = m.chunks(part).nth(n % shares).unwrap_or(&[]).to_vec();
            for f in &mut mine {
                f.index = f.index * nodes + n;
            }
            mine
        })
        .collect();
    let t0 = Instant::now();
    let started = futures::future::join_all((0..nodes).map(Node::start)).await;
    println!(
        "{nodes} agents ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // One task per agent: the checks run blocking programs (ovs-vsctl,
    // netlink dumps, the ovsdb-server restart), which would hold every
    // agent's turn if they shared one task.
    let tasks: Vec<_> = started
        .into_iter()
        .zip(per_node)
        .map(|(mut node, faults)| {
            let logs = logs.clone();
            tokio::spawn(async move {
                let mut from = 0usize;
                let mut rows = Vec::new();
                for f in &faults {
                    let row = node.inject(*f, &logs, &mut from).await;
                    eprintln!("{}", row.progress());
                    rows.push(row);
                }
                (rows, node)
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.expect("an agent's fault loop panicked"));
    }
    let mut rows = Vec::new();
    let mut started = Vec::new();
    for (r, node) in done {
        rows.extend(r);
        started.push(node);
    }
    rows.sort_by_key(|r| r.index);
    let (report, failed) = print_run(seed, &rows, "faults", t0.elapsed());
    for node in started {
        node.stop().await;
    }
    assert_eq!(
        failed,
        0,
        "{failed} of {} faults violated an invariant (replay with CHAOS_SEED={seed:#x}):\n{report}",
        rows.len()
    );
}
