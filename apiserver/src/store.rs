//! The object store: every object of every resource under one lock, one global
//! resourceVersion, a bounded history of events and a broadcast to watches.
//!
//! Why one lock: the resourceVersion is global and monotonic, and a watch must
//! see events in resourceVersion order. Taking a single mutex for the short
//! critical section of a write (assign the version, swap an `Arc`, append to
//! the history, broadcast) gives that order for free; lists clone `Arc`s under
//! the lock and serialise outside it. Each event is serialised once, under the
//! lock; watches are woken by a broadcast of the new resourceVersion (a plain
//! number) and take references to the events from the history, a batch per
//! lock, copying the lines into their chunks after releasing it.
//!
//! The history is bounded twice: by a number of events and by the bytes
//! they hold ([`event_bytes`]). A count alone lets a few large objects
//! updated often hold gigabytes; bytes alone would keep millions of tiny
//! events. Whichever bound is reached first evicts the oldest events, and
//! eviction is the one way a resourceVersion leaves the history: a watch or
//! an exact list from before it gets 410 Expired, whichever bound did it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::resources::RESOURCES;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventType {
    /// The wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and sent to watches.
#[derive(Debug)]
pub struct StoredEvent {
    /// What happened.
    pub event_type: EventType,
    /// Index of the resource in [`RESOURCES`].
    pub resource: usize,
    /// resourceVersion of the change.
    pub rv: u64,
    /// The object's namespace (`""` if cluster-scoped), read once here so
    /// that watches need not look it up in the object for every event.
    pub namespace: String,
    /// The object after the change (for a deletion: the last state, at `rv`).
    pub object: Arc<Value>,
    /// The object before the change, if any (used to roll back for exact lists
    /// and to turn label-selector transitions into ADDED/DELETED).
    pub old: Option<Arc<Value>>,
    /// `{"type":...,"object":...}\n`, serialised once.
    pub encoded: Bytes,
}

/// An event line is `EVENT_HEAD` type `EVENT_OBJECT` object `EVENT_TAIL`.
const EVENT_HEAD: &[u8] = b"{\"type\":\"";
const EVENT_OBJECT: &[u8] = b"\",\"object\":";
const EVENT_TAIL: &[u8] = b"}\n";

/// Encodes one watch event line.
pub fn encode_event(event_type: &str, object: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(EVENT_HEAD);
    buf.extend_from_slice(event_type.as_bytes());
    buf.extend_from_slice(EVENT_OBJECT);
    // Serialising a Value into a Vec cannot fail (no non-string map keys).
    let _ = serde_json::to_writer(&mut buf, object);
    buf.extend_from_slice(EVENT_TAIL);
    Bytes::from(buf)
}

/// The object's JSON inside a line from [`encode_event`] (no copy).
fn event_object(line: &Bytes, event_type: &str) -> Bytes {
    let start = EVENT_HEAD.len() + event_type.len() + EVENT_OBJECT.len();
    line.slice(start..line.len() - EVENT_TAIL.len())
}

/// What a write closure decided.
#[derive(Debug)]
pub enum Write {
    /// Store this object (created or replaced); the store sets its resourceVersion.
    Put(Value),
    /// Remove the object.
    Delete,
    /// Nothing changes (a no-op update keeps its resourceVersion, like the real server).
    Unchanged,
}

/// The result of a write.
#[derive(Debug, Clone)]
pub struct Written {
    /// The object as stored (for a deletion, its final state).
    pub object: Arc<Value>,
    /// The event it caused, if any.
    pub event: Option<EventType>,
    /// The object's JSON when it was stored or replaced: a slice of the
    /// event line, so a write's answer is not serialised a second time.
    pub json: Option<Bytes>,
}

/// A watch's starting point: what to send first and where to go on from.
#[derive(Debug)]
pub struct Subscription {
    /// resourceVersion the watch starts at.
    pub rv: u64,
    /// Current objects (for synthetic ADDED events), if asked for.
    pub initial: Vec<Arc<Value>>,
    /// Wakes the watch: the resourceVersion of each new event (the events
    /// themselves are taken with [`Store::take_since`]).
    pub rx: broadcast::Receiver<u64>,
    /// Changes when the store is compacted: the watch must end with 410 Expired.
    pub expired: tokio::sync::watch::Receiver<u64>,
}

/// `(namespace, name)`; the namespace is `""` for cluster-scoped objects.
pub type Key = (String, String);

struct Inner {
    rv: u64,
    /// Per resource; lists sort (the hot path is point reads and writes,
    /// and a hash lookup there costs a fraction of an ordered map's string
    /// comparisons at 100,000 objects).
    objects: Vec<HashMap<Key, Arc<Value>>>,
    history: VecDeque<Arc<StoredEvent>>,
    /// [`event_bytes`] summed over `history`.
    history_bytes: usize,
    /// Events with `rv <= floor` are no longer in the history.
    floor: u64,
    /// Most events the history keeps.
    window: usize,
    /// Most bytes the history keeps (the newest event is kept whatever its size).
    max_bytes: usize,
}

/// The store. Cheap to share behind an `Arc`.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<u64>,
    compactions: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

/// Capacity of the wake-up channel. A watch further behind loses only
/// wake-ups, not events (it reads them from the history); only a watch behind
/// the history's window is expired.
const BROADCAST_CAPACITY: usize = 1 << 12;

/// The history's default bound in bytes, as [`event_bytes`] counts them:
/// 64 MiB holds the default 10,000 events while their lines average up to
/// 3.2 KiB — the lab's own objects (Leases, Nodes, Pods, CSRs) are smaller,
/// so for them the event count stays the bound that matters. What it stops
/// is a few objects of megabytes updated again and again (without it, 150
/// updates of a 2.9 MB object grew the server from 170 MB to 1 GB); of such
/// an object it keeps about ten versions.
pub const DEFAULT_HISTORY_BYTES: usize = 64 << 20;

/// What one event costs the history, in bytes: its serialised line, and
/// once more for the object it keeps parsed (a large object is mostly its
/// strings, whose length the JSON text approximates). The object before
/// the change is the previous event's object, already counted there.
pub fn event_bytes(event: &StoredEvent) -> usize {
    event.encoded.len().saturating_mul(2)
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// A store keeping the last `window` events for watches and exact
    /// lists, within [`DEFAULT_HISTORY_BYTES`].
    pub fn new(window: usize) -> Self {
        Self::with_history(window, DEFAULT_HISTORY_BYTES)
    }

    /// A store keeping at most the last `window` events and `max_bytes`
    /// of them ([`event_bytes`]) for watches and exact lists; the newest
    /// event is kept even when it alone is larger.
    pub fn with_history(window: usize, max_bytes: usize) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: RESOURCES.iter().map(|_| HashMap::new()).collect(),
                history: VecDeque::new(),
                history_bytes: 0,
                floor: 0,
                window: window.max(1),
                max_bytes,
            }),
            events,
            compactions: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written map (every
        // write is a single insert/remove), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The oldest resourceVersion a watch can still start from.
    pub fn oldest_resource_version(&self) -> u64 {
        self.lock().floor
    }

    /// The bytes the history holds now, as its bound counts them
    /// ([`event_bytes`]).
    pub fn history_bytes(&self) -> usize {
        self.lock().history_bytes
    }

    /// How many events the history holds now.
    pub fn history_len(&self) -> usize {
        self.lock().history.len()
    }

    /// Forced compaction: drops the whole event history, so any watch or exact
    /// list from an older resourceVersion gets 410 Gone, and ends every open watch
    /// with a 410 Expired ERROR event (as a real watch cache does when a watcher
    /// falls out of its window). Clients must relist.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.history_bytes = 0;
        inner.floor = inner.rv;
        self.compactions.send_modify(|n| *n += 1);
    }

    /// One object.
    pub fn get(&self, resource: usize, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let inner = self.lock();
        inner
            .objects
            .get(resource)?
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// All objects of a resource (in one namespace, or all), sorted by namespace and name,
    /// with the resourceVersion they were read at.
    pub fn list(&self, resource: usize, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let objs = Self::list_locked(&inner, resource, namespace);
        (objs, inner.rv)
    }

    fn list_locked(inner: &Inner, resource: usize, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let Some(map) = inner.objects.get(resource) else {
            return Vec::new();
        };
        sorted(map.iter(), namespace)
    }

    /// The objects as they were at exactly `rv`, rebuilt by rolling back the history.
    pub fn list_at(
        &self,
        resource: usize,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let inner = self.lock();
        if rv > inner.rv {
            return Err(ApiError::too_large_resource_version(rv, inner.rv));
        }
        if rv < inner.floor {
            return Err(ApiError::expired(rv, inner.floor));
        }
        let mut map: HashMap<Key, Arc<Value>> =
            inner.objects.get(resource).cloned().unwrap_or_default();
        for ev in inner.history.iter().rev().take_while(|e| e.rv > rv) {
            if ev.resource != resource {
                continue;
            }
            let key = key_of(&ev.object);
            match (&ev.event_type, &ev.old) {
                (EventType::Added, _) => {
                    map.remove(&key);
                }
                (_, Some(old)) => {
                    map.insert(key, old.clone());
                }
                (_, None) => {}
            }
        }
        Ok(sorted(map.iter(), namespace))
    }

    /// Every object of a resource (all namespaces).
    pub fn snapshot(&self, resource: usize) -> Vec<Arc<Value>> {
        self.list(resource, None).0
    }

    /// Read-modify-write of one object under the store lock: `f` sees the current
    /// object (if any) and decides. Its error aborts the write and leaves the store unchanged.
    pub fn write(
        &self,
        resource: usize,
        namespace: &str,
        name: &str,
        f: impl FnOnce(Option<&Arc<Value>>) -> Result<Write, ApiError>,
    ) -> Result<Written, ApiError> {
        // Declared before the guard, so dropped after it.
        let mut evicted = Vec::new();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let map = inner
            .objects
            .get_mut(resource)
            .ok_or_else(|| ApiError::internal("unknown resource index"))?;
        // One hash lookup for the read and the write that follows.
        let entry = map.entry((namespace.to_string(), name.to_string()));
        let current = match &entry {
            Entry::Occupied(e) => Some(e.get().clone()),
            Entry::Vacant(_) => None,
        };
        let decision = f(current.as_ref())?;
        let rv = inner.rv + 1;
        let (event_type, object) = match (decision, entry) {
            (Write::Unchanged, _) => {
                return current
                    .map(|object| Written {
                        object,
                        event: None,
                        json: None,
                    })
                    .ok_or_else(|| ApiError::internal("unchanged write of a missing object"));
            }
            (Write::Put(mut obj), entry) => {
                set_rv(&mut obj, rv);
                let obj = Arc::new(obj);
                let t = match entry {
                    Entry::Occupied(mut e) => {
                        e.insert(obj.clone());
                        EventType::Modified
                    }
                    Entry::Vacant(e) => {
                        e.insert(obj.clone());
                        EventType::Added
                    }
                };
                (t, obj)
            }
            (Write::Delete, Entry::Occupied(e)) => {
                let old = e.remove();
                let mut last = (*old).clone();
                set_rv(&mut last, rv);
                (EventType::Deleted, Arc::new(last))
            }
            (Write::Delete, Entry::Vacant(_)) => {
                return Err(ApiError::internal("delete of a missing object"));
            }
        };
        inner.rv = rv;
        let encoded = encode_event(event_type.as_str(), &object);
        let json =
            (event_type != EventType::Deleted).then(|| event_object(&encoded, event_type.as_str()));
        let event = Arc::new(StoredEvent {
            event_type,
            resource,
            rv: inner.rv,
            namespace: namespace.to_string(),
            encoded,
            object: object.clone(),
            old: current,
        });
        inner.history_bytes = inner.history_bytes.saturating_add(event_bytes(&event));
        inner.history.push_back(event);
        while inner.history.len() > inner.window
            || (inner.history_bytes > inner.max_bytes && inner.history.len() > 1)
        {
            let Some(gone) = inner.history.pop_front() else {
                break;
            };
            inner.floor = gone.rv;
            inner.history_bytes = inner.history_bytes.saturating_sub(event_bytes(&gone));
            // Freed after the lock is released: the last reference to
            // an old event can be the last to two objects.
            evicted.push(gone);
        }
        let rv = inner.rv;
        drop(guard);
        // After the lock: waking watches is not part of the write. The
        // event is in the history before its wake-up is sent, so a watch
        // cannot miss it. No receiver is not an error: nobody is watching.
        let _ = self.events.send(rv);
        Ok(Written {
            object,
            event: Some(event_type),
            json,
        })
    }

    /// Starts a watch. `from = None` starts now with the current objects (for
    /// synthetic ADDED events); `Some(rv)` starts at `rv` (the watch then
    /// reads the history after it), or fails with 410 Expired if that part of
    /// the history is gone.
    pub fn subscribe(
        &self,
        resource: usize,
        namespace: Option<&str>,
        from: Option<u64>,
    ) -> Result<Subscription, ApiError> {
        let inner = self.lock();
        let rx = self.events.subscribe();
        let expired = self.compactions.subscribe();
        match from {
            None => Ok(Subscription {
                rv: inner.rv,
                initial: Self::list_locked(&inner, resource, namespace),
                rx,
                expired,
            }),
            Some(rv) => {
                if rv < inner.floor {
                    return Err(ApiError::expired(rv, inner.floor));
                }
                Ok(Subscription {
                    rv,
                    initial: Vec::new(),
                    rx,
                    expired,
                })
            }
        }
    }

    /// Starts a watch at `rv` like [`Self::subscribe`], but fails with 410
    /// Expired when the store has not issued `rv` yet (a version from before
    /// a reset: the events up to it would never come).
    pub fn subscribe_issued(
        &self,
        resource: usize,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<Subscription, ApiError> {
        // Versions only grow: one issued at this check stays issued.
        let newest = self.resource_version();
        if rv > newest {
            return Err(ApiError::expired(rv, newest));
        }
        self.subscribe(resource, namespace, Some(rv))
    }

    /// Appends the history's events after `after_rv` (oldest first, at most
    /// `max`) to `out`, or fails with 410 Expired when events after
    /// `after_rv` are no longer in the history. Only references are taken
    /// under the lock: a watch copies the event lines after releasing it, so
    /// a hundred watches do not hold up writers while they copy.
    pub fn take_since(
        &self,
        after_rv: u64,
        max: usize,
        out: &mut Vec<Arc<StoredEvent>>,
    ) -> Result<(), ApiError> {
        let inner = self.lock();
        if after_rv < inner.floor {
            return Err(ApiError::expired(after_rv, inner.floor));
        }
        let start = inner.history.partition_point(|e| e.rv <= after_rv);
        out.extend(inner.history.range(start..).take(max).cloned());
        Ok(())
    }
}

/// The objects in `namespace` (or all), sorted by namespace and name.
fn sorted<'a>(
    objects: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
    namespace: Option<&str>,
) -> Vec<Arc<Value>> {
    let mut found: Vec<_> = objects
        .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
        .collect();
    found.sort_unstable_by(|a, b| a.0.cmp(b.0));
    found.into_iter().map(|(_, v)| v.clone()).collect()
}

/// `(namespace, name)` of an object.
pub fn key_of(obj: &Value) -> Key {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str, v: &str) -> Value {
        json!({"kind": "ConfigMap", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": "ns"}, "data": {"v": v}})
    }

    const CM: usize = 3;

    #[test]
    fn a_write_answers_with_the_json_of_its_event() {
        let store = Store::new(1);
        for (v, t) in [("1", "ADDED"), ("2", "MODIFIED"), ("2", "")] {
            let written = store
                .write(CM, "ns", "a", |cur| {
                    Ok(match cur {
                        Some(c) if c["data"]["v"] == v => Write::Unchanged,
                        _ => Write::Put(cm("a", v)),
                    })
                })
                .unwrap();
            let Some(json) = &written.json else {
                assert_eq!(t, "", "an unchanged write has no event");
                continue;
            };
            let answer: Value = serde_json::from_slice(json).unwrap();
            assert_eq!(&answer, written.object.as_ref());
            assert_eq!(answer["metadata"]["resourceVersion"], v);
            let line = store.lock().history.back().unwrap().encoded.clone();
            let ev: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(ev["type"], t);
        }
        let gone = store.write(CM, "ns", "a", |_| Ok(Write::Delete)).unwrap();
        assert!(
            gone.json.is_none(),
            "a deletion answers with its own document"
        );
    }

    #[test]
    fn versions_history_and_exact_lists() {
        let store = Store::new(100);
        store
            .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", "1"))))
            .unwrap();
        let rv1 = store.resource_version();
        store
            .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", "2"))))
            .unwrap();
        store
            .write(CM, "ns", "b", |_| Ok(Write::Put(cm("b", "1"))))
            .unwrap();
        let w = store.write(CM, "ns", "a", |_| Ok(Write::Delete)).unwrap();
        assert_eq!(w.event, Some(EventType::Deleted));
        assert_eq!(w.object["metadata"]["resourceVersion"], "4");
        assert_eq!(store.resource_version(), 4);
        let at1 = store.list_at(CM, Some("ns"), rv1).unwrap();
        assert_eq!(at1.len(), 1);
        assert_eq!(at1[0]["data"]["v"], "1");
        assert_eq!(store.list(CM, Some("ns")).0.len(), 1);
        let rvs = |after, max| {
            let mut taken = Vec::new();
            store.take_since(after, max, &mut taken).unwrap();
            taken.iter().map(|e| e.rv).collect::<Vec<_>>()
        };
        assert_eq!(rvs(rv1, 10), [2, 3, 4]);
        assert_eq!(rvs(rv1, 2), [2, 3]);
        assert_eq!(rvs(4, 10), Vec::<u64>::new());
        store.compact();
        assert_eq!(store.subscribe(CM, None, Some(rv1)).unwrap_err().code, 410);
        assert_eq!(
            store.take_since(rv1, 10, &mut Vec::new()).unwrap_err().code,
            410
        );
        assert_eq!(store.list_at(CM, None, rv1).unwrap_err().code, 410);
        assert!(store.subscribe(CM, None, Some(4)).is_ok());
    }

    #[test]
    fn a_watch_only_starts_from_an_issued_version() {
        let store = Store::new(10);
        store
            .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", "1"))))
            .unwrap();
        assert!(store.subscribe_issued(CM, None, 1).is_ok());
        assert!(store.subscribe_issued(CM, None, 0).is_ok());
        let err = store.subscribe_issued(CM, None, 2).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        // Once issued, the same version is a valid starting point.
        store
            .write(CM, "ns", "b", |_| Ok(Write::Put(cm("b", "1"))))
            .unwrap();
        assert!(store.subscribe_issued(CM, None, 2).is_ok());
    }

    #[test]
    fn lists_are_sorted_by_namespace_and_name() {
        let store = Store::new(100);
        for (ns, name) in [("b", "y"), ("a", "z"), ("b", "x"), ("a", "a")] {
            store
                .write(CM, ns, name, |_| {
                    Ok(Write::Put(
                        json!({"metadata": {"name": name, "namespace": ns}}),
                    ))
                })
                .unwrap();
        }
        let rv = store.resource_version();
        store
            .write(CM, "a", "b", |_| {
                Ok(Write::Put(
                    json!({"metadata": {"name": "b", "namespace": "a"}}),
                ))
            })
            .unwrap();
        let names = |objs: Vec<Arc<Value>>| {
            objs.iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["metadata"]["namespace"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(store.list(CM, None).0),
            ["a/a", "a/b", "a/z", "b/x", "b/y"]
        );
        assert_eq!(names(store.list(CM, Some("b")).0), ["b/x", "b/y"]);
        assert_eq!(
            names(store.list_at(CM, Some("a"), rv).unwrap()),
            ["a/a", "a/z"]
        );
    }

    #[test]
    fn failed_write_changes_nothing() {
        let store = Store::new(10);
        let err = store
            .write(CM, "ns", "a", |_| Err(ApiError::bad_request("no")))
            .unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(store.resource_version(), 0);
        assert!(store.get(CM, "ns", "a").is_none());
    }

    #[test]
    fn window_bounds_history() {
        let store = Store::new(2);
        for i in 0..5 {
            store
                .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", &i.to_string()))))
                .unwrap();
        }
        assert_eq!(store.oldest_resource_version(), 3);
        assert!(store.subscribe(CM, None, Some(2)).is_err());
        assert!(store.subscribe(CM, None, Some(3)).is_ok());
        let mut taken = Vec::new();
        store.take_since(3, 10, &mut taken).unwrap();
        assert_eq!(taken.iter().map(|e| e.rv).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn bytes_bound_history() {
        let big = "x".repeat(2_900_000);
        let store = Store::new(10_000);
        let rv1 = {
            store
                .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", &big))))
                .unwrap();
            store.resource_version()
        };
        // Sixty versions of 2.9 MB: five times the bound.
        for i in 0..60 {
            let v = format!("{i}{big}");
            store
                .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", &v))))
                .unwrap();
            assert!(
                store.history_bytes() <= DEFAULT_HISTORY_BYTES,
                "{} bytes after {i} updates",
                store.history_bytes()
            );
        }
        let kept = store.history_len();
        assert!((5..=12).contains(&kept), "{kept} events kept");
        let sum: usize = store.lock().history.iter().map(|e| event_bytes(e)).sum();
        assert_eq!(store.history_bytes(), sum);
        // Evicted by bytes: the same 410 as by the event count.
        let err = store.subscribe(CM, None, Some(rv1)).unwrap_err();
        assert_eq!((err.code, err.reason), (410, "Expired"));
        assert_eq!(store.list_at(CM, None, rv1).unwrap_err().code, 410);
        let newest = store.resource_version();
        assert!(store.subscribe(CM, None, Some(newest - 1)).is_ok());
        store.compact();
        assert_eq!(store.history_bytes(), 0);
    }

    #[test]
    fn the_newest_event_stays_whatever_its_size() {
        let store = Store::with_history(100, 10);
        for i in 0..3 {
            store
                .write(CM, "ns", "a", |_| Ok(Write::Put(cm("a", &i.to_string()))))
                .unwrap();
        }
        assert_eq!(store.history_len(), 1);
        assert_eq!(store.oldest_resource_version(), 2);
        let mut taken = Vec::new();
        store.take_since(2, 10, &mut taken).unwrap();
        assert_eq!(taken.iter().map(|e| e.rv).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn event_encoding() {
        let b = encode_event("ADDED", &json!({"a": 1}));
        assert_eq!(&b[..], b"{\"type\":\"ADDED\",\"object\":{\"a\":1}}\n");
    }
}
