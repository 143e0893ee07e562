//! Watches that start over: a fresh LIST at least every resync period and
//! after every watch error.
//!
//! kube-runtime's `watcher` lists once and then follows the watch from the
//! last resourceVersion it saw; it relists only when the server answers 410
//! Expired. kube-apiserver does not always say so: after its etcd was
//! restored from an older backup (resourceVersions went backwards), a watch
//! from a version it has not reached yet is accepted and silently waits for
//! it, and every change below that version is never delivered. The same
//! stream wrapped by [`resyncing`] notices within one period: a pending CSR
//! is reconciled and the live-state caches catch up whatever the versions
//! say. Relisting after any error (not only a 410) also covers a server that
//! came back on the same address with another history. The LIST asks for
//! `resourceVersion=0` (kube-runtime's default), which kube-apiserver serves
//! from its watch cache, not from etcd.

use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

/// `start`'s watch stream, started over with a fresh `start()` (a new LIST)
/// when `period` has passed since the last complete list, after an error
/// (passed on first, so the caller's backoff runs before the relist), and
/// when the stream ends. A list in progress is never cut short: the period
/// restarts when it completes.
pub fn resyncing<K, S, F>(
    what: &'static str,
    start: F,
    period: Duration,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Send + 'static,
    S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    F: FnMut() -> S + Send + 'static,
{
    let state = Resync {
        what,
        start,
        current: None,
        listing: false,
        due: Instant::now() + period,
        period,
    };
    futures::stream::unfold(state, Resync::next)
}

struct Resync<F, S> {
    what: &'static str,
    start: F,
    current: Option<Pin<Box<S>>>,
    /// Between `Init` and `InitDone`: restarting now would throw the list away.
    listing: bool,
    /// When the next relist is due.
    due: Instant,
    period: Duration,
}

impl<K, S, F> Resync<F, S>
where
    S: Stream<Item = watcher::Result<Event<K>>>,
    F: FnMut() -> S,
{
    async fn next(mut self) -> Option<(watcher::Result<Event<K>>, Self)> {
        loop {
            let current = match &mut self.current {
                Some(current) => current,
                none => none.insert(Box::pin((self.start)())),
            };
            let item = tokio::select! {
                item = current.next() => item,
                () = tokio::time::sleep_until(self.due), if !self.listing => {
                    tracing::debug!(watch = self.what, "resync: relisting");
                    self.restart();
                    continue;
                }
            };
            match item {
                Some(Ok(event)) => {
                    match &event {
                        Event::Init => self.listing = true,
                        Event::InitDone => {
                            self.listing = false;
                            self.due = Instant::now() + self.period;
                        }
                        Event::Apply(_) | Event::Delete(_) | Event::InitApply(_) => {}
                    }
                    return Some((Ok(event), self));
                }
                Some(Err(e)) => {
                    if is_expired(&e) {
                        tracing::info!(watch = self.what, error = %e, "watch expired; relisting");
                    } else {
                        tracing::warn!(watch = self.what, error = %e, "watch failed; relisting");
                    }
                    self.restart();
                    return Some((Err(e), self));
                }
                // A watcher's stream does not end; if one does, start over.
                None => self.restart(),
            }
        }
    }

    fn restart(&mut self) {
        self.current = None;
        self.listing = false;
        self.due = Instant::now() + self.period;
    }
}

/// A 410 Expired: routine (compaction, a watch behind the server's window).
fn is_expired(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use futures::stream::{self, BoxStream};

    use super::*;

    const PERIOD: Duration = Duration::from_secs(60);

    /// A list of one object named after the start count, then a watch that
    /// never delivers anything (a watch silently waiting for a version).
    fn silent(n: u32) -> BoxStream<'static, watcher::Result<Event<u32>>> {
        stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(n)),
            Ok(Event::InitDone),
        ])
        .chain(stream::pending())
        .boxed()
    }

    fn counted(
        f: impl Fn(u32) -> BoxStream<'static, watcher::Result<Event<u32>>> + Send + 'static,
    ) -> (
        Arc<AtomicU32>,
        impl FnMut() -> BoxStream<'static, watcher::Result<Event<u32>>>,
    ) {
        let starts = Arc::new(AtomicU32::new(0));
        let s = starts.clone();
        (starts, move || f(s.fetch_add(1, Ordering::SeqCst) + 1))
    }

    fn listed(ev: &watcher::Result<Event<u32>>) -> Option<u32> {
        match ev {
            Ok(Event::InitApply(n)) => Some(*n),
            _ => None,
        }
    }

    /// The next object listed, and how long it took.
    async fn next_listed(
        s: &mut (impl Stream<Item = watcher::Result<Event<u32>>> + Unpin),
    ) -> (u32, Duration) {
        let t = Instant::now();
        loop {
            let ev = tokio::time::timeout(10 * PERIOD, s.next())
                .await
                .expect("an event")
                .expect("the stream does not end");
            if let Some(n) = listed(&ev) {
                return (n, t.elapsed());
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_relisted_every_period() {
        let (starts, start) = counted(silent);
        let mut s = Box::pin(resyncing("test", start, PERIOD));
        assert_eq!(next_listed(&mut s).await, (1, Duration::ZERO));
        assert_eq!(next_listed(&mut s).await, (2, PERIOD));
        assert_eq!(next_listed(&mut s).await, (3, PERIOD));
        assert_eq!(starts.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_is_passed_on_and_then_relisted_at_once() {
        let (starts, start) = counted(|n| {
            if n == 1 {
                stream::iter([
                    Ok(Event::Init),
                    Ok(Event::InitApply(1)),
                    Ok(Event::InitDone),
                    Err(watcher::Error::NoResourceVersion),
                ])
                .chain(stream::pending())
                .boxed()
            } else {
                silent(n)
            }
        });
        let mut s = Box::pin(resyncing("test", start, PERIOD));
        assert_eq!(next_listed(&mut s).await.0, 1);
        let _done = s.next().await;
        assert!(matches!(s.next().await, Some(Err(_))));
        assert_eq!(next_listed(&mut s).await, (2, Duration::ZERO));
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_in_progress_is_not_cut_short() {
        // The first list takes three periods to deliver its object.
        let (starts, start) = counted(|n| {
            let slow = if n == 1 { 3 * PERIOD } else { Duration::ZERO };
            stream::iter([Ok(Event::Init)])
                .chain(stream::once(async move {
                    tokio::time::sleep(slow).await;
                    Ok(Event::InitApply(n))
                }))
                .chain(stream::iter([Ok(Event::InitDone)]))
                .chain(stream::pending())
                .boxed()
        });
        let mut s = Box::pin(resyncing("test", start, PERIOD));
        assert_eq!(next_listed(&mut s).await, (1, 3 * PERIOD));
        // The period counts from the completed list.
        assert_eq!(next_listed(&mut s).await, (2, PERIOD));
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }
}
