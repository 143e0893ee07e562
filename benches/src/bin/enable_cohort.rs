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

// The cluster fixture is the controller's integration-test harness.
#[path = "../../../controller/tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::coordination::nb_sb;
use common::*;
use controller::coordination::evidence::{self, Answer, CsrFacts, NodeFacts, PodFacts};
use controller::coordination::leader::LEASE_NAME as LEASE;
use controller::coordination::machine::Verdict;
use controller::coordination::run::{CONFIGMAP as RECORD, RECEIPT_ANNOTATION};
use controller::names::NODE_CHASSIS_ANNOTATION;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, timestamp};
use kube_ovn_ipsec_api::coordination::{
    CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::signed::{self, SigningKey};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use testbed::ovs::OvnCentral;
use tokio::sync::watch;

/// `--coordination-period`.
const PERIOD: Duration = Duration::from_secs(1);

/// A node as its agent would be once its identity is issued.
struct Responder {
    node: NodeFx,
    key: SigningKey,
    certificate_digest: Sha256Digest,
    csr_name: String,
    csr_uid: String,
}

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

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A `Vm*` line of /proc/self/status, in KiB.
fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// The process's user + system CPU time so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15; in USER_HZ, 100 on Linux.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Has the controller issue every node a P-256 certificate through the
/// node's own Pod-bound token: keys and CSRs first, then a controller
/// without the coordinator until every CSR is signed; it is killed after.
async fn issue_identities(c: &mut Cluster) -> Vec<Responder> {
    let n = c.nodes.len();
    let keys: Vec<KeyPair> = (0..n)
        .map(|_| KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap())
        .collect();
    let mut creates = Vec::new();
    for (node, key) in c.nodes.iter().zip(&keys) {
        let csr = csr_object(
            &format!("ovn-ipsec-{}", node.name),
            node,
            &request_pem(key, &node.chassis),
            86400,
        );
        let client = node.client.clone();
        creates.push(tokio::spawn(async move {
            Api::<CertificateSigningRequest>::all(client)
                .create(&PostParams::default(), &csr)
                .await
                .unwrap()
        }));
    }
    for t in creates {
        t.await.unwrap();
    }
    c.start_controller(c.config()).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while (c.metrics.csr_count("signed", "Signed") as usize) < n {
        assert!(Instant::now() < deadline, "identities not issued in 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.kill_controller();
    let mut issued: BTreeMap<String, (String, Vec<u8>)> = BTreeMap::new();
    for csr in Api::<CertificateSigningRequest>::all(c.admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        let Some(Outcome::Issued(pem)) = outcome(&csr) else {
            panic!("{} not issued", csr.name_any())
        };
        issued.insert(csr.name_any(), (csr.uid().unwrap(), pem));
    }
    c.nodes
        .iter()
        .zip(keys)
        .map(|(node, key)| {
            let csr_name = format!("ovn-ipsec-{}", node.name);
            let (csr_uid, pem) = issued.remove(&csr_name).unwrap();
            Responder {
                node: node.clone(),
                key: SigningKey::from_pkcs8_der(&key.serialize_der()).unwrap(),
                certificate_digest: Certificate::from_pem(&pem).unwrap().digest(),
                csr_name,
                csr_uid,
            }
        })
        .collect()
}

/// Follows the record (through the shared watch) as an agent would and
/// publishes a signed receipt, with the node's own token, for every new
/// (generation, epoch) of `Prepare`/`Arm` naming it as a target. The
/// receipt says ready in full: what is measured is the controller, not how
/// long an agent takes to arm.
async fn respond(
    r: Responder,
    trust_hash: Sha256Digest,
    mut records: watch::Receiver<Option<Arc<CoordinationRecord>>>,
    seen: Arc<Mutex<Seen>>,
    retried: Arc<AtomicUsize>,
) {
    let nodes: Api<Node> = Api::all(r.node.client.clone());
    let mut last = None;
    loop {
        let current = records.borrow_and_update().clone();
        if let Some(record) = current
            && matches!(
                record.phase,
                CoordinationPhase::Prepare | CoordinationPhase::Arm
            )
            && record.targets.contains_key(&r.node.name)
            && last != Some((record.generation, record.epoch, record.phase))
        {
            let receipt = Receipt {
                generation: record.generation,
                epoch: record.epoch,
                phase: record.phase,
                node_name: r.node.name.clone(),
                node_uid: Uid::new(r.node.uid.clone()).unwrap(),
                pod_uid: Uid::new(r.node.pod_uid.clone()).unwrap(),
                csr_name: r.csr_name.clone(),
                csr_uid: Uid::new(r.csr_uid.clone()).unwrap(),
                template_hash: HASH.into(),
                trust_hash,
                observed: timestamp(SystemClock.now()).unwrap(),
                status: ReceiptStatus {
                    identity_ready: true,
                    capability_verified: true,
                    protection_armed: true,
                    configuration_applied: true,
                    runtime_healthy: true,
                    certificate_digest: r.certificate_digest,
                },
            };
            let annotation = signed::sign(&receipt, &r.key).unwrap();
            let patch = serde_json::json!({"metadata": {"annotations": {
                (RECEIPT_ANNOTATION): annotation}}});
            match nodes
                .patch(&r.node.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    last = Some((record.generation, record.epoch, record.phase));
                    let phase = if record.phase == CoordinationPhase::Prepare {
                        "Prepare"
                    } else {
                        "Arm"
                    };
                    let mut seen = seen.lock().unwrap();
                    let entry = seen.receipts.entry((record.epoch, phase)).or_default();
                    entry.0 += 1;
                    entry.1 = Some(Instant::now());
                }
                Err(_) => {
                    retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        if records.changed().await.is_err() {
            return;
        }
    }
}

/// The one watch of the record: logs each change of phase or epoch and
/// hands the record to every responder.
async fn watch_record(
    admin: Client,
    records: watch::Sender<Option<Arc<CoordinationRecord>>>,
    seen: Arc<Mutex<Seen>>,
) {
    let maps: Api<ConfigMap> = Api::namespaced(admin, NS);
    let config = watcher::Config::default().fields(&format!("metadata.name={RECORD}"));
    let mut events = pin!(watcher(maps, config).default_backoff());
    while let Some(event) = events.next().await {
        let (Ok(Event::Apply(cm)) | Ok(Event::InitApply(cm))) = event else {
            continue;
        };
        let Some(record) = cm
            .data
            .as_ref()
            .and_then(|d| d.get("state"))
            .and_then(|s| CoordinationRecord::decode(s.as_bytes()).ok())
        else {
            continue;
        };
        let at = Instant::now();
        {
            let mut seen = seen.lock().unwrap();
            if seen.phases.last().map(|(_, p, e)| (*p, *e)) != Some((record.phase, record.epoch)) {
                seen.phases.push((at, record.phase, record.epoch));
            }
            if record.phase == CoordinationPhase::Arm {
                seen.arm = Some(record.clone());
            }
        }
        records.send_if_modified(|current| {
            if current.as_deref() == Some(&record) {
                return false;
            }
            *current = Some(Arc::new(record));
            true
        });
    }
}

/// Logs each write of the coordination Lease: the leader renews it at the
/// start of every round, so the gaps are the rounds' lengths (period +
/// election round + pass).
async fn watch_rounds(
    admin: Client,
    records: watch::Receiver<Option<Arc<CoordinationRecord>>>,
    seen: Arc<Mutex<Seen>>,
) {
    let leases: Api<Lease> = Api::namespaced(admin, NS);
    let config = watcher::Config::default().fields(&format!("metadata.name={LEASE}"));
    let mut events = pin!(watcher(leases, config).default_backoff());
    while let Some(event) = events.next().await {
        if let Ok(Event::Apply(_) | Event::InitApply(_)) = event {
            let phase = records.borrow().as_ref().map(|r| r.phase);
            seen.lock().unwrap().rounds.push((Instant::now(), phase));
        }
    }
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
            let v = controller::live::pod_view(p);
            let facts = PodFacts {
                uid: v.uid.clone(),
                node_name: v.node_name,
                owner_uid: v.owner_daemon_set_uid,
                template_hash: v.template_hash,
                live: !v.terminating && !v.finished,
            };
            (v.uid, facts)
        })
        .collect();
    let csrs: HashMap<String, CsrFacts> = csrs
        .iter()
        .map(|c| {
            let pod_uid = c
                .spec
                .extra
                .as_ref()
                .and_then(|e| e.get(k8s::EXTRA_POD_UID));
            let facts = CsrFacts {
                uid: c.uid().unwrap(),
                certificate_pem: c
                    .status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .map(|b| b.0.clone()),
                requester_pod_uid: pod_uid.and_then(|v| v.first().cloned()),
                node_annotation: c.annotations().get(k8s::ANNOTATION_NODE).cloned(),
            };
            (c.name_any(), facts)
        })
        .collect();
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

/// The median of `runs` timings of `f`.
async fn median_of<F, Fut>(runs: usize, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        f().await;
        times.push(t.elapsed());
    }
    times.sort();
    times[runs / 2]
}

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
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
    let responders = issue_identities(&mut c).await;
    // The trust as the agents hold it (it does not change during the run).
    let trust = Api::<ConfigMap>::namespaced(c.admin.clone(), NS)
        .get("ovn-ipsec-trust")
        .await
        .unwrap();
    let trust = TrustBundle::from_pem(trust.data.unwrap()["ca.crt"].as_bytes()).unwrap();

    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tx, rx) = watch::channel(None);
    let retried = Arc::new(AtomicUsize::new(0));
    let mut tasks = vec![
        tokio::spawn(watch_record(c.admin.clone(), tx, seen.clone())),
        tokio::spawn(watch_rounds(c.admin.clone(), rx.clone(), seen.clone())),
    ];
    for r in responders {
        tasks.push(tokio::spawn(respond(
            r,
            trust.digest(),
            rx.clone(),
            seen.clone(),
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
    let hwm_before = vm_kib("VmHWM");
    let rss_before = vm_kib("VmRSS");
    // Resetting the high-water mark to the current RSS makes the peak read
    // at the end the enable's own; without it, an earlier peak (fixture,
    // issuing) would hide the growth.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    c.start_controller(config).await;

    let mut records = rx.clone();
    let deadline = started + Duration::from_secs(120);
    loop {
        let enabled = records
            .borrow_and_update()
            .as_ref()
            .is_some_and(|r| r.phase == CoordinationPhase::Enabled);
        if enabled {
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, records.changed()).await.is_err() {
            let status = Api::<ConfigMap>::namespaced(c.admin.clone(), NS)
                .get_opt(RECORD)
                .await
                .unwrap()
                .and_then(|m| m.data?.get("status").cloned())
                .unwrap_or_default();
            panic!(
                "not Enabled in 120 s; status (first 2,000 bytes): {}",
                &status[..status.len().min(2000)]
            );
        }
    }
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
    nodes.list(&ListParams::default()).await.unwrap();
    let floor = median_of(5, || async {
        assert_eq!(
            nodes
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            n
        );
        assert_eq!(
            pods.list(&ListParams::default()).await.unwrap().items.len(),
            n
        );
    })
    .await;
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
    let growth = if reset {
        hwm_after.saturating_sub(rss_before)
    } else {
        hwm_after.saturating_sub(hwm_before)
    };
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
        mib(hwm_before),
        mib(rss_before),
        mib(hwm_after),
        if reset {
            "VmHWM reset at the start; growth over that RSS"
        } else {
            "VmHWM not resettable; growth over the earlier peak, a lower bound"
        },
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
