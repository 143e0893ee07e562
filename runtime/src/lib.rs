//! The agent's runtime processes (SPEC section 3): the IKE daemon and
//! `ovs-monitor-ipsec`, and what the agent must know about the programs the
//! image gives it before it runs them.
//!
//! # Layout
//! - [`monitor_patch`]: does the `ovs-monitor-ipsec` script the agent would
//!   run carry the project's patch (`image/patches/ovs-monitor-ipsec-3.1.patch`)?
//!   Decides whether the agent keeps its CA workaround.
//! - [`Error`]: the crate's one error type.

pub mod monitor_patch;

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The monitor script could not be read.
    #[error("cannot read ovs-monitor-ipsec script {path}: {source}")]
    ReadMonitorScript {
        /// The script's path.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The file read is not an ovs-monitor-ipsec script (wrong path
    /// configured), so nothing can be said about its patch.
    #[error("{path} is not an ovs-monitor-ipsec script (no `class IPsecMonitor`)")]
    NotAMonitorScript {
        /// The path that was read.
        path: PathBuf,
    },
}

impl Error {
    /// A short, stable label for metrics and status reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::ReadMonitorScript { .. } => "read_monitor_script",
            Error::NotAMonitorScript { .. } => "not_a_monitor_script",
        }
    }
}
