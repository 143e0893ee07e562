//! cert-manager mode against the embedded API server, RBAC on: the
//! production `KubeCertificateRequests` client, the operator-provided trust
//! ConfigMap, a ClusterIssuer object and an in-test issuer that answers
//! approved CertificateRequests as cert-manager's CA issuer does. The
//! server stamps `spec.username` on create as cert-manager's webhook does,
//! so the controller's requester check sees what it would see on a cluster.
// Test helpers outside #[test] fns panic on failure on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use harness::controller_cluster as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use common::*;
use controller::certmanager::CSR_UID_LABEL;
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock};
use kube_ovn_ipsec_api::ident::Chassis;
use kube_ovn_ipsec_api::names::k8s::{TRUST_CONFIGMAP, TRUST_CONFIGMAP_KEY};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::test_util::{CaSpec, TestCa};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use serde_json::{Value, json};

/// The dedicated ClusterIssuer the controller is configured with.
const ISSUER: &str = "kube-ovn-ipsec";
/// The controller's ServiceAccount as cert-manager's webhook records it.
const CONTROLLER_USERNAME: &str = "system:serviceaccount:kube-system:kube-ovn-ipsec-controller";
/// Bound on this file's own waits (`wait_outcome` and `eventually` from
/// `common` bound theirs at 10 s).
const WAIT: Duration = Duration::from_secs(20);

fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_default())
        .unwrap()
}

/// An external issuer's CA (`CN` only), as in the unit tests.
fn issuer_ca(cn: &str) -> TestCa {
    CaSpec::new(cn).without_organization().self_signed()
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", kind),
        plural,
    )
}

fn certificate_requests(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NS,
        &resource("CertificateRequest", "certificaterequests"),
    )
}

/// Waits up to [`WAIT`] for `check` to yield a value, polling every 50 ms.
async fn within<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{what}: not within {} s", WAIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the operator provides in cert-manager mode: the trust ConfigMap
/// holding the issuer's CA, and the ClusterIssuer (a CA issuer).
async fn provision(c: &Cluster, trusted: &TestCa) {
    let maps: Api<ConfigMap> = Api::namespaced(c.admin.clone(), NS);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": TRUST_CONFIGMAP, "namespace": NS},
        "data": {TRUST_CONFIGMAP_KEY: trusted.cert_pem()},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    let issuers: Api<DynamicObject> = Api::all_with(
        c.admin.clone(),
        &resource("ClusterIssuer", "clusterissuers"),
    );
    let issuer: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
        "metadata": {"name": ISSUER},
        "spec": {"ca": {"secretName": "kube-ovn-ipsec-issuer-ca"}},
    }))
    .unwrap();
    issuers
        .create(&PostParams::default(), &issuer)
        .await
        .unwrap();
}

/// One answer the issuer wrote.
#[derive(Clone, Debug)]
struct Issued {
    name: String,
    uid: String,
    leaf_pem: String,
}

/// The in-test issuer: watches CertificateRequests in the controller's
/// namespace and, for each that names the ClusterIssuer, is `Approved` and
/// not yet answered, writes what cert-manager's CA issuer writes —
/// `status.certificate` (base64 PEM leaf signed from `spec.request` for
/// `spec.duration`), `status.ca` and `Ready=True` — signing with `signing`.
struct IssuerTask {
    issued: Arc<Mutex<Vec<Issued>>>,
    task: tokio::task::JoinHandle<()>,
}

impl IssuerTask {
    fn start(admin: kube::Client, signing: Arc<TestCa>) -> Self {
        let issued = Arc::new(Mutex::new(Vec::new()));
        let record = issued.clone();
        let task = tokio::spawn(async move {
            let api = certificate_requests(&admin);
            let mut events = watcher(api.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            // rcgen derives the serial from the key when none is set: two
            // answers for one key would be byte-identical. cert-manager
            // picks a random serial; a counter is enough to tell them apart.
            let mut serial = 1u64;
            // A watch error is retried (after the backoff), not the end.
            while let Some(event) = events.next().await {
                let Ok(cr) = event else { continue };
                if !ready_to_issue(&cr) {
                    continue;
                }
                let request = String::from_utf8(unb64(&cr.data["spec"]["request"])).unwrap();
                let secs: u64 = cr.data["spec"]["duration"]
                    .as_str()
                    .and_then(|d| d.strip_suffix('s'))
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(90 * 86400);
                serial += 1;
                let leaf_pem = signing
                    .sign_request(&request)
                    .issued_at(SystemClock.now(), Duration::from_secs(secs))
                    .tweak(|p| p.serial_number = Some(serial.into()))
                    .pem();
                let mut conditions = cr.data["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                conditions.push(json!({
                    "type": "Ready", "status": "True", "reason": "Issued",
                    "message": "Certificate fetched from issuer successfully",
                    "lastTransitionTime": chrono::Utc::now().to_rfc3339(),
                }));
                let patch = json!({"status": {
                    "certificate": b64(&leaf_pem),
                    "ca": b64(signing.cert_pem()),
                    "conditions": conditions,
                }});
                let name = cr.metadata.name.clone().unwrap();
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                record.lock().unwrap().push(Issued {
                    name,
                    uid: cr.metadata.uid.clone().unwrap(),
                    leaf_pem,
                });
            }
        });
        IssuerTask { issued, task }
    }

    fn issued(&self) -> Vec<Issued> {
        self.issued.lock().unwrap().clone()
    }

    /// Waits until the issuer has answered the request `name` with `uid`.
    async fn wait_issued(&self, name: &str, uid: &str) -> Issued {
        within(
            &format!("issuer answering CertificateRequest {name} ({uid})"),
            || async {
                self.issued()
                    .into_iter()
                    .find(|i| i.name == name && i.uid == uid)
            },
        )
        .await
    }
}

impl Drop for IssuerTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// cert-manager's CA issuer acts on a request for it that is Approved, not
/// Denied and not yet Ready.
fn ready_to_issue(cr: &DynamicObject) -> bool {
    let spec = &cr.data["spec"];
    let conditions = cr.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| {
        conditions
            .iter()
            .any(|c| c["type"] == t && c["status"] == "True")
    };
    spec["issuerRef"]["name"] == ISSUER
        && spec["issuerRef"]["kind"] == "ClusterIssuer"
        && spec["issuerRef"]["group"] == "cert-manager.io"
        && has("Approved")
        && !has("Denied")
        && !conditions.iter().any(|c| c["type"] == "Ready")
}

fn cert_manager_flags() -> [&'static str; 3] {
    [
        "--cert-manager-ipsec-cert=true",
        "--cert-manager-issuer-name",
        ISSUER,
    ]
}

async fn submit(node: &NodeFx, name: &str, key: &KeyPair) -> CertificateSigningRequest {
    let api: Api<CertificateSigningRequest> = Api::all(node.client.clone());
    let csr = csr_object(name, node, &request_pem(key, &node.chassis), 7 * 86400);
    api.create(&PostParams::default(), &csr).await.unwrap()
}

/// Records every version of the CSR `name` a watch delivers, from before it
/// is submitted: a certificate written and removed again would still show.
struct CsrWatch {
    seen: Arc<Mutex<Vec<CertificateSigningRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CsrWatch {
    fn start(admin: &kube::Client, name: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                if let Ok(csr) = event {
                    record.lock().unwrap().push(csr);
                }
            }
        });
        CsrWatch { seen, task }
    }

    /// Waits until the watch has delivered `outcome` (so it was live up to
    /// the end), stops it, and returns every certificate it saw.
    async fn finish(self, outcome: &Outcome) -> Vec<Vec<u8>> {
        within(&format!("the CSR watch delivering {outcome:?}"), || async {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .any(|csr| common::outcome(csr).as_ref() == Some(outcome))
                .then_some(())
        })
        .await;
        self.task.abort();
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|csr| csr.status.as_ref()?.certificate.as_ref())
            .filter(|c| !c.0.is_empty())
            .map(|c| c.0.clone())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_request_is_issued_by_the_cluster_issuer_and_chains_to_the_trust_bundle() {
    let mut c = Cluster::start(1).await;
    let ca = Arc::new(issuer_ca("cert-manager issuer CA"));
    provision(&c, &ca).await;
    let issuer = IssuerTask::start(c.admin.clone(), ca.clone());
    let config = c.config_with(&cert_manager_flags());
    c.start_controller(config).await;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let n0 = &c.nodes[0];
    let csr = submit(n0, "ovn-ipsec-cm", &key).await;
    let Outcome::Issued(pem) = wait_outcome(&n0.client, "ovn-ipsec-cm").await else {
        panic!("ovn-ipsec-cm not issued")
    };

    let leaf = Certificate::from_pem(&pem).unwrap();
    leaf.check_chassis_identity(&Chassis::new(n0.chassis.as_str()).unwrap())
        .unwrap();
    let now = kube_ovn_ipsec_api::clock::timestamp(SystemClock.now()).unwrap();
    TrustBundle::from_pem(&ca.trust_pem())
        .unwrap()
        .verify_leaf(&leaf, now)
        .unwrap();

    // The request behind it: created by the controller's ServiceAccount (as
    // the server stamped it), labelled with the CSR's UID, approved by the
    // controller, and answered exactly once by the issuer — with what the
    // CSR now carries.
    let cr = certificate_requests(&c.admin)
        .get("ovn-ipsec-cm")
        .await
        .unwrap();
    let csr_uid = csr.metadata.uid.clone().unwrap();
    assert_eq!(
        cr.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CSR_UID_LABEL)),
        Some(&csr_uid)
    );
    assert_eq!(cr.data["spec"]["username"], CONTROLLER_USERNAME);
    assert_eq!(cr.data["spec"]["issuerRef"]["name"], ISSUER);
    assert_eq!(unb64(&cr.data["spec"]["request"]), request_pem_of(&csr));
    let approved = cr.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Approved")
        .cloned()
        .expect("the controller approved its CertificateRequest");
    assert_eq!(approved["status"], "True");
    let answered = issuer.issued();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0].uid, cr.metadata.uid.clone().unwrap());
    assert_eq!(answered[0].leaf_pem.as_bytes(), pem.as_slice());
    eventually("the signing counted", || async {
        c.metrics.csr_count("signed", "Signed") == 1
    })
    .await;
    drop(issuer);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_from_a_ca_outside_the_trust_bundle_fails_the_csr_and_is_never_copied() {
    let mut c = Cluster::start(1).await;
    let trusted = issuer_ca("cert-manager issuer CA");
    provision(&c, &trusted).await;
    // The ClusterIssuer signs with a CA the operator did not put in the bundle.
    let issuer = IssuerTask::start(c.admin.clone(), Arc::new(issuer_ca("someone else's CA")));
    let watch = CsrWatch::start(&c.admin, "ovn-ipsec-cm-bad");
    let config = c.config_with(&cert_manager_flags());
    c.start_controller(config).await;

    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let n0 = &c.nodes[0];
    submit(n0, "ovn-ipsec-cm-bad", &key).await;
    let failed = Outcome::Failed("CertManagerChainUntrusted".into());
    assert_eq!(wait_outcome(&c.admin, "ovn-ipsec-cm-bad").await, failed);
    // It failed on the issuer's answer, not for want of one.
    let cr = certificate_requests(&c.admin)
        .get("ovn-ipsec-cm-bad")
        .await
        .unwrap();
    issuer
        .wait_issued("ovn-ipsec-cm-bad", &cr.metadata.uid.clone().unwrap())
        .await;
    eventually("the failure counted", || async {
        c.metrics.csr_count("failed", "CertManagerChainUntrusted") == 1
    })
    .await;
    assert_eq!(c.metrics.csr_count("signed", "Signed"), 0);
    let csr = Api::<CertificateSigningRequest>::all(c.admin.clone())
        .get("ovn-ipsec-cm-bad")
        .await
        .unwrap();
    assert!(
        csr.status
            .and_then(|s| s.certificate)
            .is_none_or(|c| c.0.is_empty()),
        "the untrusted leaf reached the CSR"
    );
    assert_eq!(
        watch.finish(&failed).await,
        Vec::<Vec<u8>>::new(),
        "the CSR carried a certificate at some point"
    );
    drop(issuer);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_planted_under_the_csr_name_is_replaced_not_read() {
    let mut c = Cluster::start(1).await;
    let ca = Arc::new(issuer_ca("cert-manager issuer CA"));
    provision(&c, &ca).await;
    let issuer = IssuerTask::start(c.admin.clone(), ca.clone());
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let n0_client = c.nodes[0].client.clone();
    // The CSR is submitted before the controller runs, so the planted
    // request can copy everything of it: name, CSR-UID label, request bytes.
    let csr = submit(&c.nodes[0], "ovn-ipsec-cm-planted", &key).await;
    let crs = certificate_requests(&c.admin);
    let planted: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
        "metadata": {"name": "ovn-ipsec-cm-planted", "namespace": NS,
                     "labels": {CSR_UID_LABEL: csr.metadata.uid.clone().unwrap()}},
        "spec": {"request": b64(request_pem_of(&csr)),
                 "issuerRef": {"name": ISSUER, "kind": "ClusterIssuer", "group": "cert-manager.io"},
                 "duration": format!("{}s", 7 * 86400), "usages": ["ipsec tunnel"], "isCA": false,
                 // Written by the client; the server replaces it with the admin's name.
                 "username": CONTROLLER_USERNAME},
    }))
    .unwrap();
    let planted = crs.create(&PostParams::default(), &planted).await.unwrap();
    assert_ne!(planted.data["spec"]["username"], CONTROLLER_USERNAME);
    let planted_uid = planted.metadata.uid.clone().unwrap();
    crs.patch_status(
        "ovn-ipsec-cm-planted",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "Admin", "message": "",
            "lastTransitionTime": chrono::Utc::now().to_rfc3339()}]}})),
    )
    .await
    .unwrap();
    // The ClusterIssuer answers it: a certificate that would pass every
    // check on the result itself.
    let planted_leaf = issuer
        .wait_issued("ovn-ipsec-cm-planted", &planted_uid)
        .await;

    let config = c.config_with(&cert_manager_flags());
    c.start_controller(config).await;
    let Outcome::Issued(pem) = wait_outcome(&n0_client, "ovn-ipsec-cm-planted").await else {
        panic!("ovn-ipsec-cm-planted not issued")
    };
    assert_ne!(
        pem,
        planted_leaf.leaf_pem.as_bytes(),
        "the planted request's certificate was copied"
    );
    let cr = crs.get("ovn-ipsec-cm-planted").await.unwrap();
    let cr_uid = cr.metadata.uid.clone().unwrap();
    assert_ne!(cr_uid, planted_uid, "the planted request was not replaced");
    assert_eq!(cr.data["spec"]["username"], CONTROLLER_USERNAME);
    let ours = issuer.wait_issued("ovn-ipsec-cm-planted", &cr_uid).await;
    assert_eq!(ours.leaf_pem.as_bytes(), pem.as_slice());
    assert_eq!(issuer.issued().len(), 2);
    drop(issuer);
    c.stop().await;
}

/// The PEM request a CSR carries.
fn request_pem_of(csr: &CertificateSigningRequest) -> Vec<u8> {
    csr.spec.request.0.clone()
}
