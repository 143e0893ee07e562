//! Watches from a resourceVersion the server never issued, and a restart with
//! the store reset (an etcd restored from an old backup): the kube-apiserver
//! answers a client relists on, and the waiting kube-apiserver mode.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against a real server in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use apiserver::{ADMIN_TOKEN, ApiServer, FutureWatch, RESOURCES, Write};
use common::{eventually, server};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::ObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

/// Moves the store's resourceVersion `n` versions on (writes of one
/// ConfigMap straight into the store: fast, and nobody watches it).
fn bump(store: &apiserver::Store, n: usize) {
    let configmaps = RESOURCES.iter().position(|r| r.plural == "configmaps");
    for i in 0..n {
        store
            .write(configmaps.unwrap(), "kube-public", "bump", |_| {
                Ok(Write::Put(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "bump", "namespace": "kube-public"},
                    "data": {"i": i.to_string()}})))
            })
            .unwrap();
    }
}

/// The first event of a watch from `rv`; the watch request itself must
/// succeed (kube-apiserver answers 200 and reports the error as an event).
async fn first_event(cms: &Api<ConfigMap>, rv: &str) -> WatchEvent<ConfigMap> {
    let mut stream = cms
        .watch(&WatchParams::default().timeout(5), rv)
        .await
        .expect("the watch request is answered 200")
        .boxed();
    tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .expect("one event before the stream ends")
}

#[tokio::test]
async fn a_watch_from_a_version_never_issued_gets_an_error_event_410_expired() {
    let s = server(false, &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let rv: u64 = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    let future = (rv + 1000).to_string();
    match first_event(&cms, &future).await {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}");
            assert!(
                e.message.starts_with("too old resource version"),
                "the message clients log and match: {}",
                e.message
            );
        }
        other => panic!("expected an ERROR 410 event, got {other:?}"),
    }
    // The newest version is issued: that watch waits for the next event.
    cms.create(&PostParams::default(), &cm("next"))
        .await
        .unwrap();
    match first_event(&cms, &rv.to_string()).await {
        WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("next")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test]
async fn in_wait_mode_a_future_watch_waits_for_its_version_like_kube_apiserver() {
    let s = ApiServer::builder()
        .future_watch(FutureWatch::Wait)
        .start()
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let rv = s.store().resource_version();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(5), &(rv + 2).to_string())
        .await
        .unwrap()
        .boxed();
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name)).await.unwrap();
    }
    // The events up to the requested version are never sent.
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await {
        Ok(Ok(Some(WatchEvent::Added(c)))) => assert_eq!(c.metadata.name.as_deref(), Some("c")),
        other => panic!("expected ADDED c, got {other:?}"),
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_an_empty_store_keeps_address_ca_and_tokens_and_a_reflector_relists() {
    a_reflector_relists_after_a_store_reset(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_store_under_open_connections_and_a_reflector_relists() {
    a_reflector_relists_after_a_store_reset(false).await;
}

/// A synced reflector, the store reset (by a restart, or in place), a new
/// object at a lower version: the reflector ends up with exactly that one.
async fn a_reflector_relists_after_a_store_reset(restart: bool) {
    let mut s = server(false, &[]).await;
    let addr = s.addr();
    let ca = s.ca_pem().to_owned();
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    // The reflector's version ends up far above what the new store reaches.
    bump(s.store(), 200);
    let last = cms
        .create(&PostParams::default(), &cm("last"))
        .await
        .unwrap();

    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher(cms.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    let names = |r: &reflector::Store<ConfigMap>| {
        let mut v: Vec<String> = r
            .state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        v.sort();
        v
    };
    reader.wait_until_ready().await.unwrap();
    eventually("initial objects", || names(&reader) == ["before", "last"]).await;

    if restart {
        s.restart_with_empty_store().await.unwrap();
    } else {
        s.reset_store().unwrap();
    }
    assert_eq!(s.addr(), addr);
    assert_eq!(s.ca_pem(), ca);
    // The same client (CA, token) goes on working against the new store.
    let after = cms
        .create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    assert!(
        rv_of(&after) < rv_of(&last),
        "the new store starts over: {} after {}",
        rv_of(&after),
        rv_of(&last)
    );
    // The reflector resumed from a version the new store never issued: the
    // 410 made it relist, so the old objects are gone and the new one is in.
    eventually("relisted after the reset", || names(&reader) == ["after"]).await;
    task.abort();
    s.shutdown().await;
}
