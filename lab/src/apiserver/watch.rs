//! Watch streams: replay from the history, then live events from the store's
//! broadcast, filtered per watch; bookmarks; timeout; shutdown.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::resources::RESOURCES;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventType, StoredEvent, Subscription, encode_event};

/// What one watch asked for.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// Index of the resource in [`RESOURCES`].
    pub resource: usize,
    /// Only this namespace, or all.
    pub namespace: Option<String>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`: end the initial ADDED events with an annotated bookmark.
    pub initial_events_end: bool,
    /// `timeoutSeconds` (or the server default).
    pub timeout: Duration,
    /// How often to send a bookmark.
    pub bookmark_interval: Duration,
}

impl WatchSpec {
    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            // No allocation here: this runs for every event on every watch.
            let have = obj
                .get("metadata")
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str);
            if have != Some(ns.as_str()) {
                return false;
            }
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The line to send for a store event, if this watch sees it. A change that
    /// moves an object into or out of the selection is ADDED or DELETED, as in the real server.
    fn render(&self, ev: &StoredEvent) -> Option<Bytes> {
        if ev.resource != self.resource {
            return None;
        }
        let now = self.matches(&ev.object);
        match ev.event_type {
            EventType::Added | EventType::Deleted => now.then(|| ev.encoded.clone()),
            EventType::Modified => {
                let before = ev.old.as_deref().is_some_and(|o| self.matches(o));
                match (before, now) {
                    (true, true) => Some(ev.encoded.clone()),
                    (false, true) => Some(encode_event("ADDED", &ev.object)),
                    (true, false) => Some(encode_event("DELETED", &ev.object)),
                    (false, false) => None,
                }
            }
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let def = &RESOURCES[self.resource];
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        encode_event(
            "BOOKMARK",
            &json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": meta}),
        )
    }
}

/// The `ERROR` event line for a failed watch (410 Expired is how clients learn to relist).
pub fn error_event(err: &ApiError) -> Bytes {
    encode_event("ERROR", &err.status())
}

/// Runs a watch: returns the receiving end of its byte stream. The task ends when
/// the client goes away, the timeout passes, the server shuts down, or the watch
/// falls behind the broadcast (the client then re-watches from its last version).
pub fn spawn(
    spec: WatchSpec,
    sub: Subscription,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(spec, sub, shutdown, tx));
    rx
}

async fn run(
    spec: WatchSpec,
    sub: Subscription,
    shutdown: CancellationToken,
    tx: mpsc::Sender<Bytes>,
) {
    let Subscription {
        rv,
        initial,
        replay,
        mut rx,
        mut expired,
    } = sub;
    let mut last_rv = rv;
    for obj in &initial {
        if spec.matches(obj) && tx.send(encode_event("ADDED", obj)).await.is_err() {
            return;
        }
    }
    if spec.initial_events_end && tx.send(spec.bookmark(last_rv, true)).await.is_err() {
        return;
    }
    for ev in &replay {
        last_rv = last_rv.max(ev.rv);
        if let Some(line) = spec.render(ev)
            && tx.send(line).await.is_err()
        {
            return;
        }
    }
    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(spec.bookmark_interval);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = expired.changed() => {
                let _ = tx.send(error_event(&ApiError::expired(last_rv, last_rv + 1))).await;
                return;
            }
            _ = &mut deadline => {
                if spec.bookmarks {
                    let _ = tx.send(spec.bookmark(last_rv, false)).await;
                }
                return;
            }
            _ = ticker.tick(), if spec.bookmarks => {
                if tx.send(spec.bookmark(last_rv, false)).await.is_err() {
                    return;
                }
            }
            got = rx.recv() => {
                // Under load, drain what is already queued and send it as one
                // chunk: one body frame and one TLS record instead of dozens.
                let mut batch = BytesMut::new();
                let mut next = Some(got);
                while let Some(got) = next.take() {
                    match got {
                        Ok(ev) => {
                            if ev.rv > last_rv {
                                last_rv = ev.rv;
                                if let Some(line) = spec.render(&ev) {
                                    batch.extend_from_slice(&line);
                                }
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_))
                        | Err(broadcast::error::RecvError::Closed) => {
                            if !batch.is_empty() {
                                let _ = tx.send(batch.freeze()).await;
                            }
                            return;
                        }
                    }
                    if batch.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(ev) => next = Some(Ok(ev)),
                            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                                next = Some(Err(broadcast::error::RecvError::Lagged(n)))
                            }
                            Err(_) => {}
                        }
                    }
                }
                if !batch.is_empty() && tx.send(batch.freeze()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Upper bound of one batched chunk of watch events.
const MAX_BATCH: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::store::{Store, Write};
    use std::sync::Arc;

    type WatchRx = mpsc::Receiver<Bytes>;

    fn cm(name: &str, app: &str) -> Value {
        json!({"kind": "ConfigMap", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": "ns", "labels": {"app": app}}})
    }

    fn spec(labels: &str) -> WatchSpec {
        WatchSpec {
            resource: 3,
            namespace: Some("ns".into()),
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::default(),
            bookmarks: true,
            initial_events_end: false,
            timeout: Duration::from_secs(1),
            bookmark_interval: Duration::from_secs(60),
        }
    }

    /// Next event line; chunks may carry several lines. The wait is well
    /// above the watches' own 1 s timeout: the final bookmark arrives at
    /// that timeout, and a loaded CI machine must not turn it into a race.
    async fn next(rx: &mut WatchRx, pending: &mut std::collections::VecDeque<Value>) -> Value {
        while pending.is_empty() {
            let b = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap()
                .unwrap();
            for line in b.split(|c| *c == b'\n').filter(|l| !l.is_empty()) {
                pending.push_back(serde_json::from_slice(line).unwrap());
            }
        }
        pending.pop_front().unwrap()
    }

    #[tokio::test]
    async fn selector_transitions_and_final_bookmark() {
        let store = Arc::new(Store::new(100));
        let sub = store.subscribe(3, Some("ns"), Some(0)).unwrap();
        let mut rx = spawn(spec("app=x"), sub, CancellationToken::new());
        let mut q = std::collections::VecDeque::new();
        store
            .write(3, "ns", "a", |_| Ok(Write::Put(cm("a", "y"))))
            .unwrap();
        store
            .write(3, "ns", "a", |_| Ok(Write::Put(cm("a", "x"))))
            .unwrap();
        store
            .write(3, "ns", "a", |_| Ok(Write::Put(cm("a", "z"))))
            .unwrap();
        store
            .write(3, "ns", "b", |_| Ok(Write::Put(cm("b", "x"))))
            .unwrap();
        let e = next(&mut rx, &mut q).await;
        assert_eq!(
            (
                e["type"].as_str(),
                e["object"]["metadata"]["resourceVersion"].as_str()
            ),
            (Some("ADDED"), Some("2"))
        );
        assert_eq!(next(&mut rx, &mut q).await["type"], "DELETED");
        assert_eq!(
            next(&mut rx, &mut q).await["object"]["metadata"]["name"],
            "b"
        );
        let bm = next(&mut rx, &mut q).await;
        assert_eq!(bm["type"], "BOOKMARK");
        assert_eq!(bm["object"]["metadata"]["resourceVersion"], "4");
        assert!(
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn initial_events_then_annotated_bookmark() {
        let store = Arc::new(Store::new(100));
        store
            .write(3, "ns", "a", |_| Ok(Write::Put(cm("a", "x"))))
            .unwrap();
        let sub = store.subscribe(3, Some("ns"), None).unwrap();
        let mut s = spec("");
        s.initial_events_end = true;
        let mut rx = spawn(s, sub, CancellationToken::new());
        let mut q = std::collections::VecDeque::new();
        assert_eq!(next(&mut rx, &mut q).await["type"], "ADDED");
        let bm = next(&mut rx, &mut q).await;
        assert_eq!(
            bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
