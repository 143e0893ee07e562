//! The coordinator's other side, shared by the coordination tests: node
//! identities issued by the controller through each node's Pod-bound
//! token, responders that follow the record as an agent would and publish
//! real signed receipts with that token, release receipts as the cleanup
//! init container publishes them, direct reads of the record, the status
//! and OVN's `ipsec` switches, and the setting the tests share ([`Setup`]:
//! the cluster, OVN with ovn-northd, the controller, the responders).
//!
//! Responders stand in for agents (the agent's own coordinator is built
//! separately), so what these tests prove is the controller's half of the
//! contract against evidence it cannot tell from an agent's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, timestamp};
use kube_ovn_ipsec_api::coordination::{
    CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus, ReleaseReceipt, ReleaseStatus,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::signed::{self, SigningKey};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use testbed::ovs::OvnCentral;

use tokio::time::Instant;

use super::{
    CNI_SA, Cluster, HASH, NS, NodeFx, Outcome, csr_object, mint_token, request_pem, wait_outcome,
};

/// The coordination ConfigMap (record under `state`, status under `status`).
pub const COORDINATION_CONFIGMAP: &str = "ovn-ipsec-coordination";

/// A node's identity as its agent would hold it.
#[derive(Clone)]
pub struct Identity {
    /// The node's IPsec private key.
    pub key: Arc<SigningKey>,
    /// The certificate the controller issued for it.
    pub certificate: Certificate,
    /// The CSR it was issued through (named in every receipt).
    pub csr_name: String,
    /// That CSR's UID.
    pub csr_uid: String,
}

/// Has the controller issue node `n` a certificate through its own token
/// (a controller must be running and signing).
pub async fn identity(c: &Cluster, n: usize) -> Identity {
    identity_as(c, n, &format!("ovn-ipsec-{}", c.nodes[n].name)).await
}

/// [`identity`] through a CSR named `name` (a node's second identity, e.g.
/// its new agent Pod's after a re-enable, needs another name).
pub async fn identity_as(c: &Cluster, n: usize, name: &str) -> Identity {
    let node = &c.nodes[n];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let name = name.to_owned();
    let created = Api::<CertificateSigningRequest>::all(node.client.clone())
        .create(
            &PostParams::default(),
            &csr_object(&name, node, &request_pem(&key, &node.chassis), 86400),
        )
        .await
        .unwrap();
    let Outcome::Issued(pem) = wait_outcome(&c.admin, &name).await else {
        panic!("{name} not issued")
    };
    Identity {
        key: Arc::new(SigningKey::from_pkcs8_der(&key.serialize_der()).unwrap()),
        certificate: Certificate::from_pem(&pem).unwrap(),
        csr_name: name,
        csr_uid: created.uid().unwrap(),
    }
}

/// The stored record, if there is one and it decodes.
pub async fn record(admin: &Client) -> Option<CoordinationRecord> {
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .get_opt(COORDINATION_CONFIGMAP)
        .await
        .unwrap()?;
    CoordinationRecord::decode(cm.data?.get("state")?.as_bytes()).ok()
}

/// The controller's leader-election Lease, if it exists.
pub async fn lease(admin: &Client) -> Option<k8s_openapi::api::coordination::v1::LeaseSpec> {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), NS)
        .get_opt(controller::coordination::leader::LEASE_NAME)
        .await
        .unwrap()
        .and_then(|l| l.spec)
}

/// The cohort's status as the leader last wrote it (`null` before).
pub async fn status(admin: &Client) -> serde_json::Value {
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .get_opt(COORDINATION_CONFIGMAP)
        .await
        .unwrap();
    cm.and_then(|c| c.data?.get("status").cloned())
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or_default()
}

/// Synchronous reads of `NB_Global.ipsec` and `SB_Global.ipsec` (SB reads
/// false until ovn-northd has created its row).
pub async fn nb_sb(central: &OvnCentral) -> (bool, bool) {
    nb_sb_at(&central.nb.address(), &central.sb.address()).await
}

/// [`nb_sb`] of the databases at `nb` and `sb` (a task that cannot hold
/// the [`OvnCentral`]).
pub async fn nb_sb_at(nb: &str, sb: &str) -> (bool, bool) {
    let nb = ovsdb::Client::connect_str(nb).await.unwrap();
    let sb = ovsdb::Client::connect_str(sb).await.unwrap();
    let v = (
        nb.read_nb_ipsec().await.unwrap(),
        sb.read_sb_ipsec().await.unwrap_or(false),
    );
    nb.close();
    sb.close();
    v
}

/// The controller's flags for the coordinator against NB `nb`, SB `sb`,
/// as replica `pod`: enable wanted, a 1 s period and a 3 s Lease so a
/// test sees several passes and a takeover within seconds.
pub fn flags<'a>(nb: &'a str, sb: &'a str, pod: &'a str) -> Vec<&'a str> {
    flags_wanting(true, nb, sb, pod)
}

/// [`flags`] with the operator's intent `enable` (`--enable-ipsec`).
pub fn flags_wanting<'a>(enable: bool, nb: &'a str, sb: &'a str, pod: &'a str) -> Vec<&'a str> {
    vec![
        "--enable-ipsec",
        if enable { "true" } else { "false" },
        "--ovn-nb",
        nb,
        "--ovn-sb",
        sb,
        "--coordination-period",
        "1s",
        "--lease-duration",
        "3s",
        "--pod-name",
        pod,
    ]
}

/// Every flag up (satisfies both barriers), naming the certificate the
/// receipt is signed with. Built here rather than taken from the api's
/// test utilities so the bench binaries that share this fixture need no
/// test-only feature.
fn ready_status(certificate_digest: Sha256Digest) -> ReceiptStatus {
    ReceiptStatus {
        identity_ready: true,
        capability_verified: true,
        protection_armed: true,
        configuration_applied: true,
        runtime_healthy: true,
        certificate_digest,
    }
}

/// Follows the record as an agent would, and publishes signed receipts
/// with `signer`'s key (the node's own, or — to fake — another's):
/// - a target, for every new (generation, epoch) of `Prepare`/`Arm`;
/// - a node that is not a target while the record is `Enabled` (the
///   agent's admission contract): a `Prepare` receipt (identity and
///   capability) for the record's generation and epoch, then, once
///   `may_arm` is set, an `Arm` receipt with every flag; again for each new
///   epoch (an `Arm` receipt straight away once it has armed).
///
/// Each receipt names the Node's UID as it is now (a re-created Node has
/// another).
pub async fn respond(
    c_admin: Client,
    node: NodeFx,
    id: Identity,
    signer: Arc<SigningKey>,
    may_arm: Arc<AtomicBool>,
) {
    let nodes: Api<Node> = Api::all(node.client.clone());
    let mut last = None;
    let mut armed = false;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(r) = record(&c_admin).await else {
            continue;
        };
        let target = r.targets.contains_key(&node.name);
        let ready = ready_status(id.certificate.digest());
        let (phase, status) = match r.phase {
            CoordinationPhase::Prepare | CoordinationPhase::Arm if target => (r.phase, ready),
            CoordinationPhase::Enabled if !target => {
                let prepared_here =
                    last == Some((r.generation, r.epoch, CoordinationPhase::Prepare));
                if armed || (prepared_here && may_arm.load(Ordering::SeqCst)) {
                    (CoordinationPhase::Arm, ready)
                } else {
                    let prepared = ReceiptStatus {
                        protection_armed: false,
                        configuration_applied: false,
                        runtime_healthy: false,
                        ..ready
                    };
                    (CoordinationPhase::Prepare, prepared)
                }
            }
            _ => continue,
        };
        let key = (r.generation, r.epoch, phase);
        if last == Some(key) {
            continue;
        }
        let Ok(live) = nodes.get(&node.name).await else {
            continue;
        };
        let trust = Api::<ConfigMap>::namespaced(node.client.clone(), NS)
            .get("ovn-ipsec-trust")
            .await
            .unwrap();
        let trust = TrustBundle::from_pem(trust.data.unwrap()["ca.crt"].as_bytes()).unwrap();
        let receipt = Receipt {
            generation: r.generation,
            epoch: r.epoch,
            phase,
            node_name: node.name.clone(),
            node_uid: Uid::new(live.uid().unwrap()).unwrap(),
            pod_uid: Uid::new(node.pod_uid.clone()).unwrap(),
            csr_name: id.csr_name.clone(),
            csr_uid: Uid::new(id.csr_uid.clone()).unwrap(),
            template_hash: HASH.into(),
            trust_hash: trust.digest(),
            observed: timestamp(SystemClock.now()).unwrap(),
            status,
        };
        let annotation = signed::sign(&receipt, &signer).unwrap();
        let patch = serde_json::json!({"metadata": {"annotations": {"kube-ovn.io/ipsec-receipt": annotation}}});
        if nodes
            .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            last = Some(key);
            armed |= !target && phase == CoordinationPhase::Arm;
        }
    }
}

/// A responder for node `n` with its own key, arming at once.
pub fn responder(c: &Cluster, n: usize, id: &Identity) -> tokio::task::JoinHandle<()> {
    tokio::spawn(respond(
        c.admin.clone(),
        c.nodes[n].clone(),
        id.clone(),
        id.key.clone(),
        Arc::new(AtomicBool::new(true)),
    ))
}

/// Node `n`'s signed release receipt for the stored `Release` record, as
/// the cleanup init container of its current Pod publishes it (SPEC §8):
/// the record's generation, epoch and challenge, the Node's UID and the
/// Pod's template hash as they are live, signed with the key of `id` (the
/// node's last identity, issued through its old agent Pod) — after
/// `tweak` — and published on the Node with the Pod's token. Returns the
/// receipt as published.
pub async fn publish_release(
    c: &Cluster,
    n: usize,
    id: &Identity,
    tweak: impl FnOnce(&mut ReleaseReceipt),
) -> ReleaseReceipt {
    let node = &c.nodes[n];
    let r = record(&c.admin).await.unwrap();
    assert_eq!(r.phase, CoordinationPhase::Release, "{r:?}");
    let nodes: Api<Node> = Api::all(node.client.clone());
    let live = nodes.get(&node.name).await.unwrap();
    let pod = Api::<Pod>::namespaced(c.admin.clone(), NS)
        .get(&node.pod_name)
        .await
        .unwrap();
    let trust = Api::<ConfigMap>::namespaced(node.client.clone(), NS)
        .get("ovn-ipsec-trust")
        .await
        .unwrap();
    let trust = TrustBundle::from_pem(trust.data.unwrap()["ca.crt"].as_bytes()).unwrap();
    let mut receipt = ReleaseReceipt {
        generation: r.generation,
        epoch: r.epoch,
        phase: CoordinationPhase::Release,
        node_name: node.name.clone(),
        node_uid: Uid::new(live.uid().unwrap()).unwrap(),
        pod_uid: Uid::new(node.pod_uid.clone()).unwrap(),
        csr_name: id.csr_name.clone(),
        csr_uid: Uid::new(id.csr_uid.clone()).unwrap(),
        template_hash: pod.labels()["controller-revision-hash"].clone(),
        trust_hash: trust.digest(),
        observed: timestamp(SystemClock.now()).unwrap(),
        challenge: r.challenge.unwrap(),
        status: ReleaseStatus {
            lease_withdrawn: true,
            guards_removed: true,
            identity_cleared: true,
            drained: true,
            boot_id: "6f1d4b9e-2c1a-4a57-9c3e-0d9b5e1f7a21".parse().unwrap(),
            certificate_digest: id.certificate.digest(),
        },
        certificate: id.certificate.to_pem(),
    };
    tweak(&mut receipt);
    let annotation = signed::sign(&receipt, &id.key).unwrap();
    let patch = serde_json::json!({"metadata": {"annotations": {
        "kube-ovn.io/ipsec-release-receipt": annotation}}});
    nodes
        .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    receipt
}

/// Whether a Warning Event on Node `node` has reason `reason`.
pub async fn node_event(admin: &Client, node: &str, reason: &str) -> bool {
    Api::<Event>::namespaced(admin.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some(reason) && e.involved_object.name.as_deref() == Some(node)
        })
}

/// The cluster, OVN with ovn-northd, the in-process controller with the
/// coordinator on, and the responders standing in for agents.
pub struct Setup {
    /// The cluster and its controller.
    pub c: Cluster,
    /// NB and SB with ovn-northd.
    pub central: OvnCentral,
    /// Where OVN keeps its databases.
    pub dir: tempfile::TempDir,
    /// The enable-side responders (abort them before `c.stop()`).
    pub responders: Vec<tokio::task::JoinHandle<()>>,
}

/// A [`Setup`] of `nodes` nodes with enable wanted, and an identity and a
/// responder per node except `held` (node `forged`'s signs with node 0's
/// key). With `late`, the last node has no CNI Pod (the DaemonSet does not
/// schedule to it yet), no identity and no responder.
pub async fn setup_with(
    nodes: usize,
    forged: Option<usize>,
    held: Option<usize>,
    late: bool,
) -> (Setup, Vec<Identity>) {
    setup_on(nodes, forged, held, late, false).await
}

/// A [`setup`] of `nodes` nodes whose NB and SB the controller reaches
/// over SSL only, as with Kube-OVN's `ENABLE_SSL`
/// ([`OvnCentral::start_ssl`]: ovs-pki's certificates, ovn-northd over
/// SSL too).
pub async fn setup_over_ssl(nodes: usize) -> (Setup, Vec<Identity>) {
    setup_on(nodes, None, None, false, true).await
}

async fn setup_on(
    nodes: usize,
    forged: Option<usize>,
    held: Option<usize>,
    late: bool,
    ssl: bool,
) -> (Setup, Vec<Identity>) {
    let dir = tempfile::tempdir().unwrap();
    let (central, remotes) = if ssl {
        let (central, remotes) = OvnCentral::start_ssl(dir.path()).unwrap();
        (central, Some(remotes))
    } else {
        (OvnCentral::start(dir.path()).unwrap(), None)
    };
    let mut c = Cluster::start(nodes).await;
    let early = nodes - usize::from(late);
    if late {
        Api::<Pod>::namespaced(c.admin.clone(), NS)
            .delete(&c.nodes[early].pod_name, &Default::default())
            .await
            .unwrap();
    }
    let (nb, sb) = match &remotes {
        Some(r) => (r.nb.clone(), r.sb.clone()),
        None => (central.nb.address(), central.sb.address()),
    };
    let mut args = flags(&nb, &sb, "controller-0");
    let files: Vec<String> = remotes
        .iter()
        .flat_map(|r| {
            [
                format!("--ovn-ssl-private-key={}", r.client.private_key.display()),
                format!("--ovn-ssl-certificate={}", r.client.certificate.display()),
                format!("--ovn-ssl-ca-cert={}", r.client.ca_cert.display()),
            ]
        })
        .collect();
    args.extend(files.iter().map(String::as_str));
    let config = c.config_with(&args);
    c.start_controller(config).await;
    let mut ids = Vec::new();
    for n in 0..early {
        ids.push(identity(&c, n).await);
    }
    let responders = (0..early)
        .filter(|n| Some(*n) != held)
        .map(|n| {
            let signer = match forged {
                Some(f) if f == n => ids[0].key.clone(),
                _ => ids[n].key.clone(),
            };
            tokio::spawn(respond(
                c.admin.clone(),
                c.nodes[n].clone(),
                ids[n].clone(),
                signer,
                Arc::new(AtomicBool::new(true)),
            ))
        })
        .collect();
    (
        Setup {
            c,
            central,
            dir,
            responders,
        },
        ids,
    )
}

/// The DaemonSet schedules to the late node `n` of a [`setup_with`]: its
/// CNI Pod, a token bound to it, an identity issued through that token.
pub async fn schedule_late(s: &mut Setup, n: usize) -> Identity {
    let pods: Api<Pod> = Api::namespaced(s.c.admin.clone(), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("kube-ovn-cni-{n}-late"), "namespace": NS,
                     "labels": {"app": "kube-ovn-cni", "controller-revision-hash": HASH},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "kube-ovn-cni", "uid": s.c.ds_uid,
                                          "controller": true}]},
        "spec": {"nodeName": s.c.nodes[n].name, "serviceAccountName": CNI_SA,
                 "containers": [{"name": "cni-server", "image": "kube-ovn"}]}
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let joiner = &mut s.c.nodes[n];
    joiner.pod_name = pod.name_any();
    joiner.pod_uid = pod.uid().unwrap();
    joiner.token = mint_token(
        &s.c.admin,
        CNI_SA,
        Some((&joiner.pod_name, &joiner.pod_uid)),
    )
    .await;
    joiner.client = s.c.server.client(&joiner.token).await.unwrap();
    identity(&s.c, n).await
}

/// [`setup_with`] every node scheduled.
pub async fn setup(
    nodes: usize,
    forged: Option<usize>,
    held: Option<usize>,
) -> (Setup, Vec<Identity>) {
    setup_with(nodes, forged, held, false).await
}

impl Setup {
    /// Restarts the controller (same replica name: it renews its own Lease
    /// at once) with the operator's intent `enable`, as a chart upgrade
    /// that flips `--enable-ipsec` does.
    pub async fn restart_controller(&mut self, enable: bool) {
        self.c.kill_controller();
        let (nb, sb) = (self.central.nb.address(), self.central.sb.address());
        let config = self
            .c
            .config_with(&flags_wanting(enable, &nb, &sb, "controller-0"));
        self.c.start_controller(config).await;
    }

    /// Stops the responders, the controller and the API server.
    pub async fn stop(self) {
        for h in self.responders {
            h.abort();
        }
        self.c.stop().await;
    }
}

/// Polls until the record is `Enabled`, returning the phases seen in order
/// (from the first record seen) and the phase the record had when NB
/// first read true.
pub async fn until_enabled(
    s: &Setup,
    limit: Duration,
) -> (Vec<CoordinationPhase>, Option<CoordinationPhase>) {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let mut nb_first_true_in = None;
    let deadline = Instant::now() + limit;
    loop {
        let r = record(&s.c.admin).await;
        let (nb, sb) = nb_sb(&s.central).await;
        if let Some(r) = &r {
            if seen.last() != Some(&r.phase) {
                println!("{:?} epoch {} after {:?}", r.phase, r.epoch, t0.elapsed());
                seen.push(r.phase);
            }
            if nb && nb_first_true_in.is_none() {
                nb_first_true_in = Some(r.phase);
            }
            if r.phase == CoordinationPhase::Enabled {
                assert!(nb && sb, "Enabled with NB {nb} SB {sb}");
                return (seen, nb_first_true_in);
            }
        }
        assert!(
            Instant::now() < deadline,
            "not Enabled in {limit:?}: {r:?}\nstatus: {}",
            status(&s.c.admin).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the record until `pred` holds (bounded by `limit`).
pub async fn until_record(
    s: &Setup,
    what: &str,
    limit: Duration,
    pred: impl Fn(&CoordinationRecord) -> bool,
) -> CoordinationRecord {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(r) = record(&s.c.admin).await
            && pred(&r)
        {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}: {:?}\nstatus: {}",
            record(&s.c.admin).await,
            status(&s.c.admin).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls the status until node `n`'s entry satisfies `pred` (30 s).
pub async fn until_node_status(s: &Setup, n: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&s.c.admin).await;
        if let Some(v) = st["nodes"][n].as_str()
            && pred(v)
        {
            return v.to_owned();
        }
        assert!(Instant::now() < deadline, "{n}'s status: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls the status until its reason satisfies `pred` (30 s).
pub async fn until_reason(s: &Setup, pred: impl Fn(&str) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&s.c.admin).await;
        if st["reason"].as_str().is_some_and(&pred) {
            return st;
        }
        assert!(Instant::now() < deadline, "status reason: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the controller binary `bin` (the test's
/// `env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller")`) against the
/// embedded API server as admin: whether it succeeded, and its output.
pub fn controller_cli(bin: &str, s: &Setup, args: &[&str]) -> (bool, String) {
    let kubeconfig = s.dir.path().join("admin.kubeconfig");
    s.c.server
        .write_kubeconfig(&kubeconfig, apiserver::ADMIN_TOKEN)
        .unwrap();
    controller_cli_as(bin, &kubeconfig, args)
}

/// Runs the controller binary `bin` with `kubeconfig` in namespace
/// [`NS`], as an operator does: whether it succeeded, and its stdout and
/// stderr.
pub fn controller_cli_as(bin: &str, kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(bin)
        .args(["--namespace", NS])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
