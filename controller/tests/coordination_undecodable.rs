//! A coordination record that does not decode, against the embedded API
//! server (RBAC on) with the coordinator running (1 s passes): the leader
//! holds and raises one Warning Event on the ConfigMap per change of what
//! is stored under `state` — not one per pass, not one per write of the
//! ConfigMap that leaves `state` alone — and again for a fault that comes
//! back after a record that decoded; `kube-ovn-ipsec-controller status`
//! prints the reason and exits non-zero, and exits 0 once the record
//! decodes.
//!
//! The pass holds before it reads OVN, so the databases' addresses point
//! nowhere.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A real server and a real binary in real time: wall-clock deadlines.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::coordination::{COORDINATION_CONFIGMAP, flags};
use common::*;
use controller::coordination::run::UNDECODABLE_REASON;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube_ovn_ipsec_api::coordination::CoordinationRecord;

/// No OVN database listens here: a pass that reached OVN would log it,
/// nothing more.
const NOWHERE: &str = "tcp:127.0.0.1:9";

/// Stores `state` (no key when `None`) as the coordination ConfigMap's
/// record, in one unconditional write.
async fn put_state(admin: &kube::Client, state: Option<&str>) {
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(COORDINATION_CONFIGMAP.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            state
                .map(|s| BTreeMap::from([("state".to_owned(), s.to_owned())]))
                .unwrap_or_default(),
        ),
        ..ConfigMap::default()
    };
    match maps
        .replace(COORDINATION_CONFIGMAP, &PostParams::default(), &map)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            maps.create(&PostParams::default(), &map).await.unwrap();
        }
        Err(e) => panic!("{e}"),
    }
}

/// The Warning Events about an undecodable record, oldest first.
async fn undecodable_events(admin: &kube::Client) -> Vec<Event> {
    let mut events: Vec<Event> = Api::<Event>::namespaced(admin.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(UNDECODABLE_REASON))
        .collect();
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    events
}

/// Waits (bounded) until there are `n` such Events, then three passes
/// more, and checks there are still exactly `n`; returns the newest.
async fn exactly_events(admin: &kube::Client, n: usize) -> Event {
    let t = Instant::now();
    while undecodable_events(admin).await.len() < n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not {n} {UNDECODABLE_REASON} Events within 20 s: {:?}",
            undecodable_events(admin).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let events = undecodable_events(admin).await;
    let messages: Vec<_> = events.iter().map(|e| e.message.clone()).collect();
    assert_eq!(events.len(), n, "one Event per change: {messages:#?}");
    events.into_iter().last().unwrap()
}

/// `kube-ovn-ipsec-controller status` as the operator runs it: whether it
/// succeeded, and its stdout and stderr.
fn status(kubeconfig: &Path) -> (bool, String) {
    common::coordination::controller_cli_as(
        env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"),
        kubeconfig,
        &["status"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_is_one_event_per_change_and_fails_status() {
    let mut c = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    c.server
        .write_kubeconfig(&kubeconfig, apiserver::ADMIN_TOKEN)
        .unwrap();

    put_state(&c.admin, Some("{not json")).await;
    let (ok, out) = status(&kubeconfig);
    assert!(!ok, "status exited 0 on an undecodable record:\n{out}");
    assert!(
        out.contains("the record under key state does not decode"),
        "{out}"
    );

    let config = c.config_with(&flags(NOWHERE, NOWHERE, "controller-0"));
    c.start_controller(config).await;
    let first = exactly_events(&c.admin, 1).await;
    let on = &first.involved_object;
    assert_eq!(
        (
            on.kind.as_deref(),
            on.name.as_deref(),
            on.namespace.as_deref()
        ),
        (Some("ConfigMap"), Some(COORDINATION_CONFIGMAP), Some(NS))
    );
    assert_eq!(first.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(first.type_.as_deref(), Some("Warning"));
    let message = first.message.unwrap_or_default();
    assert!(
        message.contains("the record under key state does not decode")
            && message.contains(COORDINATION_CONFIGMAP),
        "{message}"
    );

    // A write that leaves `state` alone is no change of the record.
    let maps: Api<ConfigMap> = Api::namespaced(c.admin.clone(), NS);
    maps.patch(
        COORDINATION_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"note": "looked at"}}})),
    )
    .await
    .unwrap();
    exactly_events(&c.admin, 1).await;

    // Another fault: a record of a version this controller does not know.
    put_state(&c.admin, Some(r#"{"version": 99}"#)).await;
    let second = exactly_events(&c.admin, 2).await;
    assert!(
        second.message.unwrap_or_default().contains("version"),
        "the Event names the new fault"
    );

    put_state(&c.admin, None).await;
    let third = exactly_events(&c.admin, 3).await;
    assert!(
        third
            .message
            .unwrap_or_default()
            .contains("the ConfigMap has no state key"),
        "the Event names the missing key"
    );
    let (ok, out) = status(&kubeconfig);
    assert!(!ok, "status exited 0 without a record:\n{out}");
    assert!(out.contains("the ConfigMap has no state key"), "{out}");

    // A record that decodes: the coordinator goes on (its status is
    // written) and `status` exits 0.
    let initial = CoordinationRecord::initial().encode().unwrap();
    put_state(&c.admin, Some(&initial)).await;
    let t = Instant::now();
    loop {
        let map = maps.get(COORDINATION_CONFIGMAP).await.unwrap();
        if map.data.unwrap_or_default().contains_key("status") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the coordinator did not go on from a record that decodes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (ok, out) = status(&kubeconfig);
    assert!(ok, "status failed on a record that decodes:\n{out}");

    // The first fault again, after a record that decoded: a change again.
    put_state(&c.admin, Some("{not json")).await;
    exactly_events(&c.admin, 4).await;
    c.stop().await;
}
