//! Time as an injected dependency, so lifetime checks are testable.

use std::time::SystemTime;

/// Source of wall-clock time (certificates carry wall-clock validity).
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock fixed at a given instant (tests, benches).
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub SystemTime);

impl Clock for FixedClock {
    fn now(&self) -> SystemTime {
        self.0
    }
}
