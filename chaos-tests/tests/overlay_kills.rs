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
//! kubelet restarts the container). The victim node's underlay is captured
//! from before the kill until both pods answer each other again, and its
//! policies are dumped every 100 ms meanwhile. Invariant 2 in full: the
//! guards are in every dump, and the capture holds **no plaintext Geneve**
//! — every packet of the tunnel is marked, so any would be marked traffic
//! leaking — and ESP once the traffic is back. Then the other invariants
//! of the process kills (docs/chaos.md): one complete generation in OVSDB
//! (1), the identity kept and no half-written file (3), Ready again within
//! the bound (4), the foreign policies untouched (5), no key material
//! served or logged (7). Recovery is to the pods answering each other
//! again. Both underlays are also captured over the whole run, until 10 s
//! after the last fault: a renegotiation a kill set off may come after
//! that fault's own capture.
//!
//! Not at the activation points: the controller signs for at least the
//! Kubernetes floor of 10 minutes, so no renewal falls into a run; the
//! process kills on the one-node cluster cover the points.
//!
//! `CHAOS_SEED` replays the order; `CHAOS_ROUNDS` (default 1) repeats the
//! 2 nodes × 3 victims. On a kernel without ESP, GENEVE and openvswitch
//! this prints SKIPPED; scripts/kernel-tests.sh runs it on a full kernel,
//! where SKIPPED fails.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

#[path = "../../runtime/tests/agent_node/mod.rs"]
mod agent_node;
mod common;
#[path = "../../runtime/tests/ike_node/mod.rs"]
#[allow(unused)]
mod ike_node;
#[path = "../../runtime/tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent_node::{AgentNode, connect, env, kill_tree, ovs_map, start_node};
use chaos::plan::{Named, ProcessVictim};
use chaos::report::{Row, print_run};
use common::{
    GuardSampler, after_fault, env_u64, generation, guards_and_foreign, install_foreign, live_pid,
    restarted,
};
use kube_ovn_ipsec_api::test_util::SplitMix64;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::guest::HostFeatures;
use testbed::ipsec::{IpsecNode, Tunnel};
use testbed::overlay::{self, Capture, Pinger, VSwitchd};

const PING_INTERVAL: Duration = Duration::from_millis(200);
/// Invariant 4's bound: the backoff's 30 s plus the processes' start.
const RECOVERY_BOUND: Duration = Duration::from_secs(45);
/// How long the pods may take to answer each other again: the bound plus
/// an IKE negotiation under TCG.
const TRAFFIC_BOUND: Duration = Duration::from_secs(90);
/// How long the traffic runs, captured, after the last fault.
const SETTLE: Duration = Duration::from_secs(10);
/// Where each fault lands.
const POINT: &str = "encrypted traffic";

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

/// The faults of a run: each victim on each node, `rounds` times, the
/// victims' order drawn from `seed`.
fn faults(seed: u64, rounds: usize) -> Vec<(usize, ProcessVictim)> {
    let mut rng = SplitMix64(seed);
    let mut out = Vec::new();
    for _ in 0..rounds {
        let mut victims = ProcessVictim::ALL;
        for i in (1..victims.len()).rev() {
            victims.swap(i, rng.below(i + 1));
        }
        for v in victims {
            out.extend([(0, v), (1, v)]);
        }
    }
    out
}

/// The world of the run: the cluster and the two nodes.
struct World {
    // Field order is drop order: the agents before the cluster.
    nodes: Vec<AgentNode>,
    _vswitchds: Vec<VSwitchd>,
    e: agent_node::Env,
    /// Each node's guards and foreign policies once the traffic first
    /// flowed encrypted.
    baselines: Vec<BTreeSet<String>>,
    /// How much of each agent's log the checks have read.
    log_from: Vec<usize>,
}

impl World {
    /// One fault: capture node `i`'s underlay and sample its guards, kill
    /// the victim, wait for the process, Ready and the traffic, check.
    async fn inject(&mut self, index: usize, i: usize, victim: ProcessVictim, seed: u64) -> Row {
        let mut violations = Vec::new();
        let node = &self.nodes[i];
        let ns = node.node.netns().name().to_string();
        let before = common::read_state(&node.key_dir)
            .active
            .map(|a| a.generation);
        let gen_before = generation(node.port).await;
        let file = node.node.dir().join(format!("fault-{index}.pcap"));
        let capture = Capture::start(node.node.netns(), "eth0", &file).unwrap();
        let sampler = GuardSampler::start(&ns, self.baselines[i].clone());
        let hit = Instant::now();
        let mut killed = None;
        match victim {
            ProcessVictim::Agent => {
                kill_tree(&mut self.nodes[i]);
                let (fx, dir) = (&self.e.fxs[i], self.e.dir.path());
                self.nodes[i].respawn(fx, &self.e.api, dir, self.e.script, &[]);
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
            }
        }
        let node = &self.nodes[i];
        let mut recovery = None;
        let back = match &killed {
            Some((file, old)) => restarted(file, *old, hit + RECOVERY_BOUND).await,
            None => Ok(()),
        };
        let ready = match back {
            Ok(()) => common::wait_ready(node.port, RECOVERY_BOUND, gen_before)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match ready {
            Err(e) => violations.push(format!("4: {e}")),
            Ok(()) => {
                // Both directions, from the same moment: the pair is back
                // once each pod is answered.
                let (a, b) = (&self.nodes[0].node, &self.nodes[1].node);
                let left = TRAFFIC_BOUND.saturating_sub(hit.elapsed());
                let replies = tokio::task::block_in_place(|| {
                    overlay::first_replies(&[(a.netns(), pod(1)), (b.netns(), pod(0))], left)
                });
                if replies.iter().all(Option::is_some) {
                    recovery = Some(hit.elapsed());
                } else {
                    violations.push(format!(
                        "4: the pods did not answer each other within {TRAFFIC_BOUND:?} \
                         of the kill ({replies:?})"
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
        Row {
            index,
            point: POINT.into(),
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
    println!("chaos: seed {seed:#x} (CHAOS_SEED={seed:#x} replays), {rounds} round(s)");
    let t0 = Instant::now();
    let e = env(2).await;
    let (na, nb) = IpsecNode::pair("koi-ok", &e.fxs[0].chassis, &e.fxs[1].chassis).unwrap();
    for n in [&na, &nb] {
        install_foreign(n.netns().name());
    }
    let a = start_node(na, &e.fxs[0], &e.api, e.dir.path(), e.script, &[]);
    let b = start_node(nb, &e.fxs[1], &e.api, e.dir.path(), e.script, &[]);
    let mut vswitchds = Vec::new();
    for n in [&a, &b] {
        n.wait("active and ready", Duration::from_secs(120), |s| {
            s["generation"].as_u64().unwrap_or(0) >= 1
        })
        .await;
        vswitchds.push(VSwitchd::start(&n.node).unwrap());
    }
    for (i, n) in [&a, &b].iter().enumerate() {
        overlay::add_pod(&n.node, "pod0", &format!("{}/24", pod(i))).unwrap();
    }
    connect(&a, &b);
    for (n, other) in [(&a, &b), (&b, &a)] {
        let name = Tunnel::to(&other.node, 0).name;
        overlay::split_horizon_ovn_option(&n.node, "pod0", &[&name]).unwrap();
    }
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
        nodes: vec![a, b],
        _vswitchds: vswitchds,
        e,
        baselines,
        log_from: vec![0, 0],
    };
    let mut rows = Vec::new();
    for (index, (i, victim)) in faults(seed, rounds).into_iter().enumerate() {
        let row = world.inject(index, i, victim, seed).await;
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
