//! A read-modify-replace retried when another writer got there first.
//!
//! Kubernetes objects are replaced with the resourceVersion of the read
//! they were modified from, so a concurrent write fails the replace with
//! `409 Conflict` instead of being overwritten. The answer is always the
//! same: read again, apply the change again, replace again, a bounded
//! number of times. [`replace_on_conflict`] is that loop, once; each
//! caller supplies the attempt (read, modify, replace) and what counts as
//! a conflict for its error type, so this crate stays free of the API
//! client.

use std::future::Future;

/// How a read-modify-replace that never succeeded ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplaceError<E> {
    /// An attempt failed with an error that is not a conflict: no further
    /// attempt was made.
    Failed(E),
    /// Every attempt lost to a concurrent writer: the last attempt's
    /// conflict.
    Exhausted(E),
}

impl<E> ReplaceError<E> {
    /// The error the last attempt returned, whichever way it ended.
    pub fn into_inner(self) -> E {
        match self {
            ReplaceError::Failed(e) | ReplaceError::Exhausted(e) => e,
        }
    }

    /// A failure as it is; exhaustion as `exhausted` makes it from the last
    /// conflict (each caller says in its own words what kept changing).
    pub fn or_exhausted(self, exhausted: impl FnOnce(E) -> E) -> E {
        match self {
            ReplaceError::Failed(e) => e,
            ReplaceError::Exhausted(e) => exhausted(e),
        }
    }
}

/// Runs `attempt` until it succeeds, fails with an error `is_conflict`
/// does not accept, or `attempts` attempts (at least one) all conflicted.
/// No pause between attempts: a conflict means the next read sees the
/// other writer's result, so trying again at once is what makes progress.
/// A caller that wants a pause puts it in its attempt.
///
/// The attempt is a closure returning a future rather than an async
/// closure: the future of an `AsyncFnMut` borrows the closure, and the
/// compiler cannot yet prove such a future `Send` for every borrow, which
/// a task spawned on a multi-threaded runtime needs.
pub async fn replace_on_conflict<T, E, F>(
    attempts: u32,
    is_conflict: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> F,
) -> Result<T, ReplaceError<E>>
where
    F: Future<Output = Result<T, E>>,
{
    let mut left = attempts.max(1);
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(e) if !is_conflict(&e) => return Err(ReplaceError::Failed(e)),
            Err(e) => {
                left -= 1;
                if left == 0 {
                    return Err(ReplaceError::Exhausted(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// Drives a future that never waits on anything outside itself: this
    /// crate has no async runtime, and the attempts below are all ready.
    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = pin!(f);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Fault {
        Conflict(u32),
        Broken(u32),
    }

    fn conflict(e: &Fault) -> bool {
        matches!(e, Fault::Conflict(_))
    }

    /// Runs the helper over `script` (one outcome per attempt, in order),
    /// returning its result and how many attempts it made.
    fn run(
        attempts: u32,
        script: Vec<Result<&'static str, Fault>>,
    ) -> (Result<&'static str, ReplaceError<Fault>>, usize) {
        let mut script = script.into_iter();
        let mut made = 0;
        let out = block_on(replace_on_conflict(attempts, conflict, || {
            made += 1;
            std::future::ready(script.next().unwrap_or(Err(Fault::Broken(99))))
        }));
        (out, made)
    }

    #[test]
    fn two_conflicts_then_success_returns_the_success() {
        let script = vec![Err(Fault::Conflict(1)), Err(Fault::Conflict(2)), Ok("done")];
        assert_eq!(run(5, script), (Ok("done"), 3));
    }

    #[test]
    fn another_error_is_returned_at_once() {
        let script = vec![Err(Fault::Broken(1)), Ok("never")];
        assert_eq!(
            run(5, script),
            (Err(ReplaceError::Failed(Fault::Broken(1))), 1)
        );
        let script = vec![Err(Fault::Conflict(1)), Err(Fault::Broken(2))];
        assert_eq!(
            run(5, script),
            (Err(ReplaceError::Failed(Fault::Broken(2))), 2)
        );
    }

    #[test]
    fn exhaustion_after_n_conflicts_keeps_the_last() {
        let script = (1..=6).map(|i| Err(Fault::Conflict(i))).collect();
        assert_eq!(
            run(5, script),
            (Err(ReplaceError::Exhausted(Fault::Conflict(5))), 5)
        );
    }

    #[test]
    fn zero_attempts_still_makes_one() {
        let (out, made) = run(0, vec![Err(Fault::Conflict(1)), Ok("late")]);
        assert_eq!(
            (out, made),
            (Err(ReplaceError::Exhausted(Fault::Conflict(1))), 1)
        );
    }

    #[test]
    fn the_caller_names_exhaustion_and_keeps_failures() {
        let named = |e: ReplaceError<Fault>| e.or_exhausted(|_| Fault::Broken(0));
        assert_eq!(
            named(ReplaceError::Exhausted(Fault::Conflict(3))),
            Fault::Broken(0)
        );
        assert_eq!(
            named(ReplaceError::Failed(Fault::Broken(7))),
            Fault::Broken(7)
        );
        assert_eq!(
            ReplaceError::Exhausted(Fault::Conflict(3)).into_inner(),
            Fault::Conflict(3)
        );
    }
}
