//! Processes killed on the encrypted overlay, on a full kernel (ESP,
//! GENEVE, the OVS kernel datapath): two simulated nodes, each with
//! ovsdb-server, ovs-vswitchd on the kernel datapath, a pod on `br-int`, a
//! Geneve tunnel with IPsec intent to the other (the lease's marks, as the
//! patched ovn-controller sets them), and the agent as a process
//! (`kube-ovn-ipsec-chaos`) with real strongSwan and the patched
//! ovs-monitor-ipsec, on the embedded API server with the real controller
//! signing. The pods ping each other every 200 ms throughout.
//!
//! Each fault SIGKILLs one process of one node while the traffic flows
//! encrypted: charon, ovs-monitor-ipsec, or the agent with everything it
//! started (a new agent is then started on the same key directory, as the
//! kubelet restarts the container). Two forms:
//!
//! - **steady state** (the default; scripts/kernel-tests.sh): each victim
//!   once, on the nodes in turn from one drawn from the seed, while the
//!   traffic flows (three faults);
//! - **with the activation points** (`CHAOS_OVERLAY_POINTS=1`;
//!   `scripts/chaos.sh --long`): the same, then each victim once at a
//!   point of an activation (six faults): the operator rotates the CA
//!   (the CLI's own `rotate_ca`), both agents renew onto it within their
//!   rotation spread, and the first to reach the armed point stops itself
//!   there (`kube-ovn-ipsec-chaos`, `CHAOS_STOP_FILE`) — the agent at
//!   `OVSDB sent` (its write in flight), charon at `OVSDB committed` (the
//!   new certificate stored, the monitor about to load it), the monitor
//!   at `monitor read-back`; the agent is
//!   then continued (or restarted, when it is the victim) and must be
//!   ready on the new generation. The renewals come from CA rotations
//!   because the controller signs for at least the Kubernetes floor of 10
//!   minutes: no lifetime-driven renewal falls into a run. Each costs a
//!   renewal under TCG, which doubles the run; in CI the points are taken
//!   by the process kills on the one-node cluster, every point with every
//!   victim, without the underlay.
//!
//! The victim node's underlay is captured from the kill until both pods
//! answer each other again, and its policies are dumped every 100 ms
//! meanwhile. Invariant 2 in full: the guards are in every dump, and the
//! capture holds **no plaintext Geneve** — every packet of the tunnel is
//! marked, so any would be marked traffic leaking — and ESP once the
//! traffic is back. Then the other invariants of the process kills
//! (docs/chaos.md): one complete generation in OVSDB (1), the identity
//! kept and no half-written file (3), Ready again within the bound (4),
//! the foreign policies untouched (5), no key material served or logged
//! (7). Invariant 4's bound comes from the run itself, not a constant
//! tuned to one machine: the backoff's 30 s cap, plus the two agents'
//! own start to Ready, plus — after a point — the unharmed node's renewal
//! onto the rotated CA, measured meanwhile. Recovery is to the pods
//! answering each other again, within an IKE negotiation (45 s) of the
//! victim's Ready. Both underlays are also captured over the whole run,
//! until 10 s after the last fault: a renegotiation a kill set off may
//! come after that fault's own capture.
//!
//! `CHAOS_SEED` replays the order; `CHAOS_ROUNDS` (default 1) repeats the
//! faults. On a kernel without ESP, GENEVE and openvswitch this prints
//! SKIPPED; scripts/kernel-tests.sh runs it on a full kernel, where
//! SKIPPED fails.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;
mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent_node::{
    AgentNode, attach_overlay, env_with, ipsec_on, kill_tree, ovs_map, prepare_node,
    start_agent_with,
};
use chaos::inject::{STOPPED, StopFile};
use chaos::plan::{Named, Point, ProcessVictim};
use chaos::report::{Row, print_run};
use common::{
    GuardSampler, after_fault, env_u64, generation, guards_and_foreign, install_foreign, live_pid,
    proc_state, restarted,
};
use harness::controller_cluster as cc;
use harness::ovn_controller::{OvnController, RunningOvnController};
use kube_ovn_ipsec_api::clock::SystemClock;
use kube_ovn_ipsec_api::test_util::SplitMix64;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::guest::HostFeatures;
use testbed::ipsec::IpsecNode;
use testbed::overlay::{self, Capture, Pinger, VSwitchd};

const PING_INTERVAL: Duration = Duration::from_millis(200);
/// The supervisors' backoff cap: invariant 4's bound is this plus what a
/// recovery must redo, as the same run measured it.
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// How long the pods may take to answer each other again past Ready: an
/// IKE negotiation under TCG.
const NEGOTIATION: Duration = Duration::from_secs(45);
/// How long the traffic runs, captured, after the last fault.
const SETTLE: Duration = Duration::from_secs(10);
/// Where a steady-state fault lands.
const STEADY: &str = "encrypted traffic";
/// How long an agent may take to reach an armed point after the rotation:
/// the rotation spread, the CSR and its signing under TCG.
const REACH: Duration = Duration::from_secs(90);
/// The agents' rotation spread: each renews onto a rotated CA within it.
const AGENT_FLAGS: [&str; 2] = ["--rotation-spread", "2"];
/// Each victim's activation point.
const AT_POINTS: [(Point, ProcessVictim); 3] = [
    (Point::OvsdbSent, ProcessVictim::Agent),
    (Point::OvsdbCommitted, ProcessVictim::IkeDaemon),
    (Point::MonitorReadBack, ProcessVictim::Monitor),
];

/// Where a fault lands: a node in steady state, or whichever node first
/// reaches the point in the renewal a CA rotation sets off.
#[derive(Debug, Clone, Copy)]
enum Target {
    Steady(usize),
    At(Point),
}

fn pod(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, u8::try_from(i + 1).unwrap())
}

/// The pidfile of `victim`'s process in `node` (charon or the monitor).
fn pidfile(node: &IpsecNode, victim: ProcessVictim) -> PathBuf {
    match victim {
        ProcessVictim::IkeDaemon => node.run_path("starter.charon.pid"),
        _ => node.run_path("openvswitch/ovs-monitor-ipsec.pid"),
    }
}

/// The faults of a run, `rounds` times, the victims' order drawn from
/// `seed`: each victim in steady state, on the nodes in turn from one
/// drawn from `seed` (the two nodes run the same programs in the same
/// roles — a tunnel with intent each way — so a second kill of the same
/// victim on the other node repeats a case at the cost of another
/// recovery under TCG), then, with the activation points, each at its
/// point.
fn faults(seed: u64, rounds: usize, points: bool) -> Vec<(Target, ProcessVictim)> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::new();
    for _ in 0..rounds {
        let mut victims = ProcessVictim::ALL;
        for i in (1..victims.len()).rev() {
            victims.swap(i, rng.below(i + 1));
        }
        // Both nodes take a kill every round: the first victim's node is
        // drawn, the others alternate from it.
        let first = rng.below(2);
        for (k, v) in victims.into_iter().enumerate() {
            out.push((Target::Steady((first + k) % 2), v));
        }
        if points {
            out.extend(AT_POINTS.map(|(p, v)| (Target::At(p), v)));
        }
    }
    out
}

/// The world of the run: the cluster and the two nodes.
struct World {
    // Field order is drop order: the agents before the cluster,
    // ovn-controller before the switches and databases it drives.
    _ovn_controllers: Vec<RunningOvnController>,
    nodes: Vec<AgentNode>,
    _vswitchds: Vec<VSwitchd>,
    /// The agents' flags (a respawn starts them the same way).
    flags: Vec<String>,
    e: agent_node::Env,
    /// Each node's guards and foreign policies once the traffic first
    /// flowed encrypted.
    baselines: Vec<BTreeSet<String>>,
    /// How much of each agent's log the checks have read.
    log_from: Vec<usize>,
    /// The agents' stop file.
    stop: StopFile,
    /// How long the nodes took from their agents' start to Ready with the
    /// traffic encrypted: what a killed agent must redo, measured here.
    start: Duration,
}

impl World {
    /// The operator's CA rotation with `point` armed; which node stopped
    /// there and when the rotation was done, or why none did.
    async fn rotate_and_stop(&mut self, point: Point) -> Result<(usize, Instant), String> {
        self.stop.arm(point.name()).unwrap();
        let settings = controller::ca::CaSettings {
            namespace: cc::NS.into(),
            algorithm: controller::signer::CaKeyAlgorithm::EcdsaP256,
            lifetime: Duration::from_secs(3650 * 86400),
        };
        if let Err(e) = controller::ca::rotate_ca(&self.e.admin, &settings, &SystemClock).await {
            let _ = std::fs::remove_file(&self.stop.0);
            return Err(format!("0: the CA rotation failed: {e}"));
        }
        let rotated = Instant::now();
        let deadline = rotated + REACH;
        loop {
            if let Some(i) = self
                .nodes
                .iter()
                .position(|n| n.agent_pid().and_then(proc_state) == Some('T'))
            {
                return Ok((i, rotated));
            }
            if Instant::now() >= deadline {
                let _ = std::fs::remove_file(&self.stop.0);
                return Err(format!(
                    "0: no agent stopped at {:?} within {REACH:?} of the rotation",
                    point.name()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One fault: for a point, the rotation and the stop; then capture the
    /// node's underlay and sample its guards, kill the victim, wait for the
    /// process, Ready (on a new generation after a point) and the traffic,
    /// check.
    async fn inject(
        &mut self,
        index: usize,
        target: Target,
        victim: ProcessVictim,
        seed: u64,
    ) -> Row {
        let mut violations = Vec::new();
        let mut befores = Vec::new();
        for n in &self.nodes {
            let state = common::read_state(&n.key_dir).active.map(|a| a.generation);
            befores.push((state, generation(n.port).await));
        }
        let (i, point, rotated) = match target {
            Target::Steady(i) => (i, STEADY.to_owned(), None),
            Target::At(p) => match self.rotate_and_stop(p).await {
                Ok((i, at)) => (i, p.name().to_owned(), Some(at)),
                Err(e) => {
                    return Row {
                        index,
                        point: p.name().into(),
                        victim: victim.name().into(),
                        seed,
                        node: 0,
                        recovery: None,
                        violations: vec![e],
                    };
                }
            },
        };
        let (before, gen_before) = befores[i];
        // After a point the node must be ready on the renewal's generation.
        let min = gen_before + u64::from(rotated.is_some());
        // Invariant 4's bound: the backoff's cap plus what the victim must
        // redo — a start, as this run's nodes took it, and after a point the
        // renewal, as the other node takes it unharmed (rotation → Ready on
        // its new generation), which is measured meanwhile.
        let steady_bound = BACKOFF_CAP + self.start;
        let other_renewal = rotated.map(|at| {
            let (port, want) = (self.nodes[1 - i].port, befores[1 - i].1 + 1);
            tokio::spawn(async move {
                common::wait_ready(port, steady_bound + REACH, want)
                    .await
                    .map(|_| at.elapsed())
            })
        });
        let node = &self.nodes[i];
        let ns = node.node.netns().name().to_string();
        let file = node.node.dir().join(format!("fault-{index}.pcap"));
        let capture = Capture::start(node.node.netns(), "eth0", &file).unwrap();
        let sampler = GuardSampler::start(&ns, self.baselines[i].clone());
        let hit = Instant::now();
        let mut killed = None;
        match victim {
            ProcessVictim::Agent => {
                kill_tree(&mut self.nodes[i]);
                let fx = &self.e.fxs[i];
                let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
                self.nodes[i]
                    .respawn(
                        harness::binaries::agent(),
                        fx,
                        &self.e.api,
                        self.e.script,
                        &flags,
                    )
                    .unwrap();
            }
            ProcessVictim::IkeDaemon | ProcessVictim::Monitor => {
                let file = pidfile(&node.node, victim);
                match live_pid(&file) {
                    Some(p) => {
                        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                        killed = Some((file, p));
                    }
                    None => violations.push(format!(
                        "0: {} was not running ({})",
                        victim.name(),
                        file.display()
                    )),
                }
                // The agent stopped at the point goes on without it.
                let _ = kill(
                    Pid::from_raw(i32::try_from(node.agent_pid().unwrap()).unwrap()),
                    Signal::SIGCONT,
                );
            }
        }
        let node = &self.nodes[i];
        let mut recovery = None;
        // Waited for up to the largest bound the fault can get; judged
        // against its own once the other node's renewal is known.
        let limit = steady_bound
            + if rotated.is_some() {
                REACH
            } else {
                Duration::ZERO
            };
        let back = match &killed {
            Some((file, old)) => restarted(file, *old, hit + limit).await,
            None => Ok(()),
        };
        let ready = match back {
            Ok(()) => common::wait_ready(node.port, limit.saturating_sub(hit.elapsed()), min)
                .await
                .map(|_| hit.elapsed()),
            Err(e) => Err(e),
        };
        // The other node renews onto the rotated CA too, unharmed.
        let renewal = match other_renewal {
            None => Some(Duration::ZERO),
            Some(task) => match task.await.unwrap() {
                Ok(d) => Some(d),
                Err(e) => {
                    violations.push(format!("4: the other node's renewal: {e}"));
                    None
                }
            },
        };
        let bound = renewal.map(|r| steady_bound + r);
        if let Some(b) = bound {
            let renewal = match rotated {
                Some(_) => format!(" + the other node's renewal {:.1?}", b - steady_bound),
                None => String::new(),
            };
            eprintln!(
                "chaos: fault {index}: bound {b:.1?} ({BACKOFF_CAP:?} + start {:.1?}{renewal})",
                self.start
            );
        }
        match (ready, bound) {
            (Err(e), _) => violations.push(format!("4: {e}")),
            (Ok(took), Some(bound)) if took > bound => violations.push(format!(
                "4: ready after {took:.1?}, over the bound {bound:.1?} (the backoff's \
                 {BACKOFF_CAP:?}, the run's start {:.1?}, the other node's renewal {:.1?})",
                self.start,
                bound - steady_bound
            )),
            (Ok(took), _) => {
                // Both directions, from the same moment: the pair is back
                // once each pod is answered.
                let (a, b) = (&self.nodes[0].node, &self.nodes[1].node);
                let replies = tokio::task::block_in_place(|| {
                    overlay::first_replies(&[(a.netns(), pod(1)), (b.netns(), pod(0))], NEGOTIATION)
                });
                if replies.iter().all(Option::is_some) {
                    recovery = Some(hit.elapsed());
                } else {
                    violations.push(format!(
                        "4: the pods did not answer each other within {NEGOTIATION:?} \
                         of the node's Ready, {took:.1?} after the kill ({replies:?})"
                    ));
                }
            }
        }
        // A second of the recovered traffic in the capture.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let wire = capture.stop().unwrap();
        if wire.dropped_by_kernel > 0 {
            violations.push(format!("2: the capture missed packets: {wire:?}"));
        }
        if wire.geneve > 0 {
            violations.push(format!(
                "2: {} plaintext Geneve packets on {}'s underlay: {wire:?}",
                wire.geneve,
                node.node.chassis()
            ));
        }
        if recovery.is_some() && wire.esp == 0 {
            violations.push(format!(
                "2: the traffic came back without ESP on the underlay: {wire:?}"
            ));
        }
        violations.extend(sampler.finish().await);
        let log = std::fs::read(&node.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&log[self.log_from[i].min(log.len())..]).into_owned();
        self.log_from[i] = log.len();
        let other_config = || ovs_map(&node.node, "other_config");
        violations.extend(
            after_fault(
                &other_config,
                &ns,
                &node.key_dir,
                node.port,
                before,
                &self.baselines[i],
                &text,
            )
            .await,
        );
        println!(
            "chaos: fault {index}: {} on {}: underlay {wire:?}",
            victim.name(),
            node.node.chassis()
        );
        if let Target::At(p) = target
            && !text.contains(&format!("{STOPPED}{}", p.name()))
        {
            violations.push(format!(
                "0: the agent's log does not say it stopped at {:?}",
                p.name()
            ));
        }
        Row {
            index,
            point,
            victim: victim.name().into(),
            seed,
            node: i,
            recovery,
            violations,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn charon_monitor_and_agent_killed_under_encrypted_traffic_leak_no_plaintext() {
    harness::use_agent_binary!();
    let features = HostFeatures::probe();
    if !features.complete() {
        println!(
            "SKIPPED: process kills on the encrypted overlay: this kernel lacks {features:?}; \
             scripts/kernel-tests.sh runs them on a full kernel"
        );
        return;
    }
    for p in ["ovs-vswitchd", "ovs-ofctl", "ping", "tcpdump"] {
        testbed::require_program(p).unwrap();
    }
    let seed = common::seed();
    let rounds = env_u64("CHAOS_ROUNDS", 1) as usize;
    // The activation points cost a CA rotation and a renewal each: about
    // twice the run under TCG, so scripts/chaos.sh --long asks for them.
    let points = env_u64("CHAOS_OVERLAY_POINTS", 0) != 0;
    println!(
        "chaos: seed {seed:#x} (CHAOS_SEED={seed:#x} replays), {rounds} round(s), \
         activation points {points}"
    );
    let t0 = Instant::now();
    // The CA re-read every second: a rotation reaches the controller at once.
    let e = env_with(2, &["--ca-reload", "1s"]).await;
    let stop = StopFile(e.dir.path().join("stop-at"));
    let stop_env = vec![(
        "CHAOS_STOP_FILE".to_string(),
        stop.0.to_string_lossy().into_owned(),
    )];
    let (na, nb) = IpsecNode::pair("koi-ok", &e.fxs[0].chassis, &e.fxs[1].chassis).unwrap();
    for n in [&na, &nb] {
        install_foreign(n.netns().name());
    }
    // ovn-controller on both nodes (emulated, or the patched binary
    // KUBE_OVN_IPSEC_OVN_CONTROLLER names) before the agents, whose
    // capability gate asks a real one's daemon.
    let ovn = OvnController::from_env().unwrap();
    println!("chaos: ovn-controller: {}", ovn.describe());
    let mut flags: Vec<String> = AGENT_FLAGS.map(String::from).into();
    flags.extend(ovn.agent_flags());
    let mut a = prepare_node(na, &e.fxs[0], e.dir.path());
    let mut b = prepare_node(nb, &e.fxs[1], e.dir.path());
    let (vswitchds, ovn_controllers) =
        attach_overlay(&ovn, &e.central, &[&a, &b], &[pod(0), pod(1)]);
    let spawned = Instant::now();
    {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        for (n, fx) in [(&mut a, &e.fxs[0]), (&mut b, &e.fxs[1])] {
            start_agent_with(n, fx, &e.api, e.script, &flags, stop_env.clone());
        }
    }
    for n in [&a, &b] {
        n.wait("active and ready", Duration::from_secs(120), |s| {
            s["generation"].as_u64().unwrap_or(0) >= 1
        })
        .await;
    }
    let node_start = spawned.elapsed();
    println!("chaos: both agents ready {node_start:.1?} after their start");
    // IPsec on (these agents arm at start).
    ipsec_on(&ovn, &e.central, &[&a, &b]);
    let pingers = [
        Pinger::start(a.node.netns(), pod(1), PING_INTERVAL).unwrap(),
        Pinger::start(b.node.netns(), pod(0), PING_INTERVAL).unwrap(),
    ];
    let first = tokio::task::block_in_place(|| {
        overlay::first_replies(
            &[(a.node.netns(), pod(1)), (b.node.netns(), pod(0))],
            Duration::from_secs(180),
        )
    });
    assert!(
        first.iter().all(Option::is_some),
        "the pods never answered each other over the encrypted overlay: {first:?}\n{}\n{}",
        a.logs(),
        b.logs()
    );
    // Guards and foreign policies only: charon's policies go with it.
    let baselines = vec![
        guards_and_foreign(a.node.netns().name()),
        guards_and_foreign(b.node.netns().name()),
    ];
    println!(
        "chaos: two nodes with encrypted pod traffic after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Each underlay over the whole run too: a renegotiation a fault set
    // off may come after its own capture stopped.
    let whole: Vec<Capture> = [&a, &b]
        .iter()
        .map(|n| Capture::start(n.node.netns(), "eth0", &n.node.dir().join("run.pcap")).unwrap())
        .collect();
    let mut world = World {
        _ovn_controllers: ovn_controllers,
        nodes: vec![a, b],
        _vswitchds: vswitchds,
        flags,
        e,
        baselines,
        log_from: vec![0, 0],
        stop,
        start: node_start,
    };
    let mut rows = Vec::new();
    for (index, (target, victim)) in faults(seed, rounds, points).into_iter().enumerate() {
        let row = world.inject(index, target, victim, seed).await;
        eprintln!("{}", row.progress());
        rows.push(row);
    }
    // The last fault's renegotiations, still under capture.
    tokio::time::sleep(SETTLE).await;
    let mut leaks = Vec::new();
    for (n, c) in world.nodes.iter().zip(whole) {
        let wire = c.stop().unwrap();
        println!(
            "chaos: {}'s underlay over the whole run: {wire:?}",
            n.node.chassis()
        );
        if wire.geneve > 0 || wire.dropped_by_kernel > 0 || wire.esp == 0 {
            leaks.push(format!("{}: {wire:?}", n.node.chassis()));
        }
    }
    let mut lost = Vec::new();
    for p in pingers {
        let s = p.stop().unwrap();
        lost.push(s.transmitted.saturating_sub(s.received));
    }
    println!("chaos: echoes lost over the whole run, per direction: {lost:?}");
    let (report, failed) = print_run(seed, &rows, "faults", t0.elapsed());
    if (failed > 0 || !leaks.is_empty()) && std::env::var_os("CHAOS_TRACE").is_some() {
        for n in &world.nodes {
            eprintln!("chaos: {} log:\n{}", n.node.chassis(), n.logs());
        }
    }
    drop(world);
    assert_eq!(
        failed,
        0,
        "{failed} of {} faults violated an invariant (replay with CHAOS_SEED={seed:#x}):\n{report}",
        rows.len()
    );
    assert!(
        leaks.is_empty(),
        "2: plaintext Geneve (or no ESP, or missed packets) on an underlay over the whole run \
         (replay with CHAOS_SEED={seed:#x}): {leaks:?}"
    );
}
