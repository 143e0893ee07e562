//! Wall-clock time as an injected dependency.
//!
//! Certificates, receipts and coordination records carry wall-clock
//! validity, so every check that needs "now" takes it from a [`Clock`]
//! handed in at construction. [`SystemClock`] is the one adapter that reads
//! the real clock; [`FixedClock`] pins time for tests and benches. The rest
//! of this crate never reads a clock: its checks take the instant as a
//! parameter.

use std::fmt::Debug;
use std::time::SystemTime;

use crate::error::Result;
use crate::time::Timestamp;

/// Source of wall-clock time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    // This is the clock adapter: the one place allowed to read the system
    // clock; everything else receives time through `Clock`.
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock fixed at a given instant (tests, benches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedClock(pub SystemTime);

impl FixedClock {
    /// A clock that always answers `at`.
    pub fn new(at: SystemTime) -> Self {
        Self(at)
    }
}

impl Clock for FixedClock {
    fn now(&self) -> SystemTime {
        self.0
    }
}

/// Whole seconds since the Unix epoch, negative before it, saturating at
/// the `i64` range: the one conversion from `SystemTime` to the seconds
/// certificates and documents carry.
pub fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// `t` as a [`Timestamp`] (sub-second part dropped).
pub fn timestamp(t: SystemTime) -> Result<Timestamp> {
    Timestamp::from_unix(unix_seconds(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fixed_clock_answers_its_instant() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(FixedClock::new(at).now(), at);
    }

    #[test]
    fn unix_seconds_before_and_after_the_epoch() {
        let e = SystemTime::UNIX_EPOCH;
        assert_eq!(unix_seconds(e + Duration::from_millis(1_500)), 1);
        assert_eq!(unix_seconds(e - Duration::from_secs(2)), -2);
        assert_eq!(timestamp(e + Duration::from_secs(60)).unwrap().unix(), 60);
    }

    #[test]
    fn system_clock_is_after_the_epoch() {
        assert!(SystemClock.now() > SystemTime::UNIX_EPOCH);
    }
}
