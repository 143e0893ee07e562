//! A wall clock that follows tokio's (possibly paused) time.
//!
//! The clock trait and the system adapter are `kube_ovn_ipsec_api::clock`'s.
//! Timers use `tokio::time` (pausable in tests); certificate validity needs
//! calendar time. [`TokioClock`] joins the two: it starts at a real (or
//! given) wall time and then advances with tokio's clock, so a test that
//! calls `tokio::time::advance` moves certificate time along with the timers.

use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::clock::Clock;

/// Wall time that follows tokio's (possibly paused) clock from a base.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: SystemTime,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `base` now and advancing with `tokio::time`.
    pub fn starting_at(base: SystemTime) -> Self {
        Self {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        let elapsed: Duration = tokio::time::Instant::now().duration_since(self.start);
        self.base + elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let c = TokioClock::starting_at(base);
        assert_eq!(c.now(), base);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(c.now(), base + Duration::from_secs(3600));
    }
}
