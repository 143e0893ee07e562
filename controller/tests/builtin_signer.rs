//! The controller with the built-in CA against the embedded API server, RBAC on.
// Test helpers outside #[test] fns panic on failure on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use harness::controller_cluster as common;

use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock};
use kube_ovn_ipsec_api::ident::Chassis;
use kube_ovn_ipsec_api::pki::{Certificate, PEM_CERTIFICATE_REQUEST, TrustBundle, encode_pem};
use kube_ovn_ipsec_api::time::Timestamp;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256};

fn now() -> Timestamp {
    kube_ovn_ipsec_api::clock::timestamp(SystemClock.now()).unwrap()
}

async fn submit(client: &kube::Client, csr: &CertificateSigningRequest) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    api.create(&PostParams::default(), csr).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signs_p256_and_rsa_node_csrs_and_publishes_the_trust_bundle() {
    let mut c = Cluster::start(2).await;
    let config = c.config();
    c.start_controller(config).await;

    let p256 = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let rsa = KeyPair::generate_for(&PKCS_RSA_SHA256).unwrap();
    for (node, key, name) in [
        (&c.nodes[0], &p256, "ovn-ipsec-p256"),
        (&c.nodes[1], &rsa, "ovn-ipsec-rsa"),
    ] {
        submit(
            &node.client,
            &csr_object(name, node, &request_pem(key, &node.chassis), 7 * 86400),
        )
        .await;
    }
    let maps: Api<ConfigMap> = Api::namespaced(c.admin.clone(), NS);
    for (node, key, name) in [
        (&c.nodes[0], &p256, "ovn-ipsec-p256"),
        (&c.nodes[1], &rsa, "ovn-ipsec-rsa"),
    ] {
        let Outcome::Issued(pem) = wait_outcome(&node.client, name).await else {
            panic!("{name} not issued")
        };
        let leaf = Certificate::from_pem(&pem).unwrap();
        leaf.check_chassis_identity(&Chassis::new(node.chassis.as_str()).unwrap())
            .unwrap();
        let trust = maps.get("ovn-ipsec-trust").await.unwrap().data.unwrap()["ca.crt"].clone();
        TrustBundle::from_pem(trust.as_bytes())
            .unwrap()
            .verify_leaf(&leaf, now())
            .unwrap();
        let _ = key;
    }
    let secret: Api<Secret> = Api::namespaced(c.admin.clone(), NS);
    let s = secret.get("ovn-ipsec-ca").await.unwrap();
    assert!(s.data.unwrap().contains_key("tls.key"));
    eventually("two signings counted", || async {
        c.metrics.csr_count("signed", "Signed") == 2
    })
    .await;
    assert!(
        c.metrics
            .encode()
            .unwrap()
            .contains("kube_ovn_ipsec_csr_total")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_csrs_are_denied_through_the_api_with_their_reason_and_never_signed() {
    let mut c = Cluster::start(5).await;
    let config = c.config();
    c.start_controller(config).await;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let n0 = &c.nodes[0];
    let mut cases: Vec<(&str, kube::Client, CertificateSigningRequest, &str)> = Vec::new();

    let mut wrong_uid = csr_object(
        "ovn-ipsec-wrong-uid",
        n0,
        &request_pem(&key, &n0.chassis),
        86400,
    );
    wrong_uid
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kube-ovn.io/ipsec-node-uid".into(), "x".into());
    cases.push((
        "wrong node uid",
        n0.client.clone(),
        wrong_uid,
        "NodeUIDMismatch",
    ));

    let other_cn = csr_object(
        "ovn-ipsec-other-cn",
        n0,
        &request_pem(&key, &c.nodes[1].chassis),
        86400,
    );
    cases.push((
        "CN of another chassis",
        n0.client.clone(),
        other_cn,
        "SubjectMismatch",
    ));

    // Everything names node-1 — only the token says node-0.
    let n1 = &c.nodes[1];
    let claims_n1 = csr_object(
        "ovn-ipsec-node-1",
        n1,
        &request_pem(&key, &n1.chassis),
        86400,
    );
    cases.push((
        "request name matching, binding wrong",
        n0.client.clone(),
        claims_n1,
        "NodeBindingMismatch",
    ));

    let by_admin = csr_object(
        "ovn-ipsec-admin",
        n0,
        &request_pem(&key, &n0.chassis),
        86400,
    );
    cases.push((
        "created by another user",
        c.admin.clone(),
        by_admin,
        "RequesterNotCniServiceAccount",
    ));

    let too_long = csr_object(
        "ovn-ipsec-too-long",
        n0,
        &request_pem(&key, &n0.chassis),
        365 * 86400,
    );
    cases.push((
        "lifetime over the maximum",
        n0.client.clone(),
        too_long,
        "LifetimeOutOfBounds",
    ));

    let garbage = encode_pem(PEM_CERTIFICATE_REQUEST, &[0x30, 0x03, 2, 1, 0]).into_bytes();
    cases.push((
        "garbage request",
        n0.client.clone(),
        csr_object("ovn-ipsec-garbage", n0, &garbage, 86400),
        "MalformedRequest",
    ));

    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), NS);
    let n2 = &c.nodes[2];
    pods.patch(
        &n2.pod_name,
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"metadata": {"labels": {"controller-revision-hash": "oldhash"}}}),
        ),
    )
    .await
    .unwrap();
    cases.push((
        "old template",
        n2.client.clone(),
        csr_object("ovn-ipsec-old", n2, &request_pem(&key, &n2.chassis), 86400),
        "PodTemplateOutdated",
    ));

    // A Pod that has finished: its bound token still authenticates (only a
    // deleted Pod's is refused, below), the controller refuses it.
    let n3 = &c.nodes[3];
    pods.patch_status(
        &n3.pod_name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"phase": "Failed"}})),
    )
    .await
    .unwrap();
    cases.push((
        "finished pod",
        n3.client.clone(),
        csr_object(
            "ovn-ipsec-finished",
            n3,
            &request_pem(&key, &n3.chassis),
            86400,
        ),
        "PodNotLive",
    ));
    // A deleted Pod's token no longer authenticates at all, as on
    // kube-apiserver: its CSR never reaches the controller.
    let n4 = &c.nodes[4];
    pods.delete(&n4.pod_name, &DeleteParams::default())
        .await
        .unwrap();
    let refused = Api::<CertificateSigningRequest>::all(n4.client.clone())
        .create(
            &PostParams::default(),
            &csr_object(
                "ovn-ipsec-deleted",
                n4,
                &request_pem(&key, &n4.chassis),
                86400,
            ),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 401),
        "a deleted Pod's token must be refused: {refused:?}"
    );

    for (_, client, csr, _) in &cases {
        submit(client, csr).await;
    }
    for (what, _, csr, reason) in &cases {
        let name = csr.metadata.name.clone().unwrap();
        assert_eq!(
            wait_outcome(&c.admin, &name).await,
            Outcome::Denied((*reason).into()),
            "{what}"
        );
        eventually(&format!("{what}: denial counted"), || async {
            c.metrics.csr_count("denied", reason) == 1
        })
        .await;
    }
    assert_eq!(c.metrics.csr_count("signed", "Signed"), 0);
    // One Warning event per denial, on the CSR.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(c.admin.clone(), "default");
    for (what, _, _, reason) in &cases {
        eventually(&format!("{what}: Event"), || async {
            let list = events.list(&Default::default()).await.unwrap();
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some(*reason))
        })
        .await;
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_by_someone_else_does_not_bypass_validation() {
    let mut c = Cluster::start(1).await;
    let n0 = &c.nodes[0];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut bad = csr_object(
        "ovn-ipsec-preapproved",
        n0,
        &request_pem(&key, &n0.chassis),
        86400,
    );
    bad.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kube-ovn.io/ipsec-node-uid".into(), "x".into());
    submit(&n0.client, &bad).await;
    // An administrator (or a generic auto-approver) approves before the controller runs.
    let api: Api<CertificateSigningRequest> = Api::all(c.admin.clone());
    let now = chrono::Utc::now().to_rfc3339();
    api.patch_approval(
        "ovn-ipsec-preapproved",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
        "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved",
                                   "message": "", "lastUpdateTime": now}]}})),
    )
    .await
    .unwrap();
    let config = c.config();
    c.start_controller(config).await;
    assert_eq!(
        wait_outcome(&c.admin, "ovn-ipsec-preapproved").await,
        Outcome::Failed("NodeUIDMismatch".into())
    );
    c.stop().await;
}

/// `--live-cache=false`: every check reads the API server directly (the
/// path the cached mode also takes before any denial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_reads_without_the_live_cache_sign_and_deny() {
    let mut c = Cluster::start(2).await;
    let mut config = c.config();
    config.live_cache = false;
    c.start_controller(config).await;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let pods: Api<Pod> = Api::namespaced(c.admin.clone(), NS);
    let n1 = &c.nodes[1];
    pods.patch(
        &n1.pod_name,
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"metadata": {"labels": {"controller-revision-hash": "oldhash"}}}),
        ),
    )
    .await
    .unwrap();
    let n0 = &c.nodes[0];
    submit(
        &n0.client,
        &csr_object("ovn-ipsec-ok", n0, &request_pem(&key, &n0.chassis), 86400),
    )
    .await;
    submit(
        &n1.client,
        &csr_object("ovn-ipsec-old", n1, &request_pem(&key, &n1.chassis), 86400),
    )
    .await;
    assert!(matches!(
        wait_outcome(&c.admin, "ovn-ipsec-ok").await,
        Outcome::Issued(_)
    ));
    assert_eq!(
        wait_outcome(&c.admin, "ovn-ipsec-old").await,
        Outcome::Denied("PodTemplateOutdated".into())
    );
    c.stop().await;
}
