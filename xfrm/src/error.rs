//! The crate's one error type.

use std::path::PathBuf;

use crate::codec::CodecError;
use crate::model::Family;

/// Everything that can go wrong talking to the kernel's XFRM or keeping the
/// guards.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A netlink XFRM request failed.
    #[error("netlink XFRM {what}: {source}")]
    Netlink {
        /// The request.
        what: &'static str,
        /// The kernel's (or socket's) error.
        #[source]
        source: std::io::Error,
    },
    /// A network namespace file could not be opened.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The kernel sent a netlink message that cannot be parsed.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Allocation refused: a policy would let marked tunnel traffic out in
    /// plaintext ahead of the guards (SPEC §4).
    #[error("lease allocation refused: bypass present: {reason}")]
    BypassPresent {
        /// The bypass policy, described.
        reason: String,
    },
    /// Every candidate mark/reqid was rejected.
    #[error("no usable lease after {attempts} candidates (last rejection: {last})")]
    LeaseExhausted {
        /// Candidates tried.
        attempts: u32,
        /// The last rejection.
        last: String,
    },
    /// A guard was deleted but still reads back (cleanup path).
    #[error("guard {family} index {index} still present after deletion")]
    GuardStillPresent {
        /// Its family.
        family: Family,
        /// Its index.
        index: u32,
    },
}

impl Error {
    /// A short, stable label for metrics and status reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Netlink { .. } => "netlink",
            Error::Io { .. } => "io",
            Error::Codec(_) => "netlink_codec",
            Error::BypassPresent { .. } => "bypass_present",
            Error::LeaseExhausted { .. } => "lease_exhausted",
            Error::GuardStillPresent { .. } => "guard_still_present",
        }
    }
}
