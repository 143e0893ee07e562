//! The controller's cost of enabling IPsec across 1,000 nodes: the real
//! controller (in-process, coordinator on, 1 s period) against the embedded
//! API server (RBAC on) and real OVN NB/SB with ovn-northd, with 1,000
//! in-process node responders standing in for agents. Each responder holds
//! a P-256 certificate the controller issued through its Pod-bound token
//! (all issued before the measurement, by a first controller run without
//! the coordinator) and publishes a real signed receipt on its Node, with
//! that token, for each new (generation, epoch) of `Prepare`/`Arm`. One
//! shared watch of the record fans out to the responders.
//!
//! Prints the wall time from controller start to the record reading
//! `Enabled` with NB and SB true (target < 10 s), each coordination round
//! (from the Lease renewals: every round renews it), and the process's
//! peak RSS growth over the enable (target < 200 MiB). The fixture, the API
//! server and the responders live in the same process, so the growth is an
//! upper bound on the controller's own. Then, the controller stopped, it
//! takes a barrier pass apart: the two LISTs, the CSR GET per target, and
//! the controller's own judgement of every receipt.
//!
//! Baseline, measured in the same run once `Enabled` is reached (the Nodes
//! then carry their receipts, as during the barrier passes): the **pass
//! floor**, one LIST of the N Nodes and one of the N CNI Pods with the
//! controller's own token. Every coordination pass must at least list both
//! (the cohort is the DaemonSet's Pods' nodes, the receipts are on the
//! Nodes), and the enable takes at least four passes (write `Prepare`,
//! write `Arm`, set NB, write `Enabled`) with a period between each, so no
//! one-step-per-pass coordinator with this period can beat
//! `4 × floor + 3 × period`; the ratio says how far the controller is from
//! it. A client-go 5 QPS figure would mean little here: the enable makes
//! only a handful of writes, and its cost is in reads.

// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use harness::controller_cluster as common;

use harness::cohort;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::*;
use common::coordination::nb_sb;
use common::*;
use controller::coordination::evidence::{self, Answer, CsrFacts, NodeFacts, PodFacts};
use controller::coordination::machine::Verdict;
use controller::coordination::run::RECEIPT_ANNOTATION;
use controller::names::NODE_CHASSIS_ANNOTATION;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, timestamp};
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::pki::TrustBundle;
use testbed::ovs::OvnCentral;
use tokio::sync::watch;

/// What the bench saw, timed as it saw it.
#[derive(Default)]
struct Seen {
    /// Each change of the record's (phase, epoch).
    phases: Vec<(Instant, CoordinationPhase, u64)>,
    /// Each Lease write (one per coordination round), with the record's
    /// phase at that moment.
    rounds: Vec<(Instant, Option<CoordinationPhase>)>,
    /// The last `Arm` record (what the last barrier passes judged against).
    arm: Option<CoordinationRecord>,
    /// Per (epoch, phase) answered: receipts published and when the last
    /// one landed.
    receipts: BTreeMap<(u64, &'static str), (usize, Option<Instant>)>,
}

/// How long the controller's own judgement (`evidence::peek` and
/// `evidence::judge`) of every Node's receipt against `record` takes, the
/// API reads done beforehand; every verdict must be `Satisfied`, which
/// also checks that the facts below are built as the coordinator builds
/// them.
fn time_judging(
    record: &CoordinationRecord,
    trust: &TrustBundle,
    nodes: &[Node],
    pods: &[Pod],
    csrs: &[CertificateSigningRequest],
) -> Duration {
    let pods: HashMap<String, PodFacts> = pods
        .iter()
        .map(|p| {
            let facts = pod_facts(p);
            (facts.uid.clone(), facts)
        })
        .collect();
    let csrs: HashMap<String, CsrFacts> =
        csrs.iter().map(|c| (c.name_any(), csr_facts(c))).collect();
    let now = timestamp(SystemClock.now()).unwrap();
    let started = Instant::now();
    for node in nodes {
        let annotations = node.annotations();
        let name = node.name_any();
        let receipt =
            evidence::peek(annotations.get(RECEIPT_ANNOTATION).map(String::as_str)).unwrap();
        let claimed = receipt.peek().clone();
        let verdict = evidence::judge(
            record,
            Answer::Barrier,
            trust,
            NodeFacts {
                name: &name,
                chassis: annotations.get(NODE_CHASSIS_ANNOTATION).map(String::as_str),
            },
            receipt,
            csrs.get(&claimed.csr_name),
            pods.get(claimed.pod_uid.as_str()),
            now,
        );
        assert_eq!(verdict, Verdict::Satisfied, "{name}");
    }
    started.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let central = OvnCentral::start(dir.path()).unwrap();
    let mut c = Cluster::start(n).await;
    let ids = issue_identities(&mut c).await;
    // The trust as the agents hold it (it does not change during the run).
    let trust = Api::<ConfigMap>::namespaced(c.admin.clone(), NS)
        .get("ovn-ipsec-trust")
        .await
        .unwrap();
    let trust = TrustBundle::from_pem(trust.data.unwrap()["ca.crt"].as_bytes()).unwrap();

    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tx, rx) = watch::channel(None);
    let retried = Arc::new(AtomicUsize::new(0));
    let on_record = {
        let seen = seen.clone();
        move |at: Instant, record: &CoordinationRecord| {
            let mut seen = seen.lock().unwrap();
            if seen.phases.last().map(|(_, p, e)| (*p, *e)) != Some((record.phase, record.epoch)) {
                seen.phases.push((at, record.phase, record.epoch));
            }
            if record.phase == CoordinationPhase::Arm {
                seen.arm = Some(record.clone());
            }
        }
    };
    let on_round = {
        let seen = seen.clone();
        move |at: Instant, phase: Option<CoordinationPhase>| {
            seen.lock().unwrap().rounds.push((at, phase));
        }
    };
    let mut tasks = vec![
        tokio::spawn(watch_record(c.admin.clone(), tx, on_record)),
        tokio::spawn(watch_rounds(c.admin.clone(), rx.clone(), on_round)),
    ];
    for (node, id) in c.nodes.iter().zip(ids) {
        let seen = seen.clone();
        let published = move |record: &CoordinationRecord| {
            let phase = if record.phase == CoordinationPhase::Prepare {
                "Prepare"
            } else {
                "Arm"
            };
            let mut seen = seen.lock().unwrap();
            let entry = seen.receipts.entry((record.epoch, phase)).or_default();
            entry.0 += 1;
            entry.1 = Some(Instant::now());
        };
        let r = Responder {
            node: node.clone(),
            id,
        };
        tasks.push(tokio::spawn(respond(
            r,
            trust.digest(),
            rx.clone(),
            published,
            retried.clone(),
        )));
    }
    // Let the watches list (no record, no Lease yet) before the clock runs.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (nb, sb) = (central.nb.address(), central.sb.address());
    let config = c.config_with(&[
        "--enable-ipsec",
        "true",
        "--ovn-nb",
        &nb,
        "--ovn-sb",
        &sb,
        "--coordination-period",
        "1s",
        "--pod-name",
        "controller-0",
    ]);
    let memory = PeakRss::start();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    c.start_controller(config).await;

    let mut records = rx.clone();
    until_record(
        &mut records,
        &c.admin,
        "Enabled in 120 s",
        started + Duration::from_secs(120),
        |r| r.phase == CoordinationPhase::Enabled,
    )
    .await;
    let cpu = cpu_seconds() - cpu_before;
    let hwm_after = vm_kib("VmHWM");
    let rss_after = vm_kib("VmRSS");
    let (nb_on, sb_on) = nb_sb(&central).await;
    assert!(nb_on && sb_on, "Enabled with NB {nb_on} SB {sb_on}");
    c.kill_controller();
    let (phases, rounds, arm, receipts) = {
        let s = seen.lock().unwrap();
        (
            s.phases.clone(),
            s.rounds.clone(),
            s.arm.clone().unwrap(),
            s.receipts.clone(),
        )
    };
    let enabled_at = phases
        .iter()
        .find(|(_, p, _)| *p == CoordinationPhase::Enabled)
        .unwrap()
        .0
        .duration_since(started);

    // The baseline and the breakdown of a barrier pass, with the
    // controller's token, the controller stopped, the Nodes carrying their
    // `Arm` receipts.
    let ctrl = c.server.client("controller").await.unwrap();
    let nodes: Api<Node> = Api::all(ctrl.clone());
    let pods: Api<Pod> = Api::namespaced(ctrl.clone(), NS);
    let csrs: Api<CertificateSigningRequest> = Api::all(ctrl.clone());
    let floor = pass_floor(&c, n).await;
    let csr_gets = median_of(3, || async {
        for node in &c.nodes {
            csrs.get(&format!("ovn-ipsec-{}", node.name)).await.unwrap();
        }
    })
    .await;
    let judging = time_judging(
        &arm,
        &trust,
        &nodes.list(&ListParams::default()).await.unwrap().items,
        &pods.list(&ListParams::default()).await.unwrap().items,
        &csrs.list(&ListParams::default()).await.unwrap().items,
    );

    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let wall = enabled_at.as_secs_f64();
    let target = if n == 1000 {
        format!(" (target < 10 s: {})", verdict(wall < 10.0))
    } else {
        String::new()
    };
    println!(
        "enable_cohort: {n} nodes Prepare → Arm → NB → Enabled (NB and SB read true) in {wall:.2} s \
         from controller start{target}"
    );
    let at = |t: Instant| secs(t.duration_since(started));
    let phase_line: Vec<String> = phases
        .iter()
        .map(|(t, p, e)| format!("{p} epoch {e} at {}", at(*t)))
        .collect();
    println!("  record (s after start): {}", phase_line.join(", "));
    let receipt_line: Vec<String> = receipts
        .iter()
        .map(|((epoch, phase), (count, last))| {
            let written = phases
                .iter()
                .find(|(_, _, e)| e == epoch)
                .map(|(t, _, _)| *t);
            let lag = match (written, last) {
                (Some(w), Some(l)) => secs(l.duration_since(w)),
                _ => "?".into(),
            };
            format!("{count} for {phase} epoch {epoch}, the last {lag} s after that record")
        })
        .collect();
    println!(
        "  receipts (responders, one shared watch): {} ({} patches retried)",
        receipt_line.join("; "),
        retried.load(Ordering::Relaxed)
    );
    // Round k's length is the gap to round k+1: period + election round +
    // pass. The last round seen is the one that wrote Enabled.
    let mut round_line = Vec::new();
    let mut longest = Duration::ZERO;
    for (k, (t, phase)) in rounds.iter().enumerate() {
        let phase = phase.map_or("no record".to_owned(), |p| p.to_string());
        let pass = match rounds.get(k + 1) {
            Some((next, _)) => {
                let pass = next.duration_since(*t).saturating_sub(PERIOD);
                longest = longest.max(pass);
                format!("pass ≈ {} s", secs(pass))
            }
            None => format!(
                "Enabled {} s later",
                secs(enabled_at.saturating_sub(t.duration_since(started)))
            ),
        };
        round_line.push(format!("{} {phase} ({pass})", at(*t)));
    }
    println!(
        "  rounds (Lease writes, s after start, the record's phase, the pass = gap to the next − {} s period): {}",
        PERIOD.as_secs(),
        round_line.join(", ")
    );
    let growth = memory.growth(hwm_after);
    let mem_target = if n == 1000 {
        format!(" (target < 200 MiB: {})", verdict(mib(growth) < 200.0))
    } else {
        String::new()
    };
    println!(
        "  memory: growth {:.1} MiB{mem_target}: VmHWM {:.1} MiB and VmRSS {:.1} MiB right before the \
         controller started, peak {:.1} MiB during the enable ({}), VmRSS {:.1} MiB at Enabled. The API \
         server, fixture and responders share the process: an upper bound on the controller's",
        mib(growth),
        mib(memory.hwm_before),
        mib(memory.rss_before),
        mib(hwm_after),
        memory.how(),
        mib(rss_after),
    );
    println!(
        "  cpu: {cpu:.1} s of process CPU over the enable (everything in-process): {:.2} cores on average, of 2",
        cpu / wall
    );
    let protocol_floor = floor * 4 + PERIOD * 3;
    println!(
        "baseline: pass floor = one LIST of {n} Nodes + one of {n} Pods with the controller's token: {} ms \
         (median of 5); 4 passes + 3 periods at that floor = {} s; ratio {:.2}x (enable / floor); \
         longest pass {:.0}x the pass floor",
        floor.as_millis(),
        secs(protocol_floor),
        wall / protocol_floor.as_secs_f64(),
        longest.as_secs_f64() / floor.as_secs_f64(),
    );
    println!(
        "  a barrier pass: pass floor {} ms + {n} CSR GETs one after another {} ms (median of 3) + judging \
         {n} receipts {} ms (peek, chain, chassis, signature; one core) = {} ms, the longest pass {} ms",
        floor.as_millis(),
        csr_gets.as_millis(),
        judging.as_millis(),
        (floor + csr_gets + judging).as_millis(),
        longest.as_millis(),
    );

    for t in tasks {
        t.abort();
    }
    c.stop().await;
    drop(central);
}
