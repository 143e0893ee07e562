//! The lab's run: the whole IPsec lifecycle on simulated nodes, each step
//! printed as it happens and checked, the [`Summary`] rewritten after each.
//!
//! enable → identities issued → guards armed → runtime up → NB and SB true
//! → tunnels gain intent → IKE and CHILD SAs between every pair → pod
//! traffic encrypted (underlay: ESP only) → one IKE+CHILD negotiation
//! measured → a renewal while traffic runs → one agent actor's process
//! killed and recovered → disable → the node-by-node cleanup rollout →
//! `Disabled` → plaintext again → every namespace checked for leftover
//! project state (none) and foreign state (untouched). A probe stream per
//! pod pair runs from before enable to after `Disabled`.
//!
//! A step fails on what would be a fault in a cluster (no SA, plaintext on
//! the wire while enabled, not `Disabled`, state left behind); lost echoes
//! are reported per phase for the operator and the tests to judge.

// The lab drives real processes in real time: blocking waits and
// wall-clock deadlines belong to the driver, outside any actor.
#![allow(clippy::disallowed_methods)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use apiserver::kube_ovn::{self, CniNode, InitReport, Shape};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, Receipt, ReleaseReceipt};
use kube_ovn_ipsec_api::names::{k8s, ovs};
use kube_ovn_ipsec_api::signed;
use kube_ovn_ipsec_api::strongswan::{ConnDirection, MonitorConn};
use testbed::ipsec::IpsecNode;
use testbed::overlay::{self, Capture, CaptureSummary, VSwitchd};
use testbed::probe::{ProbeStream, unix_now};

use crate::cluster::{Binaries, ControlPlane};
use crate::emulated_ovn_controller::{self as ovn, POD_PORT};
use crate::node::{SimNode, rss_kib};
use crate::state::NETNS_PREFIX;
use crate::summary::{Failure, NodeRow, PairRow, PhaseLoss, StepTime, Summary, is_window};
use kube_ovn_ipsec_api::datapath::PeerState;

/// The template hash of the cleanup shape the lab rolls out on disable.
const CLEANUP_HASH: &str = "4c1ea9b70";

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated nodes (at least 2).
    pub nodes: usize,
    /// The certificate lifetime the agents ask for, seconds (Kubernetes'
    /// floor is 600; renewal falls at 40–60 % of it).
    pub certificate_lifetime: u32,
    /// The probe streams' interval.
    pub probe_interval: Duration,
    /// Which kernel runs the nodes, as printed.
    pub kernel: String,
    /// Where the lab's files go.
    pub dir: PathBuf,
    /// Where the operator finds the logs of a failed run: `dir`, or in the
    /// guest the host's lab directory they are copied to.
    pub logs: PathBuf,
}

/// Where a run's progress goes.
pub trait Report {
    /// One progress line, as it happens.
    fn line(&mut self, line: &str);
    /// The summary so far (after every step).
    fn status(&mut self, summary: &Summary);
}

/// A failed step's reason.
#[derive(Debug)]
struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

type Step<T = ()> = Result<T, Fail>;

fn fail<T>(why: impl Into<String>) -> Step<T> {
    Err(Fail(why.into()))
}

/// Pod `i`'s address.
pub fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, u8::try_from(i + 1).unwrap_or(u8::MAX))
}

/// The run in progress: the clock, the report, the summary.
struct Run<'a> {
    t0: Instant,
    report: &'a mut dyn Report,
    summary: Summary,
    /// (phase, start as Unix seconds), in order.
    phases: Vec<(String, f64)>,
}

impl Run<'_> {
    fn line(&mut self, step: &str, node: &str, detail: impl std::fmt::Display) {
        let l = format!(
            "[{:>6.1}s] {step:<18} {node:<8} {detail}",
            self.t0.elapsed().as_secs_f64()
        );
        self.report.line(&l);
    }

    fn begin(&mut self, step: &str) {
        self.summary.step = step.to_string();
        self.report.status(&self.summary);
    }

    fn done(&mut self, step: &str) {
        self.summary.steps.push(StepTime {
            step: step.to_string(),
            at_s: self.t0.elapsed().as_secs_f64(),
        });
        self.report.status(&self.summary);
    }

    fn phase(&mut self, name: &str) {
        self.phases.push((name.to_string(), unix_now()));
    }

    fn secs(&self) -> f64 {
        (self.t0.elapsed().as_secs_f64() * 10.0).round() / 10.0
    }
}

/// Everything the run keeps alive until its end.
struct World {
    // Field order is drop order: the probes, then ovs-vswitchd before its
    // database, the nodes, the control plane.
    probes: Vec<ProbeStream>,
    _vswitchds: Vec<VSwitchd>,
    nodes: Vec<SimNode>,
    cp: ControlPlane,
    pairs: Vec<(usize, usize)>,
    before: Vec<String>,
    bins: Binaries,
    monitor: PathBuf,
    lifetime: u32,
    /// Each agent's first generation (renewal is a later one).
    issued_generation: Vec<u64>,
    _mesh: testbed::ipsec::Mesh,
}

/// Runs the lifecycle; the summary says how far it got and, if it
/// stopped, which step failed and why.
pub async fn run(opts: &Options, bins: &Binaries, report: &mut dyn Report) -> Summary {
    let mut run = Run {
        t0: Instant::now(),
        report,
        summary: Summary {
            kernel: opts.kernel.clone(),
            ..Summary::default()
        },
        phases: Vec::new(),
    };
    let mut world = None;
    let outcome = lifecycle(&mut run, opts, bins, &mut world).await;
    if let Some(w) = &mut world {
        tally(&mut run, w);
    }
    match outcome {
        Ok(()) => {
            run.summary.finished = true;
            run.summary.step = "done".into();
        }
        Err(Fail(reason)) => {
            let step = run.summary.step.clone();
            run.line(&step, "-", format!("FAILED: {reason}"));
            if world.is_some() {
                run.line(
                    &step,
                    "-",
                    format!("logs and diagnostics under {}", opts.logs.display()),
                );
            }
            run.summary.failed = Some(Failure { step, reason });
        }
    }
    run.report.status(&run.summary);
    // The nodes' daemon logs live in their own (temporary) directories:
    // copied beside the agent's, where the operator is pointed.
    if let Some(w) = &world {
        for n in &w.nodes {
            for log in [
                "run/charon.log",
                "starter.out",
                "run/ovs-monitor-ipsec.log",
                "ovs-monitor-ipsec.out",
                "ovs-vswitchd.log",
            ] {
                let name = log.rsplit('/').next().unwrap_or(log);
                let _ = std::fs::copy(n.node.dir().join(log), n.dir().join(name));
            }
        }
    }
    // Stop the probes before the nodes go.
    if let Some(w) = &mut world {
        for p in w.probes.drain(..) {
            p.stop();
        }
    }
    run.summary
}

async fn lifecycle(
    run: &mut Run<'_>,
    opts: &Options,
    bins: &Binaries,
    world: &mut Option<World>,
) -> Step {
    if opts.nodes < 2 {
        return fail("the lab needs at least 2 nodes");
    }
    run.line("kernel", "-", &opts.kernel);

    run.begin("control plane");
    let cp = ControlPlane::start(&opts.dir, opts.nodes).await?;
    run.line(
        "control plane",
        "-",
        format!(
            "API server {} with RBAC, DaemonSet {}, {} Nodes and CNI Pods; OVN NB/SB and ovn-northd",
            cp.api.addr(),
            kube_ovn::DAEMON_SET,
            cp.nodes.len()
        ),
    );
    run.done("control plane");

    run.begin("nodes");
    let chassis: Vec<&str> = cp.nodes.iter().map(|c| c.chassis.as_str()).collect();
    let mut mesh = IpsecNode::mesh(NETNS_PREFIX, &chassis)?;
    let monitor = testbed::ipsec::patched_monitor_script(&opts.dir)?.to_path_buf();
    let mut nodes = Vec::new();
    let mut before = Vec::new();
    let mut vswitchds = Vec::new();
    for (i, node) in std::mem::take(&mut mesh.nodes).into_iter().enumerate() {
        node.install_foreign_xfrm()?;
        before.push(node.xfrm_dump()?);
        let sim = SimNode::prepare(node, &opts.dir)?;
        vswitchds.push(VSwitchd::start(&sim.node)?);
        overlay::add_pod(&sim.node, POD_PORT, &format!("{}/24", pod_ip(i)))?;
        run.line(
            "nodes",
            &cp.nodes[i].name,
            format!(
                "netns {}, underlay {}, ovsdb-server + ovs-vswitchd (kernel datapath), pod {}; foreign XFRM installed",
                sim.node.netns().name(),
                sim.node.ip(),
                pod_ip(i)
            ),
        );
        nodes.push(sim);
    }
    let n = nodes.len();
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    run.summary.nodes = cp
        .nodes
        .iter()
        .map(|c| NodeRow {
            name: c.name.clone(),
            chassis: c.chassis.clone(),
            phase: "-".into(),
            ..NodeRow::default()
        })
        .collect();
    run.summary.pairs = pairs
        .iter()
        .map(|&(a, b)| PairRow {
            a,
            b,
            ..PairRow::default()
        })
        .collect();
    *world = Some(World {
        cp,
        nodes,
        _vswitchds: vswitchds,
        probes: Vec::new(),
        pairs,
        before,
        bins: bins.clone(),
        monitor,
        lifetime: opts.certificate_lifetime,
        issued_generation: vec![0; n],
        _mesh: mesh,
    });
    let Some(w) = world.as_mut() else {
        return fail("the lab's world is gone");
    };
    run.done("nodes");

    plaintext_overlay(run, w, opts.probe_interval)?;
    enable(run, w).await?;
    encrypted(run, w)?;
    datapath(run, w).await?;
    negotiation(run, w)?;
    renewal(run, w).await?;
    actor_kill(run, w).await?;
    disable(run, w).await?;
    leftovers(run, w)?;
    Ok(())
}

/// The overlay before any IPsec: plain tunnels, every pair answering, the
/// probe streams started.
fn plaintext_overlay(run: &mut Run<'_>, w: &mut World, interval: Duration) -> Step {
    run.begin("plaintext overlay");
    ovn::plain_mesh(&w.nodes)?;
    let windows = first_replies(&w.nodes, &w.pairs, Duration::from_secs(90));
    for (win, &(a, b)) in windows.iter().zip(&w.pairs) {
        match win {
            Some(d) => run.line(
                "plaintext overlay",
                &format!("{a}<->{b}"),
                format!("first reply after {} ms", d.as_millis()),
            ),
            None => return fail(format!("pod {a} gets no reply from pod {b} in 90 s")),
        }
    }
    for &(a, b) in &w.pairs {
        w.probes.push(ProbeStream::start(
            w.nodes[a].node.netns(),
            pod_ip(b),
            interval,
        )?);
    }
    run.phase("before enable");
    run.line(
        "probes",
        "-",
        format!(
            "a ping stream per pod pair every {} ms, from now to after Disabled",
            interval.as_millis()
        ),
    );
    run.done("plaintext overlay");
    Ok(())
}

/// Agents, controller, the barriers, the flip, intent, SAs, `Enabled`.
async fn enable(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("enable");
    for (i, sim) in w.nodes.iter_mut().enumerate() {
        sim.start_agent(
            &w.bins.agent,
            &w.cp.nodes[i],
            &w.cp.api,
            &w.monitor,
            w.lifetime,
        )?;
    }
    run.line(
        "enable",
        "-",
        format!(
            "agents started (kube-ovn-ipsec run, certificate lifetime {} s); controller started with enable-ipsec=true",
            w.lifetime
        ),
    );
    w.cp.start_controller(&w.bins.controller, true)?;
    let n = w.nodes.len();
    let (mut issued, mut armed, mut up) = (vec![false; n], vec![false; n], vec![false; n]);
    let mut last_phase = None;
    let mut nb_seen = false;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(r) = w.cp.record().await?
            && last_phase != Some(r.phase)
        {
            run.line("record", "-", r.phase);
            if matches!(r.phase, CoordinationPhase::Prepare | CoordinationPhase::Arm) {
                run.phase(r.phase.as_str());
            }
            last_phase = Some(r.phase);
        }
        for i in 0..n {
            let Some(s) = w.nodes[i].status().await else {
                continue;
            };
            let name = w.cp.nodes[i].name.clone();
            if !issued[i] && s.generation.is_some() {
                issued[i] = true;
                w.issued_generation[i] = s.generation.unwrap_or_default();
                run.line(
                    "identity issued",
                    &name,
                    format!(
                        "generation {}, expires {}",
                        s.generation.unwrap_or_default(),
                        s.expires.map(|e| e.to_string()).unwrap_or_default()
                    ),
                );
            }
            if !armed[i] && s.protection_armed {
                armed[i] = true;
                let lease = w.nodes[i]
                    .lease()
                    .map(|(m, r)| format!("lease mark {m:#x} reqid {r} published"))
                    .unwrap_or_default();
                run.line("guards armed", &name, lease);
            }
            if !up[i] && s.runtime_healthy {
                up[i] = true;
                run.line(
                    "runtime up",
                    &name,
                    "strongSwan and ovs-monitor-ipsec healthy",
                );
            }
            update_row(&mut run.summary.nodes[i], &s);
        }
        let (nb, sb) = nb_sb(&w.cp);
        // SB true implies NB was: a read of NB that failed under load must
        // not skip the check.
        if (nb || sb) && !nb_seen {
            nb_seen = true;
            if let Some(i) = armed.iter().position(|a| !a) {
                return fail(format!(
                    "NB_Global.ipsec turned true while {} was not armed",
                    w.cp.nodes[i].name
                ));
            }
            run.line(
                "NB true",
                "-",
                "every node armed: the controller flipped NB_Global.ipsec",
            );
        }
        if sb {
            run.phase("enable flip");
            run.line("SB true", "-", "ovn-northd copied it to SB_Global.ipsec");
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "SB_Global.ipsec not true in 600 s (record {last_phase:?}); see controller.log and each node's agent.log"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.done("enable");

    run.begin("intent");
    let flipped = Instant::now();
    for i in 0..n {
        if !ovn::give_intent(&w.nodes, &w.nodes[i])? {
            return fail(format!(
                "{} has no lease published at the flip",
                w.cp.nodes[i].name
            ));
        }
    }
    for i in 0..n {
        let j = (i + 1) % n;
        let opts = ovn::tunnel_options(&w.nodes[i], &w.nodes[j])?;
        for key in [
            ovs::OPTION_REMOTE_NAME,
            ovs::OPTION_IPSEC_MARK_OUT,
            ovs::OPTION_IPSEC_REQID,
        ] {
            if !opts.contains(key) {
                return fail(format!(
                    "{}'s tunnel {} lacks {key}: {opts}",
                    w.cp.nodes[i].name,
                    ovn::tunnel_name(&w.nodes[j])
                ));
            }
        }
        run.line(
            "tunnels",
            &w.cp.nodes[i].name.clone(),
            format!("emulated ovn-controller gave intent: {opts}"),
        );
    }
    run.done("intent");

    run.begin("SAs");
    let windows = pair_windows(
        run,
        w,
        "enable window",
        Duration::from_secs(300),
        "encrypted",
        "intent",
    )?;
    for (k, &ms) in windows.iter().enumerate() {
        let (a, b) = w.pairs[k];
        run.summary.pairs[k].enable_window_ms = Some(ms);
        for x in [a, b] {
            let row = &mut run.summary.nodes[x];
            row.enable_window_ms = Some(row.enable_window_ms.map_or(ms, |m| m.max(ms)));
        }
    }
    let want = lease_sas_want(n);
    // Under emulation a pair may negotiate twice (both ends ACQUIRE) and
    // settle later: wait for every node at once.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counts: Vec<u32> = w.nodes.iter().map(lease_sas).collect();
        if counts.iter().all(|&c| c >= want) {
            for (i, c) in counts.iter().enumerate() {
                run.summary.nodes[i].sas = Some(*c);
                let ike = w.nodes[i]
                    .node
                    .ike_sas()
                    .map(|v| v.iter().filter(|s| s.state == "ESTABLISHED").count())
                    .unwrap_or(0);
                run.line(
                    "SAs",
                    &w.cp.nodes[i].name.clone(),
                    format!("{ike} IKE_SAs established, {c} ESP SAs of its lease in the kernel"),
                );
            }
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "ESP SAs of the leases per node {counts:?}, want {want} each (one in, one out per peer)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.summary.figures.up_to_sas_s = Some(run.secs());
    let deadline = Instant::now() + Duration::from_secs(120);
    while w.cp.record().await?.map(|r| r.phase) != Some(CoordinationPhase::Enabled) {
        if Instant::now() > deadline {
            return fail("the coordination record did not reach Enabled within 120 s of the SAs");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    run.phase("Enabled");
    run.summary.figures.up_to_enabled_s = Some(run.secs());
    run.line(
        "Enabled",
        "-",
        format!(
            "coordination Enabled; {:.1} s from the flip",
            flipped.elapsed().as_secs_f64()
        ),
    );
    refresh_rows(run, w).await;
    run.done("SAs");
    Ok(())
}

/// Every node's pod pings every other while its underlay is captured:
/// replies, ESP on the wire, no plaintext Geneve.
fn encrypted(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("encrypted");
    wire_check(run, w, "encrypted", true)?;
    run.done("encrypted");
    Ok(())
}

/// Every agent's own view of its data path (SPEC §10): `datapathHealthy`,
/// every peer `Healthy` from its SA counters, the MTU check passed, and
/// `ovs-appctl -t <agent ctl> ipsec/show` answering over the real socket.
async fn datapath(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("data path");
    let peers = w.nodes.len() - 1;
    for (i, node) in w.nodes.iter().enumerate() {
        let name = w.cp.nodes[i].name.clone();
        // Two samples (4 s) after the SAs carry the probes; slack for TCG.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let s = node.status().await;
            if let Some(s) = &s
                && s.datapath_healthy == Some(true)
                && s.peers.len() == peers
                && s.peers.iter().all(|p| p.state == PeerState::Healthy)
            {
                break s.clone();
            }
            if Instant::now() > deadline {
                let seen = s.map(|s| {
                    s.peers
                        .iter()
                        .map(|p| format!("{} {}", p.peer, p.state))
                        .collect::<Vec<_>>()
                });
                return fail(format!(
                    "{name}: the agent does not report every peer Healthy within 30 s: {seen:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let out = std::process::Command::new("ovs-appctl")
            .arg("-t")
            .arg(node.ctl_socket())
            .arg("ipsec/show")
            .output();
        let show = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            Ok(o) => {
                return fail(format!(
                    "{name}: ovs-appctl ipsec/show: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return fail(format!("{name}: running ovs-appctl: {e}")),
        };
        if !show.contains("datapath: healthy") {
            return fail(format!(
                "{name}: ipsec/show disagrees with /status:\n{show}"
            ));
        }
        let mtu = status.mtu.map_or_else(
            || "MTU not checked".to_string(),
            |m| format!("MTU {} fits (max {})", m.tunnel, m.max_tunnel),
        );
        run.line(
            "data path",
            &name,
            format!("{peers} peers Healthy; {mtu}; ipsec/show answers"),
        );
    }
    run.done("data path");
    Ok(())
}

/// Every node's pod pings every other while its underlay is captured
/// (into `<step>.pcap`): every echo answered but the last in flight, and
/// only ESP (`esp`) or only plaintext Geneve on the wire.
fn wire_check(run: &mut Run<'_>, w: &World, step: &str, esp: bool) -> Step {
    let (want, other) = if esp {
        ("ESP", "plaintext Geneve")
    } else {
        ("plaintext Geneve", "ESP")
    };
    for i in 0..w.nodes.len() {
        let pcap = format!("{}.pcap", step.replace(' ', "-"));
        let (answered, sent, wire) = ping_peers_captured(&w.nodes, i, &pcap)?;
        let (wanted, unwanted) = if esp {
            (wire.esp, wire.geneve)
        } else {
            (wire.geneve, wire.esp)
        };
        run.line(
            step,
            &w.cp.nodes[i].name,
            format!("{answered}/{sent} answered; underlay: {wanted} {want}, {unwanted} {other}"),
        );
        if unwanted > 0 || wanted == 0 || answered + 1 < sent {
            return fail(format!(
                "{}: {answered}/{sent} answered, underlay {wire:?} (want {want} only)",
                w.cp.nodes[i].name
            ));
        }
    }
    Ok(())
}

/// One IKE_SA + CHILD_SA negotiation: node 0's IKE_SA with node 1 taken
/// down, then both of the tunnel's connections brought up by name (`ipsec
/// up`, no trap or ACQUIRE in the way), timed to the first reply across
/// the pair. The scale the enable windows are read against.
fn negotiation(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("negotiation");
    run.phase("negotiation");
    let tunnel = ovn::tunnel_name(&w.nodes[1]);
    let mut measured = None;
    // A renewal or a slow guest can leave the pair mid-change when the
    // step starts (the IKE_SA being replaced, or the connections of two
    // versions loaded at once): each try reads afresh what charon holds.
    for attempt in 1..=NEGOTIATION_TRIES {
        match negotiate_once(&w.nodes[0], &tunnel) {
            Ok(ms) => {
                measured = Some(ms);
                break;
            }
            Err(why) => run.line(
                "negotiation",
                "0<->1",
                format!("try {attempt}/{NEGOTIATION_TRIES}: {why}"),
            ),
        }
    }
    let Some(ms) = measured else {
        return fail(format!(
            "no IKE_SA + CHILD_SA negotiation of node 0 with node 1 measured in {NEGOTIATION_TRIES} tries"
        ));
    };
    run.summary.figures.negotiation_ms = Some(ms);
    run.line(
        "negotiation",
        "0<->1",
        format!(
            "IKE_SA taken down, both connections brought up by name: first reply {ms} ms later (IKE_SA + 2 CHILD_SAs)"
        ),
    );
    // Let the other direction settle before the renewal's phase starts.
    let want = lease_sas_want(w.nodes.len());
    let _ = testbed::netns::wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
        w.nodes.iter().all(|n| lease_sas(n) >= want).then_some(())
    });
    run.done("negotiation");
    Ok(())
}

/// How often the negotiation step tries before it fails the lab.
const NEGOTIATION_TRIES: u32 = 3;

/// One timed negotiation of `node` over `tunnel`: the ESTABLISHED IKE_SAs
/// charon holds for the tunnel taken down by unique id, then the newest
/// version's connections brought up by name; the time to the first reply.
/// Why a try measured nothing, as an error.
fn negotiate_once(node: &SimNode, tunnel: &str) -> Result<u64, String> {
    let prefix = format!("{tunnel}-");
    // The tunnel's IKE_SAs, those ESTABLISHED only or in any state.
    let held = |n: &SimNode, established: bool| -> Vec<(String, u32)> {
        n.node
            .ike_sas()
            .unwrap_or_default()
            .into_iter()
            .filter(|sa| {
                sa.conn.starts_with(&prefix) && (!established || sa.state == "ESTABLISHED")
            })
            .map(|sa| (sa.conn, sa.unique_id))
            .collect()
    };
    // By unique id, not by connection name: which of the tunnel's
    // connections names the IKE_SA depends on the order they were loaded
    // in, which a monitor restart or a renewal changes.
    let Some(ikes) =
        testbed::netns::wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
            let e = held(node, true);
            (!e.is_empty()).then_some(e)
        })
    else {
        return Err(format!("no ESTABLISHED IKE_SA for {tunnel} within 30 s"));
    };
    let routed = node.node.routed_conns().map_err(|e| e.to_string())?;
    let (Some(conn_in), Some(conn_out)) = (
        newest_conn(&routed, tunnel, ConnDirection::In),
        newest_conn(&routed, tunnel, ConnDirection::Out),
    ) else {
        return Err(format!("no routed connections for {tunnel}: {routed:?}"));
    };
    // Not blocking: a delete the peer does not answer (it may be deleting
    // the same IKE_SA) would hold a blocking `ipsec down` through every
    // retransmit. The wait below is what tells: the IKE_SAs gone in any
    // state, their CHILD_SAs with them.
    for (conn, id) in &ikes {
        node.node
            .ipsec(&["stroke", "down-nb", &format!("{conn}[{id}]")])
            .map_err(|e| format!("`ipsec stroke down-nb {conn}[{id}]`: {e}"))?;
    }
    let gone =
        testbed::netns::wait_for(Duration::from_secs(15), Duration::from_millis(100), || {
            let now = held(node, false);
            (!ikes.iter().any(|sa| now.contains(sa))).then_some(())
        });
    if gone.is_none() {
        return Err(format!(
            "IKE_SAs {ikes:?} still held 15 s after `ipsec down`"
        ));
    }
    let start = std::time::Instant::now();
    for conn in [&conn_out, &conn_in] {
        // `ipsec up` waits for the outcome; a CHILD_SA the trap set up
        // meanwhile makes it a no-op, not a failed try.
        let _ = node.node.ipsec(&["up", conn]);
    }
    let up = start.elapsed();
    let left = Duration::from_secs(60).saturating_sub(up);
    let Some(d) = overlay::first_reply(node.node.netns(), pod_ip(1), left) else {
        return Err(format!(
            "no reply from pod 1 within 60 s of `ipsec up {conn_out}`"
        ));
    };
    Ok(u64::try_from((up + d).as_millis()).unwrap_or(u64::MAX))
}

/// The routed connection of `tunnel` in direction `dir` (`in`, `out`)
/// with the highest version: during a renewal the monitor loads the new
/// version beside the old one.
fn newest_conn(routed: &[String], tunnel: &str, dir: ConnDirection) -> Option<String> {
    routed
        .iter()
        .filter_map(|c| {
            let parsed = MonitorConn::parse(c)?;
            (parsed.tunnel == tunnel && parsed.direction == dir).then_some((parsed.version, c))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, c)| c.clone())
}

/// Waits for every agent to renew its certificate (a new generation)
/// while the probes run.
async fn renewal(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("renewal");
    run.phase("renewal");
    let started = unix_now();
    let n = w.nodes.len();
    let mut renewed = vec![false; n];
    let mut renewed_before = vec![false; n];
    for (i, (r, before)) in renewed
        .iter_mut()
        .zip(renewed_before.iter_mut())
        .enumerate()
    {
        // A renewal that fell before this step (it is timed from the
        // certificate, not from the lab) still counts; its echoes are in
        // the phase it fell in.
        if let Some(g) = w.nodes[i].status().await.and_then(|s| s.generation)
            && g > w.issued_generation[i]
        {
            *r = true;
            *before = true;
            run.line(
                "renewal",
                &w.cp.nodes[i].name.clone(),
                format!("already renewed before this step (generation {g})"),
            );
        }
    }
    // The renewal point is 40–60 % of the whole validity, which starts
    // LEAF_BACKDATE before the signing.
    let backdate = kube_ovn_ipsec_api::pki::LEAF_BACKDATE.as_secs();
    let latest = (u64::from(w.lifetime) + backdate) * 6 / 10 - backdate;
    let deadline = Instant::now() + Duration::from_secs(latest + 120);
    run.line(
        "renewal",
        "-",
        format!(
            "waiting for every agent's renewal (at 40–60 % of its {} s certificate)",
            w.lifetime
        ),
    );
    while renewed.iter().any(|r| !r) {
        for (i, done) in renewed.iter_mut().enumerate() {
            if *done {
                continue;
            }
            if let Some(s) = w.nodes[i].status().await {
                if s.generation.is_some_and(|g| g > w.issued_generation[i])
                    && s.configuration_applied
                {
                    *done = true;
                    run.line(
                        "renewal",
                        &w.cp.nodes[i].name.clone(),
                        format!(
                            "generation {} active, expires {}",
                            s.generation.unwrap_or_default(),
                            s.expires.map(|e| e.to_string()).unwrap_or_default()
                        ),
                    );
                }
                update_row(&mut run.summary.nodes[i], &s);
            }
        }
        if Instant::now() > deadline {
            return fail("not every agent renewed its certificate in time; see agent.log");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Echoes sent just before the last renewal need a few seconds to be judged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ended = unix_now();
    let lost: u32 = w
        .probes
        .iter()
        .map(|p| p.log().tally(started, ended).lost)
        .sum();
    run.summary.figures.renewal_lost = Some(lost);
    let early = renewed_before.iter().filter(|b| **b).count();
    run.summary.figures.renewed_before_step = u32::try_from(early).unwrap_or(u32::MAX);
    run.line(
        "renewal",
        "-",
        if early == 0 {
            format!("every agent renewed; {lost} echoes lost across it")
        } else {
            format!(
                "every agent renewed; {lost} echoes lost in this step; {early} renewal(s) fell \
                 before it, their losses are in the phases they fell in"
            )
        },
    );
    refresh_rows(run, w).await;
    run.done("renewal");
    Ok(())
}

/// Kills one agent's ovs-monitor-ipsec (the monitor actor's process) and
/// waits for the agent to restart it and be healthy again.
async fn actor_kill(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("actor kill");
    run.phase("actor kill");
    let i = w.nodes.len() - 1;
    let name = w.cp.nodes[i].name.clone();
    let Some(pid) = w.nodes[i].monitor_pid() else {
        return fail(format!("{name}: no ovs-monitor-ipsec under its agent"));
    };
    let t = Instant::now();
    let raw = i32::try_from(pid).unwrap_or(0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    run.line(
        "actor kill",
        &name,
        format!("SIGKILL to ovs-monitor-ipsec (PID {pid}), the monitor actor's process"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen_unhealthy = false;
    loop {
        let s = w.nodes[i].status().await;
        let healthy = s
            .as_ref()
            .is_some_and(|s| s.runtime_healthy && s.configuration_applied);
        seen_unhealthy |= !healthy;
        let restarted = w.nodes[i].monitor_pid().is_some_and(|p| p != pid);
        if restarted && healthy {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "{name}: the agent did not restart ovs-monitor-ipsec and report healthy in 120 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let secs = (t.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    run.summary.figures.actor_recovery_s = Some(secs);
    run.line(
        "actor recovered",
        &name,
        format!(
            "new ovs-monitor-ipsec, runtime healthy and configuration applied after {secs} s{}",
            if seen_unhealthy {
                " (reported unhealthy meanwhile)"
            } else {
                ""
            }
        ),
    );
    refresh_rows(run, w).await;
    run.done("actor kill");
    Ok(())
}

/// The operator turns IPsec off: NB/SB off, intent removed, the disable
/// window, the node-by-node cleanup rollout, release receipts, `Disabled`,
/// plaintext again.
async fn disable(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("disable");
    let t = Instant::now();
    w.cp.start_controller(&w.bins.controller, false)?;
    run.line(
        "disable",
        "-",
        "controller restarted with enable-ipsec=false",
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last_phase = None;
    loop {
        if let Some(r) = w.cp.record().await?
            && last_phase != Some(r.phase)
        {
            run.line("record", "-", r.phase);
            last_phase = Some(r.phase);
        }
        if nb_sb(&w.cp) == (false, false) {
            break;
        }
        if Instant::now() > deadline {
            return fail("NB and SB ipsec not off within 180 s of the intent");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    run.phase("disable flip");
    run.line(
        "NB and SB off",
        "-",
        "the controller turned NB_Global.ipsec off",
    );
    for i in 0..w.nodes.len() {
        ovn::take_intent(&w.nodes, &w.nodes[i])?;
    }
    run.line(
        "tunnels",
        "-",
        "emulated ovn-controller removed intent and marks together",
    );
    let windows = pair_windows(
        run,
        w,
        "disable window",
        Duration::from_secs(120),
        "plaintext",
        "intent removed",
    )?;
    for (k, ms) in windows.into_iter().enumerate() {
        run.summary.pairs[k].disable_window_ms = Some(ms);
    }
    run.done("disable");

    run.begin("cleanup rollout");
    run.phase("cleanup rollout");
    kube_ovn::set_template(&w.cp.admin, &w.cp.ds_uid, Shape::Cleanup, CLEANUP_HASH).await?;
    run.line(
        "cleanup rollout",
        "-",
        "DaemonSet template: ipsec container replaced by the ipsec-cleanup init container (maxUnavailable 1)",
    );
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        let t_node = Instant::now();
        w.nodes[i].stop_agent();
        let cni: &mut CniNode = &mut w.cp.nodes[i];
        kube_ovn::replace_pod(
            &w.cp.api,
            &w.cp.admin,
            &w.cp.ds_uid,
            cni,
            i,
            Shape::Cleanup,
            CLEANUP_HASH,
        )
        .await?;
        kube_ovn::set_cleanup_init(&w.cp.admin, &cni.pod_name, InitReport::Running).await?;
        let (code, message) = w.nodes[i].run_cleanup(&w.bins.agent, cni, &w.cp.api, 180)?;
        kube_ovn::set_cleanup_init(
            &w.cp.admin,
            &cni.pod_name,
            InitReport::Terminated {
                exit_code: code,
                message: &message,
            },
        )
        .await?;
        run.summary.nodes[i].phase = if code == 0 {
            "cleaned"
        } else {
            "cleanup-failed"
        }
        .into();
        run.summary.nodes[i].sas = Some(lease_sas(&w.nodes[i]));
        run.summary.nodes[i].guards = Some(false);
        run.line(
            "cleanup",
            &name,
            format!(
                "agent stopped, Pod replaced, kube-ovn-ipsec cleanup exited {code} after {:.1} s",
                t_node.elapsed().as_secs_f64()
            ),
        );
        if code != 0 {
            return fail(format!(
                "{name}: kube-ovn-ipsec cleanup exited {code}: {message}"
            ));
        }
        run.summary.nodes[i].receipt = receipt_of(&w.cp, &name).await;
        run.report.status(&run.summary);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let phase = w.cp.record().await?.map(|r| r.phase);
        if phase == Some(CoordinationPhase::Disabled) {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "not Disabled within 180 s of the rollout (record {phase:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Echoes of the rollout's last moments, judged before the phase ends.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.phase("Disabled");
    let secs = (t.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    run.summary.figures.disable_s = Some(secs);
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        run.summary.nodes[i].receipt = receipt_of(&w.cp, &name).await;
        run.line(
            "release receipt",
            &name,
            run.summary.nodes[i]
                .receipt
                .clone()
                .unwrap_or_else(|| "none".into()),
        );
    }
    run.line(
        "Disabled",
        "-",
        format!("coordination Disabled {secs} s after the intent"),
    );
    run.done("cleanup rollout");

    run.begin("plaintext again");
    wire_check(run, w, "plaintext again", false)?;
    run.done("plaintext again");
    Ok(())
}

/// Every node's XFRM byte-identical to before its agent first ran (the
/// foreign state kept, nothing of the project's left), no project keys in
/// OVSDB, no strongSwan or monitor left running.
fn leftovers(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("leftovers");
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        let n = &w.nodes[i];
        let now = n.node.xfrm_dump()?;
        if now != w.before[i] {
            return fail(format!(
                "{name}: XFRM differs from before its agent first ran:\n--- before\n{}\n--- now\n{now}",
                w.before[i]
            ));
        }
        let ids = n
            .node
            .vsctl(&["get", "Open_vSwitch", ".", "external_ids"])?;
        if let Some(k) = ovs::PROTECTION_KEYS.iter().find(|k| ids.contains(*k)) {
            return fail(format!("{name}: OVSDB still has {k}: {ids}"));
        }
        if n.node.run_path("charon.pid").exists() || n.node.run_path("starter.charon.pid").exists()
        {
            return fail(format!(
                "{name}: strongSwan's pid files are left in its /run"
            ));
        }
        run.line(
            "leftovers",
            &name,
            "XFRM identical to before (foreign policies and SAs untouched), no lease in OVSDB, no IKE daemon",
        );
    }
    run.done("leftovers");
    Ok(())
}

/// Losses per phase and per pair from the probe streams, into the summary.
fn tally(run: &mut Run<'_>, w: &World) {
    let phases: Vec<(&str, f64)> = run.phases.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    if phases.is_empty() || w.probes.is_empty() {
        return;
    }
    let logs: Vec<_> = w.probes.iter().map(ProbeStream::log).collect();
    let mut per_phase: Vec<PhaseLoss> = phases
        .iter()
        .map(|(name, _)| PhaseLoss {
            phase: (*name).to_string(),
            window: is_window(name),
            ..PhaseLoss::default()
        })
        .collect();
    for row in &mut run.summary.nodes {
        row.lost = 0;
    }
    for (k, log) in logs.iter().enumerate() {
        for (slot, (_, t)) in per_phase.iter_mut().zip(log.losses(&phases)) {
            slot.sent += t.sent;
            slot.lost += t.lost;
        }
        let total = log.total();
        let (a, b) = w.pairs[k];
        run.summary.pairs[k].sent = total.sent;
        run.summary.pairs[k].lost = total.lost;
        run.summary.nodes[a].lost += total.lost;
        run.summary.nodes[b].lost += total.lost;
    }
    run.summary.phases = per_phase;
}

/// Each node's row from its agent and kernel now.
async fn refresh_rows(run: &mut Run<'_>, w: &World) {
    for i in 0..w.nodes.len() {
        if let Some(s) = w.nodes[i].status().await {
            update_row(&mut run.summary.nodes[i], &s);
        }
        let row = &mut run.summary.nodes[i];
        row.sas = Some(lease_sas(&w.nodes[i]));
        // The last measurement stands: a process restarting at this very
        // moment (a renewal's monitor restart, the actor-kill step) has no
        // resident set to read, which says nothing about what it used.
        if let Some(kib) = w.nodes[i].agent_pid().and_then(rss_kib) {
            row.agent_rss_kib = Some(kib);
        }
        if let Some(kib) = w.nodes[i].monitor_pid().and_then(rss_kib) {
            row.monitor_rss_kib = Some(kib);
        }
        row.receipt = receipt_of(&w.cp, &w.cp.nodes[i].name).await;
    }
    tally(run, w);
    run.report.status(&run.summary);
}

fn update_row(row: &mut NodeRow, s: &kube_ovn_ipsec_api::status::Status) {
    row.phase = format!("{:?}", s.phase);
    row.generation = s.generation;
    row.expires = s.expires.map(|e| e.to_string());
    row.guards = Some(s.protection_armed);
}

/// The newest receipt on Node `name`, as far as its payload says (for
/// display only: the controller verifies them).
async fn receipt_of(cp: &ControlPlane, name: &str) -> Option<String> {
    let node = Api::<Node>::all(cp.admin.clone()).get(name).await.ok()?;
    let ann = node.metadata.annotations?;
    if let Some(r) = ann.get(k8s::ANNOTATION_RELEASE_RECEIPT) {
        return signed::decode::<ReleaseReceipt>(r)
            .ok()
            .map(|r| format!("release e{}", r.peek().epoch));
    }
    let r = ann.get(k8s::ANNOTATION_RECEIPT)?;
    signed::decode::<Receipt>(r)
        .ok()
        .map(|r| r.peek().phase.as_str().to_string())
}

/// (NB_Global.ipsec, SB_Global.ipsec) as `ovn-nbctl`/`ovn-sbctl` read them.
fn nb_sb(cp: &ControlPlane) -> (bool, bool) {
    let on = |out: Result<String, testbed::ovs::Error>| out.is_ok_and(|o| o.trim() == "true");
    (
        on(cp.central.nb.nbctl(&["get", "NB_Global", ".", "ipsec"])),
        on(cp.central.sb.sbctl(&["get", "SB_Global", ".", "ipsec"])),
    )
}

/// ESP SAs in `n`'s kernel attributed to its lease's reqid (none without
/// a lease).
fn lease_sas(n: &SimNode) -> u32 {
    let Some((_, reqid)) = n.lease() else {
        return 0;
    };
    let Ok(dump) = n.node.netns().ip(["xfrm", "state", "list"]) else {
        return 0;
    };
    let needle = format!("reqid {reqid} ");
    let count = dump
        .lines()
        .filter(|l| l.trim_start().starts_with("proto esp") && l.contains(&needle))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

fn lease_sas_want(nodes: usize) -> u32 {
    u32::try_from(2 * (nodes - 1)).unwrap_or(u32::MAX)
}

/// Each pair's window in ms, printed as `step`: from now (just after
/// `since`) to pod `b`'s first (`kind`: encrypted or plaintext) reply to
/// pod `a`; a pair with none within `limit` fails the step.
fn pair_windows(
    run: &mut Run<'_>,
    w: &World,
    step: &str,
    limit: Duration,
    kind: &str,
    since: &str,
) -> Step<Vec<u64>> {
    let mut out = Vec::new();
    let windows = first_replies(&w.nodes, &w.pairs, limit);
    for (win, &(a, b)) in windows.iter().zip(&w.pairs) {
        let Some(d) = win else {
            return fail(format!(
                "pod {a} gets no {kind} reply from pod {b} within {} s of {since}",
                limit.as_secs()
            ));
        };
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        run.line(
            step,
            &format!("{a}<->{b}"),
            format!("first {kind} reply {ms} ms after {since}"),
        );
        out.push(ms);
    }
    Ok(out)
}

/// Per pair `(a, b)`, concurrently: how long until pod `b` first answers
/// pod `a` (`None`: not within `limit`).
fn first_replies(
    nodes: &[SimNode],
    pairs: &[(usize, usize)],
    limit: Duration,
) -> Vec<Option<Duration>> {
    let probes: Vec<_> = pairs
        .iter()
        .map(|&(a, b)| (nodes[a].node.netns(), pod_ip(b)))
        .collect();
    overlay::first_replies(&probes, limit)
}

/// Node `i`'s pod pings every other node's pod 3 times while its underlay
/// is captured (into `pcap` in its directory): answered, sent, the wire.
fn ping_peers_captured(
    nodes: &[SimNode],
    i: usize,
    pcap: &str,
) -> Step<(u32, u32, CaptureSummary)> {
    let a = &nodes[i].node;
    let cap = Capture::start(a.netns(), "eth0", &nodes[i].dir().join(pcap))?;
    let (mut answered, mut sent) = (0, 0);
    for j in (0..nodes.len()).filter(|j| *j != i) {
        let s = overlay::ping(a.netns(), pod_ip(j), 3, Duration::from_millis(200))?;
        answered += s.received;
        sent += s.transmitted;
    }
    Ok((answered, sent, cap.stop()?))
}

/// The lab's files: where the run keeps its logs.
pub fn logs_hint(dir: &Path) -> String {
    format!(
        "controller: {}/controller.log; per node: {}/<chassis>/agent.log",
        dir.display(),
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::newest_conn;
    use kube_ovn_ipsec_api::strongswan::ConnDirection;

    #[test]
    fn the_newest_version_of_a_direction_is_brought_up() {
        let routed: Vec<String> = [
            "ovn-b-0-in-1",
            "ovn-b-0-out-1",
            "ovn-b-0-in-2",
            "ovn-b-0-out-2",
            "ovn-b-01-in-9",
            "ovn-b-0-in-x",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            newest_conn(&routed, "ovn-b-0", ConnDirection::In).as_deref(),
            Some("ovn-b-0-in-2")
        );
        assert_eq!(
            newest_conn(&routed, "ovn-b-0", ConnDirection::Out).as_deref(),
            Some("ovn-b-0-out-2")
        );
        assert_eq!(newest_conn(&routed, "ovn-c-0", ConnDirection::In), None);
    }
}
