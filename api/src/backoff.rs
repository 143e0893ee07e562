//! The one restart and retry schedule (SPEC §3): supervised actors,
//! processes, renewal attempts and OVSDB reconnects all back off 1 s, 2 s,
//! 4 s … capped at 30 s, reset once the thing has run healthy for 60 s (or,
//! for a connection, once it is up again).
//!
//! Hand-rolled rather than taken from `backon` (see docs/decisions.md): the
//! schedule is a pure value that the supervisor keeps per child and resets
//! from observed uptime, which `backon`'s retry-a-future iterators do not
//! model, and the timers that consume it are tokio timers so tests run under
//! `tokio::time::pause()`.

use std::time::Duration;

/// The shape of an exponential backoff schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// First delay.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Uptime after which the schedule starts over from `initial`.
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl BackoffPolicy {
    /// The delay after `failures` failures in a row: `initial` doubled
    /// once per failure, at most `max` (never less than `initial`). The
    /// one doubling-with-cap; every retry schedule of the project is this
    /// with its own `initial` and `max`.
    pub fn delay_after(self, failures: u32) -> Duration {
        // 2^failures saturates long before u32 overflow matters: cap the shift.
        let factor = 1u32 << failures.min(20);
        self.initial
            .saturating_mul(factor)
            .min(self.max.max(self.initial))
    }

    /// A fresh schedule following this policy.
    pub fn start(self) -> Backoff {
        Backoff {
            policy: self,
            attempt: 0,
        }
    }
}

/// A running backoff schedule: how many consecutive failures it has seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    policy: BackoffPolicy,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        BackoffPolicy::default().start()
    }
}

impl Backoff {
    /// The delay before the next attempt; advances the schedule.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.policy.delay_after(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// A failure after having run for `uptime`: resets first when the run was
    /// healthy for at least `reset_after`, then returns the next delay.
    pub fn failed_after(&mut self, uptime: Duration) -> Duration {
        if uptime >= self.policy.reset_after {
            self.reset();
        }
        self.next_delay()
    }

    /// Start over from the initial delay.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Consecutive failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.attempt
    }

    /// The policy this schedule follows.
    pub fn policy(&self) -> BackoffPolicy {
        self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Vec<Duration>) -> Vec<u64> {
        d.into_iter().map(|d| d.as_secs()).collect()
    }

    #[test]
    fn sequence_is_1_2_4_8_16_30_30() {
        let mut b = Backoff::default();
        let seq: Vec<_> = (0..7).map(|_| b.next_delay()).collect();
        assert_eq!(secs(seq), vec![1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.failures(), 7);
    }

    #[test]
    fn delay_after_doubles_caps_and_never_overflows() {
        let p = BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            reset_after: Duration::MAX,
        };
        let got: Vec<u64> = [0, 1, 2, 3, 40, u32::MAX]
            .map(|f| p.delay_after(f).as_secs())
            .to_vec();
        assert_eq!(got, vec![10, 20, 40, 60, 60, 60]);
        // A cap below the first delay never shortens it.
        let p = BackoffPolicy {
            max: Duration::from_secs(1),
            ..p
        };
        assert_eq!(p.delay_after(3), Duration::from_secs(10));
    }

    #[test]
    fn resets_after_sixty_seconds_healthy() {
        let mut b = Backoff::default();
        for _ in 0..6 {
            b.next_delay();
        }
        // 59 s of uptime is not enough to start over.
        assert_eq!(b.failed_after(Duration::from_secs(59)).as_secs(), 30);
        assert_eq!(b.failed_after(Duration::from_secs(60)).as_secs(), 1);
        assert_eq!(b.failed_after(Duration::from_secs(1)).as_secs(), 2);
    }

    #[test]
    fn backoff_doubles_and_caps_and_resets() {
        let mut b = BackoffPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            ..BackoffPolicy::default()
        }
        .start();
        let got: Vec<u64> = (0..7).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 30, 30]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::default();
        for _ in 0..1000 {
            assert!(b.next_delay() <= Duration::from_secs(30));
        }
    }
}
