//! The whole tree under the supervisor: RSA-2048 (the default), real
//! Prometheus metrics, children killed and respawned mid-flight.

use super::*;
use crate::clock::TokioClock;
use crate::identity::{self, IdentityMsg};
use crate::metrics::PrometheusMetrics;
use crate::testing::{CsrScript, FakeCsrApi, FakeOvsdb, TestCa};
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::status::Phase;
use std::time::{Duration, UNIX_EPOCH};
use tokio::time::Instant;

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The identity of the node every tree test runs as, its key directory
/// under `dir`, with a 1 s CSR wait.
pub(super) fn node_7(dir: &std::path::Path) -> IdentityConfig {
    let mut config = IdentityConfig::new(
        "node-7".into(),
        Uid::new("11111111-2222-4333-8444-555555555555").unwrap(),
        Uid::new("66666666-7777-4888-8999-000000000000").unwrap(),
        Chassis::new("chassis-7").unwrap(),
        dir.join("keys"),
    );
    config.request_timeout = Duration::from_secs(1);
    config
}

#[tokio::test(start_paused = true)]
async fn supervised_tree_issues_rsa_identity_and_survives_child_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Arc::new(TokioClock::starting_at(
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    ));
    let ca = Arc::new(TestCa::p256("tree test CA"));
    let csr = FakeCsrApi::new(ca.clone(), clock.clone());
    csr.then(CsrScript::Issue).then(CsrScript::Issue);
    let ovsdb = FakeOvsdb::with_other_config(&[("keep", "me")]);
    let board = StatusBoard::new(clock.clone());
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(PrometheusMetrics::register(&mut registry));
    let (trust_tx, trust_rx) = watch::channel(Some(ca.trust_pem().into()));
    let config = node_7(tmp.path());
    assert_eq!(config.key_type, crate::pki::KeyType::Rsa2048);
    let (sup, _) = start(AgentTreeArgs {
        identity: config,
        csr_api: Arc::new(csr.clone()),
        ovsdb: Arc::new(ovsdb.clone()),
        clock: clock.clone(),
        metrics: metrics.clone(),
        board: board.clone(),
        bus: Bus::default(),
        trust: trust_rx,
        supervisor: SupervisorConfig::default(),
        gate: crate::gate::ProtectionGate::default(),
        permit: crate::gate::ArmPermit::granted(),
        extra_children: vec![],
    })
    .await
    .unwrap();

    until("generation 1", Duration::from_secs(20), || {
        board.snapshot().generation == Some(1) && board.identity_ready().is_ok()
    })
    .await;
    assert_eq!(ovsdb.transactions(), 1);
    let key = std::fs::read_to_string(tmp.path().join("keys/gen-000001/private.key")).unwrap();
    let issued = std::fs::read(tmp.path().join("keys/gen-000001/cert.pem")).unwrap();
    let cert = kube_ovn_ipsec_api::pki::Certificate::from_pem(&issued).unwrap();
    assert!(matches!(
        cert.key_algorithm(),
        kube_ovn_ipsec_api::pki::KeyAlgorithm::Rsa { bits: 2048 }
    ));
    assert!(key.contains("PRIVATE KEY"));

    // Kill the identity actor: it is respawned, reloads generation 1 and the
    // writer confirms it without a new transaction.
    let cell = supervisor::child_cell(&sup, names::IDENTITY)
        .await
        .unwrap()
        .unwrap();
    cell.kill();
    until("identity respawned", Duration::from_secs(10), || {
        board.snapshot().generation == Some(1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id: ActorRef<IdentityMsg> = supervisor::child_cell(&sup, names::IDENTITY)
        .await
        .unwrap()
        .unwrap()
        .into();
    let snap = identity::snapshot(&id).await.unwrap();
    assert_eq!(snap.active, Some((1, true)));
    assert_eq!(ovsdb.transactions(), 1);
    assert_eq!(csr.objects(), 1, "no new identity after a respawn");

    // Kill the writer; a renewal afterwards still activates through the
    // respawned writer.
    supervisor::child_cell(&sup, names::OVSDB_WRITER)
        .await
        .unwrap()
        .unwrap()
        .kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    trust_tx.send_replace(Some(ca.trust_pem().into()));
    let cert_now = board.snapshot();
    assert_eq!(cert_now.phase, Phase::Active);
    // The renewal point is in [40%, 60%] of the 7-day lifetime and depends on
    // the (random) certificate: 4 days is only 57%, so sleep past 60%.
    tokio::time::sleep(Duration::from_secs(5 * 24 * 3600)).await;
    until("generation 2", Duration::from_secs(30), || {
        board.snapshot().generation == Some(2)
    })
    .await;
    assert_eq!(ovsdb.other_config()["keep"], "me");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kube_ovn_ipsec_actor_restarts_total{actor=\"identity\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kube_ovn_ipsec_actor_restarts_total{actor=\"ovsdb-writer\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kube_ovn_ipsec_identity_renewals_total{result=\"success\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kube_ovn_ipsec_activation_latency_seconds_count"),
        "{text}"
    );
    let reports = supervisor::report(&sup).await.unwrap();
    assert!(reports.iter().all(|r| r.alive && !r.failing), "{reports:?}");
    sup.stop(None);
    assert!(csr.unexpected().is_empty());
}
