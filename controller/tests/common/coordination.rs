//! The enable coordinator's other side, shared by the coordination tests:
//! node identities issued by the controller through each node's Pod-bound
//! token, responders that follow the record as an agent would and publish
//! real signed receipts with that token, and direct reads of the record,
//! the status and OVN's `ipsec` switches.
//!
//! Responders stand in for agents (the agent's own coordinator is built
//! separately), so what these tests prove is the controller's half of the
//! contract against evidence it cannot tell from an agent's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, timestamp};
use kube_ovn_ipsec_api::coordination::{
    CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::signed::{self, SigningKey};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use testbed::ovs::OvnCentral;

use super::{Cluster, HASH, NS, NodeFx, Outcome, csr_object, request_pem, wait_outcome};

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
    let node = &c.nodes[n];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let name = format!("ovn-ipsec-{}", node.name);
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
    let nb = ovsdb::Client::connect_str(&central.nb.address())
        .await
        .unwrap();
    let sb = ovsdb::Client::connect_str(&central.sb.address())
        .await
        .unwrap();
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
    vec![
        "--enable-ipsec",
        "true",
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
