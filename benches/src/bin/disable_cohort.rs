//! The controller's cost of disabling IPsec across 1,000 nodes: the real
//! controller (in-process, coordinator on, 1 s period) against the embedded
//! API server (RBAC on) and real OVN NB/SB with ovn-northd, taking an
//! `Enabled` cohort through `Disabling` → `Cleanup` → `Release` →
//! `Disabled`.
//!
//! Not measured: the cohort is first enabled as `enable_cohort` does it
//! (identities issued by the controller through each node's Pod-bound
//! token, in-process responders publishing signed `Prepare`/`Arm`
//! receipts). The clock starts at the disable intent, the chart's upgrade:
//! the controller restarted with `--enable-ipsec false`, and — the
//! DaemonSet controller's and the kubelets' part, played in-process as
//! fast as the fixture goes — the DaemonSet rolled to the cleanup shape
//! (the `ipsec-cleanup` init container instead of the `ipsec` container, a
//! new template hash and ControllerRevision), each node's Pod replaced by
//! a cleanup Pod whose init container reports running. Once the record
//! reads `Release`, each node's cleanup init container is played too: a
//! real signed release receipt for the record's generation, epoch and
//! challenge, naming the new Pod and the cleanup template, signed with the
//! node's key (whose certificate its CSR carries) and published with the
//! new Pod's token; then the init container's exit 0 (the kubelet's
//! report comes after the receipt, as on a node).
//!
//! Prints the wall time from the intent to the record reading `Disabled`
//! with NB and SB false (target < 10 s), the time spent in each phase,
//! each coordination round (from the Lease renewals), and the process's
//! peak RSS growth over the disable (target < 200 MiB); the fixture, the
//! API server and the responders share the process, so it is an upper
//! bound on the controller's own.
//!
//! Baseline, measured in the same run once `Disabled` is reached: the
//! **pass floor**, one LIST of the N Nodes and one of the N CNI Pods with
//! the controller's token. The disable takes at least five passes (write
//! `Disabling`, set NB off, write `Cleanup`, write `Release`, write
//! `Disabled`) with a period between each, so no one-step-per-pass
//! coordinator with this period can beat `5 × floor + 4 × period`. Then,
//! the controller stopped, it takes a `Release` pass apart: the two LISTs,
//! the CSR GET per target, and the controller's own judgement of every
//! release receipt.
//!
//! First argument: the number of nodes (default 1,000).

// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use harness::controller_cluster as common;

use harness::cohort;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::*;
use common::coordination::{flags_wanting, nb_sb, publish_release};
use common::*;
use controller::coordination::evidence::{self, CleanupPodFacts, CsrFacts, InitState, NodeFacts};
use controller::coordination::machine::Verdict;
use controller::coordination::run::{CONFIGMAP as RECORD, RELEASE_RECEIPT_ANNOTATION};
use controller::names::NODE_CHASSIS_ANNOTATION;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, timestamp};
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::TrustBundle;
use testbed::ovs::OvnCentral;
use tokio::sync::watch;

use CoordinationPhase::{Cleanup, Disabled, Disabling, Enabled, Release};

/// The template hash of the chart's DaemonSet with IPsec disabled.
const CLEANUP_HASH: &str = "7c1e4a9f2";

/// How many nodes' kubelets and cleanup init containers the fixture plays
/// at once: enough to keep both cores busy, few enough that the fixture's
/// connections stay in the tens (each node's token has its own client).
const FIXTURE_CONCURRENCY: usize = 64;

/// What the bench saw, timed as it saw it.
#[derive(Default)]
struct Seen {
    /// Each change of the record's (phase, epoch).
    phases: Vec<(Instant, CoordinationPhase, u64)>,
    /// Each Lease write (one per coordination round), with the record's
    /// phase at that moment.
    rounds: Vec<(Instant, Option<CoordinationPhase>)>,
}

/// The state of a Pod's `ipsec-cleanup` init container, as the
/// coordinator reads it from the Pod's status.
fn cleanup_init(pod: &Pod) -> Option<InitState> {
    let status = pod
        .status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == k8s::INIT_CONTAINER_CLEANUP)?;
    let Some(state) = status.state.as_ref() else {
        return Some(InitState::Waiting(String::new()));
    };
    Some(if let Some(t) = &state.terminated {
        InitState::Terminated {
            exit_code: t.exit_code,
            reason: t.reason.clone().unwrap_or_default(),
        }
    } else if state.running.is_some() {
        InitState::Running
    } else {
        InitState::Waiting(String::new())
    })
}

/// How long the controller's own judgement (`evidence::peek_release` and
/// `evidence::judge_release`) of every Node's release receipt against the
/// `Release` record takes, the API reads done beforehand; every verdict
/// must be `Satisfied`, which also checks that the facts are built as the
/// coordinator builds them.
fn time_judging(
    record: &CoordinationRecord,
    trust: &TrustBundle,
    nodes: &[Node],
    pods: &[Pod],
    csrs: &[CertificateSigningRequest],
) -> Duration {
    let pods: HashMap<String, CleanupPodFacts> = pods
        .iter()
        .map(|p| {
            let facts = CleanupPodFacts {
                pod: pod_facts(p),
                cleanup_init: cleanup_init(p),
            };
            (facts.pod.uid.clone(), facts)
        })
        .collect();
    let csrs: HashMap<String, CsrFacts> =
        csrs.iter().map(|c| (c.name_any(), csr_facts(c))).collect();
    let now = timestamp(SystemClock.now()).unwrap();
    let started = Instant::now();
    for node in nodes {
        let annotations = node.annotations();
        let name = node.name_any();
        let receipt = evidence::peek_release(
            annotations
                .get(RELEASE_RECEIPT_ANNOTATION)
                .map(String::as_str),
        )
        .unwrap();
        let claimed = receipt.peek().clone();
        let verdict = evidence::judge_release(
            record,
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

/// The Warning Events on Nodes (namespace `default`), counted by reason.
async fn node_warnings(admin: &kube::Client) -> BTreeMap<String, usize> {
    let mut by_reason = BTreeMap::new();
    for e in Api::<Event>::namespaced(admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        if e.type_.as_deref() == Some("Warning")
            && e.involved_object.kind.as_deref() == Some("Node")
        {
            *by_reason.entry(e.reason.unwrap_or_default()).or_default() += 1;
        }
    }
    by_reason
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
    let on_record = {
        let seen = seen.clone();
        move |at: Instant, record: &CoordinationRecord| {
            let mut seen = seen.lock().unwrap();
            if seen.phases.last().map(|(_, p, e)| (*p, *e)) != Some((record.phase, record.epoch)) {
                seen.phases.push((at, record.phase, record.epoch));
            }
        }
    };
    let on_round = {
        let seen = seen.clone();
        move |at: Instant, phase: Option<CoordinationPhase>| {
            seen.lock().unwrap().rounds.push((at, phase));
        }
    };
    let watches = [
        tokio::spawn(watch_record(c.admin.clone(), tx, on_record)),
        tokio::spawn(watch_rounds(c.admin.clone(), rx.clone(), on_round)),
    ];

    // Not measured: the enable, as enable_cohort measures it.
    let retried = Arc::new(AtomicUsize::new(0));
    let enablers: Vec<_> = c
        .nodes
        .iter()
        .zip(&ids)
        .map(|(node, id)| {
            let r = Responder {
                node: node.clone(),
                id: id.clone(),
            };
            tokio::spawn(respond(
                r,
                trust.digest(),
                rx.clone(),
                |_| {},
                retried.clone(),
            ))
        })
        .collect();
    // Let the watches list (no record, no Lease yet) before the enable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (nb, sb) = (central.nb.address(), central.sb.address());
    let enable_started = Instant::now();
    c.start_controller(c.config_with(&flags_wanting(true, &nb, &sb, "controller-0")))
        .await;
    let mut records = rx.clone();
    let enabled = until_record(
        &mut records,
        &c.admin,
        "Enabled in 120 s",
        enable_started + Duration::from_secs(120),
        |r| r.phase == Enabled,
    )
    .await;
    let enable_took = enable_started.elapsed();
    assert_eq!(nb_sb(&central).await, (true, true), "Enabled");
    assert_eq!(enabled.targets.len(), n);
    for e in enablers {
        e.abort();
    }

    // Measured from here: the chart's upgrade that disables IPsec. The
    // controller restarts wanting it off (same replica name: it renews its
    // own Lease at once) ...
    let memory = PeakRss::start();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    c.kill_controller();
    c.start_controller(c.config_with(&flags_wanting(false, &nb, &sb, "controller-0")))
        .await;
    // ... and the DaemonSet rolls to the cleanup shape, as fast as the
    // fixture goes: the template, the revision, then each node's Pod
    // deleted and a cleanup Pod created (one after another). Each init
    // container is then reported running and reads the record once with
    // its Pod's token, as the cleanup does from its start (it checks in
    // every disable phase and withdraws only in `Release`): its connection
    // is open before `Release`, as on a node.
    c.roll_daemon_set(Shape::Cleanup, CLEANUP_HASH).await;
    let rolled = started.elapsed();
    let rss_rolled = vm_kib("VmRSS");
    futures::stream::iter(0..n)
        .for_each_concurrent(FIXTURE_CONCURRENCY, |i| {
            let c = &c;
            async move {
                c.set_cleanup_init(i, None).await;
                Api::<ConfigMap>::namespaced(c.nodes[i].client.clone(), NS)
                    .get(RECORD)
                    .await
                    .unwrap();
            }
        })
        .await;
    let running = started.elapsed();
    let rss_running = vm_kib("VmRSS");

    // Each node's cleanup init container: once the record reads `Release`,
    // its release receipt, then its exit 0.
    let release = until_record(
        &mut records,
        &c.admin,
        "Release in 120 s",
        started + Duration::from_secs(120),
        |r| r.phase == Release,
    )
    .await;
    let rss_release = vm_kib("VmRSS");
    let challenge = release.challenge;
    let answered: Vec<(Instant, Instant)> = futures::stream::iter(0..n)
        .map(|i| {
            let (c, id) = (&c, &ids[i]);
            async move {
                let sent = publish_release(c, i, id, |_| {}).await;
                assert_eq!(Some(sent.challenge), challenge);
                let published = Instant::now();
                c.set_cleanup_init(i, Some(0)).await;
                (published, Instant::now())
            }
        })
        .buffer_unordered(FIXTURE_CONCURRENCY)
        .collect()
        .await;
    let rss_answered = vm_kib("VmRSS");
    let disabled = until_record(
        &mut records,
        &c.admin,
        "Disabled in 120 s",
        started + Duration::from_secs(120),
        |r| r.phase == Disabled,
    )
    .await;
    let cpu = cpu_seconds() - cpu_before;
    let hwm_after = vm_kib("VmHWM");
    let rss_after = vm_kib("VmRSS");
    assert_eq!(nb_sb(&central).await, (false, false), "Disabled");
    assert_eq!(disabled.generation, enabled.generation + 1, "one new cycle");
    assert_eq!(disabled.targets.len(), n, "every node released");
    c.kill_controller();
    let warnings = node_warnings(&c.admin).await;
    let (phases, rounds) = {
        let s = seen.lock().unwrap();
        (s.phases.clone(), s.rounds.clone())
    };
    // The disable's records: from the first `Disabling` after the intent.
    let phases: Vec<_> = phases
        .into_iter()
        .filter(|(t, _, _)| *t >= started)
        .collect();
    let written = |phase: CoordinationPhase| {
        phases
            .iter()
            .find(|(_, p, _)| *p == phase)
            .unwrap_or_else(|| panic!("no {phase} record seen"))
            .0
    };
    let (disabling_at, cleanup_at, release_at, disabled_at) = (
        written(Disabling),
        written(Cleanup),
        written(Release),
        written(Disabled),
    );
    let rounds: Vec<_> = rounds.into_iter().filter(|(t, _)| *t >= started).collect();

    // The baseline and the breakdown of a `Release` pass, with the
    // controller's token, the controller stopped, the Nodes carrying their
    // release receipts.
    let floor = pass_floor(&c, n).await;
    let ctrl = c.server.client("controller").await.unwrap();
    let nodes: Api<Node> = Api::all(ctrl.clone());
    let pods: Api<Pod> = Api::namespaced(ctrl.clone(), NS);
    let csrs: Api<CertificateSigningRequest> = Api::all(ctrl.clone());
    let csr_gets = median_of(3, || async {
        for node in &c.nodes {
            csrs.get(&format!("ovn-ipsec-{}", node.name)).await.unwrap();
        }
    })
    .await;
    let judging = time_judging(
        &release,
        &trust,
        &nodes.list(&ListParams::default()).await.unwrap().items,
        &pods.list(&ListParams::default()).await.unwrap().items,
        &csrs.list(&ListParams::default()).await.unwrap().items,
    );

    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    let wall = disabled_at.duration_since(started).as_secs_f64();
    let target = if n == 1000 {
        format!(
            " (target < 10 s: {}, {:.2} of it)",
            verdict(wall < 10.0),
            wall / 10.0
        )
    } else {
        String::new()
    };
    println!(
        "disable_cohort: {n} nodes Enabled → Disabling → Cleanup → Release → Disabled (NB and SB read \
         false) in {wall:.2} s from the disable intent{target}"
    );
    println!(
        "  setup, not measured: the enable took {} s ({} enable-side patches retried)",
        secs(enable_took),
        retried.load(std::sync::atomic::Ordering::Relaxed)
    );
    let at = |t: Instant| secs(t.duration_since(started));
    let record_line: Vec<String> = phases
        .iter()
        .map(|(t, p, e)| format!("{p} epoch {e} at {}", at(*t)))
        .collect();
    println!("  record (s after the intent): {}", record_line.join(", "));
    println!(
        "  phases: intent → Disabling written {} s (controller start, first pass); Disabling {} s (NB \
         off, SB confirmed, the cleanup shape seen); Cleanup {} s; Release {} s ({n} release receipts \
         verified)",
        secs(disabling_at.duration_since(started)),
        secs(cleanup_at.duration_since(disabling_at)),
        secs(release_at.duration_since(cleanup_at)),
        secs(disabled_at.duration_since(release_at)),
    );
    let first = answered.iter().map(|(p, _)| *p).min().unwrap();
    let last = answered.iter().map(|(p, _)| *p).max().unwrap();
    let exited = answered.iter().map(|(_, e)| *e).max().unwrap();
    println!(
        "  fixture (DaemonSet controller and kubelets, in-process): template, revision and {n} Pods \
         replaced one after another by {} s, every init container running (and its first read of \
         the record) by {} s; release receipts ({FIXTURE_CONCURRENCY} nodes at a time, receipt then exit 0): the first {} s, the \
         last {} s after the Release record, the last exit 0 {} s after it; Disabled written {} s \
         after that (at most the pass then under way, a period and one more pass)",
        secs(rolled),
        secs(running),
        secs(first.saturating_duration_since(release_at)),
        secs(last.saturating_duration_since(release_at)),
        secs(exited.saturating_duration_since(release_at)),
        secs(disabled_at.saturating_duration_since(exited)),
    );
    let warning_line: Vec<String> = warnings.iter().map(|(r, k)| format!("{k} {r}")).collect();
    println!(
        "  Warning Events on Nodes (the whole run): {}",
        if warning_line.is_empty() {
            "none".to_owned()
        } else {
            warning_line.join(", ")
        }
    );
    // Round k's length is the gap to round k+1: period + election round +
    // pass. The last round before `Disabled` is the one that wrote it.
    let mut round_line = Vec::new();
    let mut longest = Duration::ZERO;
    let rounds: Vec<_> = rounds
        .into_iter()
        .filter(|(t, _)| *t <= disabled_at)
        .collect();
    for (k, (t, phase)) in rounds.iter().enumerate() {
        let phase = phase.map_or("no record".to_owned(), |p| p.to_string());
        let pass = match rounds.get(k + 1) {
            Some((next, _)) => {
                let pass = next.duration_since(*t).saturating_sub(PERIOD);
                longest = longest.max(pass);
                format!("pass ≈ {} s", secs(pass))
            }
            None => format!("Disabled {} s later", secs(disabled_at.duration_since(*t))),
        };
        round_line.push(format!("{} {phase} ({pass})", at(*t)));
    }
    println!(
        "  rounds (Lease writes, s after the intent, the record's phase, the pass = gap to the next − {} s \
         period): {}",
        PERIOD.as_secs(),
        round_line.join(", ")
    );
    let growth = memory.growth(hwm_after);
    let mem_target = if n == 1000 {
        format!(
            " (target < 200 MiB: {}, {:.2} of it)",
            verdict(mib(growth) < 200.0),
            mib(growth) / 200.0
        )
    } else {
        String::new()
    };
    println!(
        "  memory: growth {:.1} MiB{mem_target}: VmHWM {:.1} MiB and VmRSS {:.1} MiB at the intent, peak \
         {:.1} MiB during the disable ({}), VmRSS {:.1} MiB at Disabled. The API server, fixture and \
         responders share the process: an upper bound on the controller's",
        mib(growth),
        mib(memory.hwm_before),
        mib(memory.rss_before),
        mib(hwm_after),
        memory.how(),
        mib(rss_after),
    );
    println!(
        "  VmRSS along the way: {:.1} MiB at the intent, {:.1} after the roll ({n} new Pod tokens and \
         clients), {:.1} with every init container running (its connection open), {:.1} when the \
         Release record was seen, {:.1} after the release receipts, {:.1} at Disabled",
        mib(memory.rss_before),
        mib(rss_rolled),
        mib(rss_running),
        mib(rss_release),
        mib(rss_answered),
        mib(rss_after),
    );
    println!(
        "  cpu: {cpu:.1} s of process CPU over the disable (everything in-process): {:.2} cores on \
         average, of 2",
        cpu / wall
    );
    let protocol_floor = floor * 5 + PERIOD * 4;
    println!(
        "baseline: pass floor = one LIST of {n} Nodes + one of {n} Pods with the controller's token: {} ms \
         (median of 5); 5 passes + 4 periods at that floor = {} s; ratio {:.2}x (disable / floor); \
         longest pass {:.0}x the pass floor",
        floor.as_millis(),
        secs(protocol_floor),
        wall / protocol_floor.as_secs_f64(),
        longest.as_secs_f64() / floor.as_secs_f64(),
    );
    println!(
        "  a Release pass: pass floor {} ms + {n} CSR GETs one after another {} ms (median of 3) + \
         judging {n} release receipts {} ms (peek, chain, chassis, signature; one core) = {} ms, the \
         longest pass {} ms",
        floor.as_millis(),
        csr_gets.as_millis(),
        judging.as_millis(),
        (floor + csr_gets + judging).as_millis(),
        longest.as_millis(),
    );

    for w in watches {
        w.abort();
    }
    c.stop().await;
    drop(central);
}
