//! How every IKE_SA and CHILD_SA is rekeyed: lifetimes, margin and fuzz,
//! checked once here and handed to the patched ovs-monitor-ipsec, which
//! writes them (with `reauth=no`) into every connection.
//!
//! strongSwan starts rekeying an SA `margin + random(0 ..= margin × fuzz)`
//! before its lifetime ends. A margin that, stretched by the fuzz, reaches a
//! lifetime would have charon rekey at once and again after every rekey; it
//! is refused with the numbers, before anything starts.

use std::fmt;
use std::time::Duration;

/// Lifetimes and rekey timing of every connection the monitor writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rekeying {
    ike_lifetime: Duration,
    child_lifetime: Duration,
    margin: Duration,
    fuzz_percent: u32,
}

/// Why a [`Rekeying`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RekeyingError {
    /// A lifetime or the margin is zero.
    Zero(&'static str),
    /// The margin stretched by the fuzz reaches the shorter lifetime.
    NoTimeLeft {
        /// The margin, in seconds.
        margin: u64,
        /// The fuzz, in percent of the margin.
        fuzz_percent: u32,
        /// The shorter of the two lifetimes, in seconds.
        lifetime: u64,
    },
}

impl fmt::Display for RekeyingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RekeyingError::Zero(what) => write!(f, "{what} must be at least 1 s"),
            RekeyingError::NoTimeLeft {
                margin,
                fuzz_percent,
                lifetime,
            } => write!(
                f,
                "a rekey margin of {margin} s with {fuzz_percent} % fuzz starts rekeying up to \
                 {} s before a lifetime ends, which leaves nothing of the {lifetime} s lifetime: \
                 shorten the margin or the fuzz, or lengthen the lifetimes",
                stretched(*margin, *fuzz_percent)
            ),
        }
    }
}

impl std::error::Error for RekeyingError {}

fn stretched(margin: u64, fuzz_percent: u32) -> u64 {
    margin.saturating_mul(100 + u64::from(fuzz_percent)) / 100
}

impl Rekeying {
    /// strongSwan 5.9's own lifetimes (`ikelifetime=3h`, `lifetime=1h`,
    /// `margintime=9m`, `rekeyfuzz=100%`), rekeyed instead of
    /// reauthenticated.
    pub const DEFAULT: Rekeying = Rekeying {
        ike_lifetime: Duration::from_secs(3 * 3600),
        child_lifetime: Duration::from_secs(3600),
        margin: Duration::from_secs(9 * 60),
        fuzz_percent: 100,
    };

    /// Checks that rekeying can start before either lifetime ends.
    pub fn new(
        ike_lifetime: Duration,
        child_lifetime: Duration,
        margin: Duration,
        fuzz_percent: u32,
    ) -> Result<Self, RekeyingError> {
        for (d, what) in [
            (ike_lifetime, "the IKE_SA lifetime"),
            (child_lifetime, "the CHILD_SA lifetime"),
            (margin, "the rekey margin"),
        ] {
            if d.as_secs() == 0 {
                return Err(RekeyingError::Zero(what));
            }
        }
        let lifetime = ike_lifetime.min(child_lifetime).as_secs();
        if stretched(margin.as_secs(), fuzz_percent) >= lifetime {
            return Err(RekeyingError::NoTimeLeft {
                margin: margin.as_secs(),
                fuzz_percent,
                lifetime,
            });
        }
        Ok(Rekeying {
            ike_lifetime,
            child_lifetime,
            margin,
            fuzz_percent,
        })
    }

    /// The IKE_SA lifetime.
    pub fn ike_lifetime(&self) -> Duration {
        self.ike_lifetime
    }

    /// The CHILD_SA lifetime.
    pub fn child_lifetime(&self) -> Duration {
        self.child_lifetime
    }

    /// The earliest and latest moment after an SA's start at which
    /// strongSwan starts rekeying it, for an SA of `lifetime`.
    pub fn rekey_window(&self, lifetime: Duration) -> (Duration, Duration) {
        let margin = self.margin.as_secs();
        let latest = lifetime.as_secs().saturating_sub(margin);
        let earliest = lifetime
            .as_secs()
            .saturating_sub(stretched(margin, self.fuzz_percent));
        (Duration::from_secs(earliest), Duration::from_secs(latest))
    }

    /// `--ike-lifetime=…`, `--child-lifetime=…`, `--rekey-margin=…` and
    /// `--rekey-fuzz=…`: the agent's flags, and the same arguments of the
    /// patched monitor.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--ike-lifetime={}", self.ike_lifetime.as_secs()),
            format!("--child-lifetime={}", self.child_lifetime.as_secs()),
            format!("--rekey-margin={}", self.margin.as_secs()),
            format!("--rekey-fuzz={}", self.fuzz_percent),
        ]
    }
}

impl Default for Rekeying {
    fn default() -> Self {
        Rekeying::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn default_is_strongswans_and_valid() {
        let d = Rekeying::DEFAULT;
        assert_eq!(
            Rekeying::new(secs(10800), secs(3600), secs(540), 100),
            Ok(d)
        );
        // CHILD_SAs rekey 42–51 minutes in; IKE_SAs 2h42–2h51.
        assert_eq!(d.rekey_window(d.child_lifetime()), (secs(2520), secs(3060)));
        assert_eq!(d.rekey_window(d.ike_lifetime()), (secs(9720), secs(10260)));
        assert_eq!(
            d.flags(),
            [
                "--ike-lifetime=10800",
                "--child-lifetime=3600",
                "--rekey-margin=540",
                "--rekey-fuzz=100"
            ]
        );
    }

    #[test]
    fn margin_that_reaches_a_lifetime_is_refused_with_the_numbers() {
        let e = Rekeying::new(secs(600), secs(60), secs(30), 100).unwrap_err();
        assert_eq!(
            e,
            RekeyingError::NoTimeLeft {
                margin: 30,
                fuzz_percent: 100,
                lifetime: 60
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("60 s before") && text.contains("60 s lifetime"),
            "{text}"
        );
        // One second less of margin leaves time.
        assert!(Rekeying::new(secs(600), secs(60), secs(29), 100).is_ok());
        assert!(Rekeying::new(secs(600), secs(60), secs(30), 99).is_ok());
    }

    #[test]
    fn zero_is_refused() {
        assert_eq!(
            Rekeying::new(secs(0), secs(60), secs(5), 0),
            Err(RekeyingError::Zero("the IKE_SA lifetime"))
        );
        assert_eq!(
            Rekeying::new(secs(60), secs(60), secs(0), 0),
            Err(RekeyingError::Zero("the rekey margin"))
        );
    }
}
