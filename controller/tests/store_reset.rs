//! The controller across an API server restart with its store reset (an etcd
//! restored from an older backup): resourceVersions start over below the one
//! the controller's CSR watch holds, and a CSR created then must still be
//! reconciled — through the server's 410, or through the periodic relist
//! when the server silently waits as kube-apiserver does.
// Test helpers outside #[test] fns panic on failure on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against a real server in real time: deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::time::{Duration, Instant};

use apiserver::{ADMIN_TOKEN, ApiServer, FutureWatch, RESOURCES, Write};
use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use serde_json::json;

/// How long a CSR created after the reset may take to get its outcome.
const BOUND: Duration = Duration::from_secs(15);

fn rv(csr: &CertificateSigningRequest) -> u64 {
    csr.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// Moves the store's resourceVersion `n` versions on, so that the versions
/// the controller holds are far above what the store reaches after a reset.
fn bump(store: &apiserver::Store, n: usize) {
    let configmaps = RESOURCES
        .iter()
        .position(|r| r.plural == "configmaps")
        .unwrap();
    for i in 0..n {
        store
            .write(configmaps, "kube-public", "bump", |_| {
                Ok(Write::Put(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "bump", "namespace": "kube-public"},
                    "data": {"i": i.to_string()}})))
            })
            .unwrap();
    }
}

async fn submit(node: &NodeFx, name: &str) -> CertificateSigningRequest {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let csr = csr_object(name, node, &request_pem(&key, &node.chassis), 7 * 86400);
    let api: Api<CertificateSigningRequest> = Api::all(node.client.clone());
    api.create(&PostParams::default(), &csr).await.unwrap()
}

/// How the store is reset.
enum Reset {
    /// Under open connections: watches end cleanly, no error anywhere, so
    /// only the server's answer to the resumed watch or a resync can help.
    InPlace,
    /// A restart: connections close too.
    Restart,
}

/// Signs a CSR with the store's versions pushed high, resets the store, and
/// checks that a CSR created then, at a lower version than the controller
/// has seen, is signed within [`BOUND`].
async fn csr_after_a_store_reset_is_signed(mut c: Cluster, reset: Reset, resync: &str) {
    let config = c.config_with(&["--resync-period", resync]);
    match reset {
        // As the administrator: until the new store holds the RBAC objects
        // again, the controller's re-watch would fail with a 403, and any
        // error relists by itself (which the restart case may rely on).
        Reset::InPlace => c.start_controller_as(ADMIN_TOKEN, config).await,
        Reset::Restart => c.start_controller(config).await,
    }
    bump(c.server.store(), 300);
    submit(&c.nodes[0], "ovn-ipsec-before").await;
    assert!(matches!(
        wait_outcome(&c.nodes[0].client, "ovn-ipsec-before").await,
        Outcome::Issued(_)
    ));
    let csrs: Api<CertificateSigningRequest> = Api::all(c.admin.clone());
    // The controller's watch delivered this version (its own status write).
    let seen = rv(&csrs.get("ovn-ipsec-before").await.unwrap());

    match reset {
        Reset::InPlace => c.reset_store().await,
        Reset::Restart => c.restart_with_empty_store().await,
    }
    let created = submit(&c.nodes[0], "ovn-ipsec-after").await;
    assert!(
        rv(&created) < seen,
        "the CSR must be below the controller's version: {} vs {seen}",
        rv(&created)
    );
    let t = Instant::now();
    let outcome = wait_outcome(&c.nodes[0].client, "ovn-ipsec-after").await;
    assert!(
        matches!(outcome, Outcome::Issued(_)),
        "after the reset: {outcome:?}"
    );
    assert!(t.elapsed() < BOUND, "took {:?}", t.elapsed());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csr_below_the_last_seen_version_is_signed_through_the_410_without_a_resync() {
    // An hour: the resync cannot be what saves it.
    csr_after_a_store_reset_is_signed(Cluster::start(1).await, Reset::InPlace, "1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csr_below_the_last_seen_version_is_signed_after_an_api_server_restart() {
    csr_after_a_store_reset_is_signed(Cluster::start(1).await, Reset::Restart, "1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resync_signs_a_csr_a_silently_waiting_watch_never_delivers() {
    // The server waits on a watch from a future version, as kube-apiserver
    // does: no 410 comes, only the relist finds the CSR.
    let c = Cluster::start_with(ApiServer::builder().future_watch(FutureWatch::Wait), 1).await;
    csr_after_a_store_reset_is_signed(c, Reset::InPlace, "2s").await;
}
