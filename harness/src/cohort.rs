//! What the cohort benches (`enable_cohort`, `disable_cohort`) share: node
//! identities issued by the real controller, responders that answer the
//! enable's barriers with real signed receipts, one shared watch of the
//! record, the rounds read from the Lease writes, and the process's own
//! measures (peak RSS, CPU).
//!
//! Included by each bench binary next to the controller's test fixture
//! (`crate::controller_cluster`), which it builds on.

// Each binary uses a part of what is here; the rest is dead in that binary.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_api::signed::{self, SigningKey};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use tokio::sync::watch;

use controller::coordination::evidence::{CsrFacts, PodFacts};
use controller::coordination::leader::LEASE_NAME as LEASE;
use controller::coordination::run::{CONFIGMAP as RECORD, RECEIPT_ANNOTATION};

use crate::controller_cluster::coordination::Identity;
use crate::controller_cluster::{
    Cluster, HASH, NS, NodeFx, Outcome, csr_object, outcome, request_pem,
};

/// `--coordination-period` of every coordinating controller in the benches.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The record as the shared watch last saw it (`None` before there is one).
pub type Records = watch::Receiver<Option<Arc<CoordinationRecord>>>;

/// A node as its agent would be once its identity is issued.
pub struct Responder {
    /// The node, its CNI Pod and that Pod's token.
    pub node: NodeFx,
    /// The identity the controller issued it.
    pub id: Identity,
}

/// MiB from KiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A `Vm*` line of /proc/self/status, in KiB.
pub fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// The process's user + system CPU time so far.
pub fn cpu_seconds() -> f64 {
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

/// Seconds with two decimals.
pub fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// The process's peak RSS over a measured stretch.
pub struct PeakRss {
    /// `VmHWM` when the stretch started, KiB.
    pub hwm_before: u64,
    /// `VmRSS` when the stretch started, KiB.
    pub rss_before: u64,
    /// Whether the high-water mark could be reset to the RSS at the start.
    pub reset: bool,
}

impl PeakRss {
    /// Starts the stretch. Resetting the high-water mark to the current RSS
    /// makes the peak read at the end the stretch's own; without it, an
    /// earlier peak (fixture, issuing, an enable) would hide the growth.
    pub fn start() -> PeakRss {
        let hwm_before = vm_kib("VmHWM");
        let rss_before = vm_kib("VmRSS");
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        PeakRss {
            hwm_before,
            rss_before,
            reset,
        }
    }

    /// The growth, KiB, given the peak `hwm_after` read at the end: over
    /// the RSS at the start when the mark was reset, otherwise over the
    /// earlier peak (a lower bound).
    pub fn growth(&self, hwm_after: u64) -> u64 {
        if self.reset {
            hwm_after.saturating_sub(self.rss_before)
        } else {
            hwm_after.saturating_sub(self.hwm_before)
        }
    }

    /// How the growth was taken, for the printed line.
    pub fn how(&self) -> &'static str {
        if self.reset {
            "VmHWM reset at the start; growth over that RSS"
        } else {
            "VmHWM not resettable; growth over the earlier peak, a lower bound"
        }
    }
}

/// The median of `runs` timings of `f`.
pub async fn median_of<F, Fut>(runs: usize, mut f: F) -> Duration
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

/// The **pass floor**, median of 5: one LIST of the `n` Nodes and one of
/// the `n` CNI Pods with the controller's token. Every coordination pass
/// must at least list both (the cohort is the DaemonSet's Pods' nodes, the
/// receipts are on the Nodes).
pub async fn pass_floor(c: &Cluster, n: usize) -> Duration {
    let ctrl = c.server.client("controller").await.unwrap();
    let nodes: Api<Node> = Api::all(ctrl.clone());
    let pods: Api<Pod> = Api::namespaced(ctrl, NS);
    nodes.list(&ListParams::default()).await.unwrap();
    median_of(5, || async {
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
    .await
}

/// A Pod's facts as the coordinator builds them for a receipt's judgement.
pub fn pod_facts(p: &Pod) -> PodFacts {
    let v = controller::live::pod_view(p);
    PodFacts {
        uid: v.uid,
        node_name: v.node_name,
        owner_uid: v.owner_daemon_set_uid,
        template_hash: v.template_hash,
        live: !v.terminating && !v.finished,
    }
}

/// A CSR's facts as the coordinator builds them for a receipt's judgement.
pub fn csr_facts(c: &CertificateSigningRequest) -> CsrFacts {
    let pod_uid = c
        .spec
        .extra
        .as_ref()
        .and_then(|e| e.get(k8s::EXTRA_POD_UID));
    CsrFacts {
        uid: c.uid().unwrap(),
        certificate_pem: c
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .map(|b| b.0.clone()),
        requester_pod_uid: pod_uid.and_then(|v| v.first().cloned()),
        node_annotation: c.annotations().get(k8s::ANNOTATION_NODE).cloned(),
    }
}

/// Has the controller issue every node a P-256 certificate through the
/// node's own Pod-bound token: keys and CSRs first, then a controller
/// without the coordinator until every CSR is signed; it is killed after.
/// The identities come back in the order of `c.nodes`.
pub async fn issue_identities(c: &mut Cluster) -> Vec<Identity> {
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
            Identity {
                key: Arc::new(SigningKey::from_pkcs8_der(&key.serialize_der()).unwrap()),
                certificate: Certificate::from_pem(&pem).unwrap(),
                csr_name,
                csr_uid,
            }
        })
        .collect()
}

/// Follows the record (through the shared watch) as an agent would and
/// publishes a signed receipt, with the node's own token, for every new
/// (generation, epoch) of `Prepare`/`Arm` naming it as a target;
/// `published` is told of each. The receipt says ready in full: what is
/// measured is the controller, not how long an agent takes to arm. A
/// refused patch is retried 200 ms later and counted in `retried`.
pub async fn respond(
    r: Responder,
    trust_hash: Sha256Digest,
    mut records: Records,
    published: impl Fn(&CoordinationRecord),
    retried: Arc<AtomicUsize>,
) {
    let nodes: Api<Node> = Api::all(r.node.client.clone());
    let certificate_digest = r.id.certificate.digest();
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
                csr_name: r.id.csr_name.clone(),
                csr_uid: Uid::new(r.id.csr_uid.clone()).unwrap(),
                template_hash: HASH.into(),
                trust_hash,
                observed: timestamp(SystemClock.now()).unwrap(),
                status: ReceiptStatus {
                    identity_ready: true,
                    capability_verified: true,
                    protection_armed: true,
                    configuration_applied: true,
                    runtime_healthy: true,
                    certificate_digest,
                },
            };
            let annotation = signed::sign(&receipt, &r.id.key).unwrap();
            let patch = serde_json::json!({"metadata": {"annotations": {
                (RECEIPT_ANNOTATION): annotation}}});
            match nodes
                .patch(&r.node.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    last = Some((record.generation, record.epoch, record.phase));
                    published(&record);
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

/// The one watch of the record: tells `seen` of each new record, when it
/// saw it, and hands the record on through `records` (to every responder).
pub async fn watch_record(
    admin: Client,
    records: watch::Sender<Option<Arc<CoordinationRecord>>>,
    mut seen: impl FnMut(Instant, &CoordinationRecord),
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
        records.send_if_modified(|current| {
            if current.as_deref() == Some(&record) {
                return false;
            }
            seen(at, &record);
            *current = Some(Arc::new(record));
            true
        });
    }
}

/// Tells `round` of each write of the coordination Lease, with the
/// record's phase at that moment: the leader renews it at the start of
/// every round, so the gaps are the rounds' lengths (period + election
/// round + pass).
pub async fn watch_rounds(
    admin: Client,
    records: Records,
    mut round: impl FnMut(Instant, Option<CoordinationPhase>),
) {
    let leases: Api<Lease> = Api::namespaced(admin, NS);
    let config = watcher::Config::default().fields(&format!("metadata.name={LEASE}"));
    let mut events = pin!(watcher(leases, config).default_backoff());
    while let Some(event) = events.next().await {
        if let Ok(Event::Apply(_) | Event::InitApply(_)) = event {
            let phase = records.borrow().as_ref().map(|r| r.phase);
            round(Instant::now(), phase);
        }
    }
}

/// Waits until the shared watch shows a record satisfying `done`, at most
/// until `deadline`; past it, panics with the cohort's status (what the
/// controller says it waits for).
pub async fn until_record(
    records: &mut Records,
    admin: &Client,
    what: &str,
    deadline: Instant,
    done: impl Fn(&CoordinationRecord) -> bool,
) -> Arc<CoordinationRecord> {
    loop {
        if let Some(r) = records.borrow_and_update().clone()
            && done(&r)
        {
            return r;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, records.changed()).await.is_err() {
            let status = Api::<ConfigMap>::namespaced(admin.clone(), NS)
                .get_opt(RECORD)
                .await
                .unwrap()
                .and_then(|m| m.data?.get("status").cloned())
                .unwrap_or_default();
            panic!(
                "not {what} in time; status (first 2,000 bytes): {}",
                &status[..status.len().min(2000)]
            );
        }
    }
}
