//! Watch streams: replay from the history, then live events from the store's
//! broadcast, filtered per watch; bookmarks; timeout; shutdown.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::resources::RESOURCES;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{EventType, Store, StoredEvent, Subscription, encode_event};

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
    /// Borrowed when the stored line is what goes out (the common case: no
    /// copy of a shared buffer per watch, no reference count touched by
    /// every watch on both cores).
    fn render<'e>(&self, ev: &'e StoredEvent) -> Option<Cow<'e, [u8]>> {
        if ev.resource != self.resource
            || self
                .namespace
                .as_deref()
                .is_some_and(|ns| ns != ev.namespace)
        {
            return None;
        }
        // Without selectors the namespace decides alone, and an update cannot
        // move the object in or out: no lookups in the object (this runs for
        // every event on every watch).
        let stored = || Some(Cow::Borrowed(&ev.encoded[..]));
        if self.labels.is_empty() && self.fields.is_empty() {
            return stored();
        }
        let now = self.matches(&ev.object);
        let other = |t: &str| Some(Cow::Owned(encode_event(t, &ev.object).to_vec()));
        match ev.event_type {
            EventType::Added | EventType::Deleted if now => stored(),
            EventType::Added | EventType::Deleted => None,
            EventType::Modified => {
                let before = ev.old.as_deref().is_some_and(|o| self.matches(o));
                match (before, now) {
                    (true, true) => stored(),
                    (false, true) => other("ADDED"),
                    (true, false) => other("DELETED"),
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

/// A watch as the body of its response: the initial events first, then the
/// store's events after the watch's resourceVersion, read from the history.
/// It ends when the timeout passes (with a last bookmark if asked for), the
/// server shuts down, or the store is compacted or the watch falls behind the
/// history's window (an `ERROR` 410 Expired event first: the client relists).
/// A client that goes away drops the stream, which is all the clean-up there
/// is.
///
/// The stream is polled by the connection's own task: no task or channel per
/// watch between the store and the socket. A wake-up carries only a
/// resourceVersion; the watch then takes every event it has not sent from
/// the history under one lock and sends them as one chunk (one TLS record and
/// one write instead of dozens).
pub fn stream(
    spec: WatchSpec,
    store: Arc<Store>,
    sub: Subscription,
    shutdown: CancellationToken,
) -> impl Stream<Item = Bytes> + Send + 'static {
    let Subscription {
        rv,
        initial,
        rx,
        expired,
    } = sub;
    let mut head = Chunks::default();
    for obj in &initial {
        if spec.matches(obj) {
            head.push(&encode_event("ADDED", obj));
        }
    }
    if spec.initial_events_end {
        head.push(&spec.bookmark(rv, true));
    }
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + spec.bookmark_interval,
        spec.bookmark_interval,
    );
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let live = Live {
        deadline: Box::pin(tokio::time::sleep(spec.timeout)),
        spec,
        store,
        rx,
        expired,
        shutdown,
        ticker,
        last_rv: rv,
        // Events after `rv` may already be in the history: read them first.
        pending: true,
        ended: false,
        last_flush: tokio::time::Instant::now() - FLUSH_WINDOW,
        slots: Slots::next(),
        busy: false,
        taken: Vec::new(),
    };
    futures::stream::iter(head.done()).chain(futures::stream::unfold(live, |mut live| async {
        let chunk = live.next().await?;
        Some((chunk, live))
    }))
}

/// Lines gathered into chunks of at most [`MAX_BATCH`] bytes.
#[derive(Default)]
struct Chunks {
    full: Vec<Bytes>,
    current: BytesMut,
}

impl Chunks {
    fn push(&mut self, line: &[u8]) {
        if !self.current.is_empty() && self.current.len() + line.len() > MAX_BATCH {
            self.full.push(self.current.split().freeze());
        }
        self.current.extend_from_slice(line);
    }

    fn done(mut self) -> Vec<Bytes> {
        if !self.current.is_empty() {
            self.full.push(self.current.freeze());
        }
        self.full
    }
}

/// The live part of a watch.
struct Live {
    spec: WatchSpec,
    store: Arc<Store>,
    rx: broadcast::Receiver<u64>,
    expired: tokio::sync::watch::Receiver<u64>,
    shutdown: CancellationToken,
    deadline: Pin<Box<tokio::time::Sleep>>,
    ticker: tokio::time::Interval,
    /// The newest resourceVersion this watch has passed on (or skipped).
    last_rv: u64,
    /// The history may hold events not yet taken: read before waiting.
    pending: bool,
    /// The last chunk has been handed out.
    ended: bool,
    /// When the last live chunk was taken.
    last_flush: tokio::time::Instant,
    /// When this watch may send while busy.
    slots: Slots,
    /// The last read found events to send.
    busy: bool,
    /// Reused buffer for the events taken from the history per chunk.
    taken: Vec<Arc<StoredEvent>>,
}

impl Live {
    /// The next chunk, or `None` when the watch is over.
    async fn next(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        loop {
            if !self.pending {
                // A watch that sent a chunk last time goes straight to its
                // next slot instead of being woken by every write meanwhile.
                let slot = self.busy.then(|| self.slots.after(self.last_flush));
                tokio::select! {
                    _ = self.shutdown.cancelled() => return None,
                    _ = self.expired.changed() => {
                        self.ended = true;
                        return Some(error_event(&ApiError::expired(self.last_rv, self.last_rv + 1)));
                    }
                    _ = &mut self.deadline => {
                        self.ended = true;
                        return self.spec.bookmarks.then(|| self.spec.bookmark(self.last_rv, false));
                    }
                    _ = self.ticker.tick(), if self.spec.bookmarks => {
                        return Some(self.spec.bookmark(self.last_rv, false));
                    }
                    _ = tokio::time::sleep_until(slot.unwrap_or(self.last_flush)), if slot.is_some() => {}
                    got = self.rx.recv(), if slot.is_none() => match got {
                        // Lagging loses wake-ups only: the events are in the history.
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                }
                // A watch that has sent within the last flush window waits
                // for its next slot before reading, so a busy watch leaves
                // in one write per window instead of one per event (each
                // write to a socket costs more than the bytes in it); after
                // a quiet spell an event leaves at once.
                let now = tokio::time::Instant::now();
                if slot.is_none() && now < self.last_flush + FLUSH_WINDOW {
                    let slot = self.slots.after(self.last_flush);
                    if now < slot {
                        tokio::time::sleep_until(slot).await;
                    }
                }
            }
            self.last_flush = tokio::time::Instant::now();
            // The wake-ups queued meanwhile are covered by this read.
            while !matches!(
                self.rx.try_recv(),
                Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
            ) {}
            // References under the store's lock; the lines are copied into
            // the chunk after it is released.
            let mut taken = std::mem::take(&mut self.taken);
            if let Err(e) = self.store.take_since(self.last_rv, MAX_TAKEN, &mut taken) {
                // Behind the history's window: the client must relist.
                self.ended = true;
                return Some(error_event(&e));
            }
            let mut batch = BytesMut::new();
            let mut full = taken.len() == MAX_TAKEN;
            for ev in &taken {
                if batch.len() >= MAX_BATCH {
                    full = true;
                    break;
                }
                if let Some(line) = self.spec.render(ev) {
                    batch.extend_from_slice(&line);
                }
                self.last_rv = ev.rv;
            }
            // Kept for the next chunk: no allocation per chunk, and no
            // event held alive between chunks.
            taken.clear();
            self.taken = taken;
            self.pending = full;
            self.busy = !batch.is_empty();
            if !batch.is_empty() {
                return Some(batch.freeze());
            }
        }
    }
}

/// The period of a busy watch's chunks. The cost of a watch is
/// mostly per write (syscall, TCP segment, TLS record), so under load this
/// bounds the writes per watch to about 1 / window; the delay it can add to an
/// event is at most the window, and nothing when the watch was quiet.
const FLUSH_WINDOW: Duration = Duration::from_millis(4);

/// A busy watch's send times: one every [`FLUSH_WINDOW`], at a phase of its
/// own. Watches woken by the same event would otherwise all send at the same
/// instant, every window, and the last of a hundred would wait for the other
/// ninety-nine's TLS records and writes (and so would the client reading
/// them); phases spread over the window make every send a small one.
struct Slots {
    /// A grid point of this watch.
    origin: tokio::time::Instant,
}

impl Slots {
    /// The slots of a watch starting now: the `n`-th watch of the process
    /// is offset by `n` times the golden ratio of the window, so any number
    /// of watches covers the window evenly.
    fn next() -> Self {
        static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self::nth(
            COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tokio::time::Instant::now(),
        )
    }

    fn nth(n: u64, start: tokio::time::Instant) -> Self {
        // The fractional part of n times the golden ratio (2^64 / φ as a
        // fixed-point fraction), scaled to the window: each new phase falls
        // into the widest gap left by the earlier ones.
        let window = FLUSH_WINDOW.as_nanos();
        let fraction = u128::from(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let phase = u64::try_from((fraction * window) >> 64).unwrap_or(0);
        Self {
            origin: start + Duration::from_nanos(phase),
        }
    }

    /// The first slot after `t`.
    fn after(&self, t: tokio::time::Instant) -> tokio::time::Instant {
        if t < self.origin {
            return self.origin;
        }
        let window = FLUSH_WINDOW.as_nanos();
        let k = (t - self.origin).as_nanos() / window + 1;
        self.origin + Duration::from_nanos(u64::try_from(k * window).unwrap_or(u64::MAX))
    }
}

/// Most events taken from the history per chunk.
const MAX_TAKEN: usize = 512;

/// Upper bound of one batched chunk of watch events.
const MAX_BATCH: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Write;

    type WatchRx = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

    fn spawn(
        spec: WatchSpec,
        store: &Arc<Store>,
        sub: Subscription,
        shutdown: CancellationToken,
    ) -> WatchRx {
        Box::pin(stream(spec, store.clone(), sub, shutdown))
    }

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
            let b = tokio::time::timeout(Duration::from_secs(10), rx.next())
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
        let mut rx = spawn(spec("app=x"), &store, sub, CancellationToken::new());
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
            tokio::time::timeout(Duration::from_secs(10), rx.next())
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
        let mut rx = spawn(s, &store, sub, CancellationToken::new());
        let mut q = std::collections::VecDeque::new();
        assert_eq!(next(&mut rx, &mut q).await["type"], "ADDED");
        let bm = next(&mut rx, &mut q).await;
        assert_eq!(
            bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_watch_sends_one_chunk_per_flush_window() {
        let lines = |b: &Bytes| b.iter().filter(|c| **c == b'\n').count();
        let store = Arc::new(Store::new(100));
        let sub = store.subscribe(3, Some("ns"), Some(0)).unwrap();
        let mut rx = spawn(spec(""), &store, sub, CancellationToken::new());
        let put = |name: &str| {
            store
                .write(3, "ns", name, |_| Ok(Write::Put(cm(name, "x"))))
                .unwrap();
        };
        let t0 = tokio::time::Instant::now();
        put("a");
        // After a quiet spell the event leaves at once.
        assert_eq!(lines(&rx.next().await.unwrap()), 1);
        assert_eq!(t0.elapsed(), Duration::ZERO);
        put("b");
        let reader = tokio::spawn(async move {
            let chunk = rx.next().await.unwrap();
            (chunk, tokio::time::Instant::now(), rx)
        });
        // The reader has taken "b" and waits out the window; what arrives
        // meanwhile joins the same chunk.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        put("c");
        put("d");
        let (chunk, at, mut rx) = reader.await.unwrap();
        assert_eq!(lines(&chunk), 3);
        // Sent at the watch's next slot: later, but within one window.
        assert!(
            at > t0 && at - t0 <= FLUSH_WINDOW,
            "sent after {:?}",
            at - t0
        );
        // From then on the watch is on its grid: one chunk per window.
        put("e");
        let chunk = rx.next().await.unwrap();
        assert_eq!(lines(&chunk), 1);
        assert_eq!(tokio::time::Instant::now() - at, FLUSH_WINDOW);
        // Quiet again: the next slot finds nothing, and after that an event
        // leaves at once, not at a slot.
        tokio::time::sleep(10 * FLUSH_WINDOW).await;
        put("f");
        let t = tokio::time::Instant::now();
        let chunk = rx.next().await.unwrap();
        assert_eq!(lines(&chunk), 1);
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[test]
    fn slots_spread_watches_over_the_window() {
        let start = tokio::time::Instant::now();
        let window = FLUSH_WINDOW.as_nanos() as u64;
        let mut phases: Vec<u64> = (0..100)
            .map(|n| (Slots::nth(n, start).origin - start).as_nanos() as u64)
            .collect();
        phases.sort_unstable();
        phases.push(phases[0] + window);
        let widest = phases.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        // Evenly spread, 100 phases would be window/100 apart; allow 3x.
        assert!(widest < 3 * window / 100, "gap {widest} ns of {window}");
        for n in [0, 7] {
            let slots = Slots::nth(n, start);
            for offset_us in [0u64, 1, 4_999, 5_000, 123_457] {
                let t = start + Duration::from_micros(offset_us);
                let at = slots.after(t);
                assert!(at > t && at - t <= FLUSH_WINDOW, "{n} {offset_us}");
                assert_eq!((at - slots.origin).as_nanos() % FLUSH_WINDOW.as_nanos(), 0);
            }
        }
    }

    #[tokio::test]
    async fn a_watch_behind_the_history_window_ends_with_410() {
        let store = Arc::new(Store::new(2));
        let sub = store.subscribe(3, Some("ns"), Some(0)).unwrap();
        let mut rx = spawn(spec(""), &store, sub, CancellationToken::new());
        for i in 0..5 {
            let name = format!("o{i}");
            store
                .write(3, "ns", &name, |_| Ok(Write::Put(cm(&name, "x"))))
                .unwrap();
        }
        let mut q = std::collections::VecDeque::new();
        let e = next(&mut rx, &mut q).await;
        assert_eq!(e["type"], "ERROR");
        assert_eq!(e["object"]["code"], 410);
        assert!(
            tokio::time::timeout(Duration::from_secs(10), rx.next())
                .await
                .unwrap()
                .is_none()
        );
    }
}
