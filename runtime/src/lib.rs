//! The `kube-ovn-ipsec` binary: the agent's real adapters and their wiring.
//!
//! The actors (`actors` crate) decide; this crate does: it implements their
//! ports over kube-rs, the `ovsdb` client, netlink XFRM (`xfrm` crate), the
//! key directory and the IKE daemon and ovs-monitor-ipsec as foreground
//! children, serves `/status`, `/readyz`, `/healthz` and `/metrics`, and
//! puts the actor tree together in `run`'s start-up order.
//!
//! # Layout
//! - [`agent`]: `kube-ovn-ipsec run` — the actor tree with its real adapters
//!   (kube-rs, OVSDB) and the status server.
//! - [`monitor_patch`]: does the `ovs-monitor-ipsec` script the agent would
//!   run carry the project's patch (`image/patches/ovs-monitor-ipsec-3.1.patch`)?
//!   Reported at start-up; the refresh fix is what it changes.
//! - [`lease`]: the output-protection lease — allocation, persistence,
//!   OVSDB publication.
//! - [`sa`]: SA attribution by reqid + mark + exact selector, and the
//!   observation record.
//! - [`capability`]: the capability gate (ovn-controller's output
//!   protection marker, image and running).
//! - [`node`]: what `run` and `cleanup` share about their node — its
//!   flags, the coordination record as read, receipts signed and published.
//! - [`node_claim`]: one owner per node — the claim in the node's network
//!   namespace, keyed by its OVSDB row, that a second agent or cleanup
//!   refuses on whatever its key directory.
//! - [`pidfile`]: the IKE daemon's pidfiles, removed only when stale.
//! - [`process`]: foreground children in their own process group.
//! - [`ike`]: strongSwan starter — start, probe, loaded certificates, stop,
//!   the trust bundle installed one file per CA.
//! - [`monitor`]: ovs-monitor-ipsec — start, `tunnels/show`, the
//!   acknowledgement of the active generation.
//! - [`appctl`]: the binary started as `ovs-appctl` (the image's link): a
//!   bare `ovs-appctl ipsec/show` reaches the agent, every other command
//!   ovs-vswitchd.
//! - [`cli`]: the `kube-ovn-ipsec` command line (`run`, `cleanup`), and
//!   the logger with the secret guards of `kube_ovn_ipsec_api::logsafe`.
//! - [`k8s_client`]: the Kubernetes client configuration, loaded without
//!   quoting a credential in an error or panicking on a broken token.
//! - [`fsutil`]: the boot ID (crash-safe writes are `actors::keydir::write_atomic`).
//! - [`Error`]: the crate's one error type.

pub mod agent;
pub mod appctl;
pub mod capability;
pub mod cleanup;
pub mod cli;
pub mod fsutil;
pub mod ike;
pub mod k8s_client;
pub mod lease;
pub mod monitor;
pub mod monitor_patch;
pub mod node;
pub mod node_claim;
pub mod pidfile;
pub mod process;
pub mod sa;

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
    /// A file or directory operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A persisted file cannot be read as what it should be.
    #[error("{path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Kernel XFRM: a netlink request, its reply, lease allocation or a
    /// guard.
    #[error(transparent)]
    Xfrm(#[from] xfrm::Error),
    /// Blocking work run off the async executor did not complete (its
    /// thread panicked, or the runtime is shutting down).
    #[error("{what} did not complete: {reason}")]
    Blocking {
        /// The operation.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A program could not be run.
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A control command did not finish in time.
    #[error("`{command}` did not finish within {timeout:?}")]
    CommandTimeout {
        /// The program.
        command: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
    /// A supervised process failed its health probe or exited.
    #[error("{process} unhealthy: {reason}")]
    Unhealthy {
        /// `ike` or `monitor`.
        process: &'static str,
        /// Why.
        reason: String,
    },
    /// The capability gate failed (SPEC §4): exit with
    /// [`capability::CAPABILITY_MISSING_EXIT_CODE`].
    #[error("CapabilityMissing: {which}: {detail}")]
    CapabilityMissing {
        /// Which ovn-controller lacks the marker.
        which: capability::Which,
        /// What it said instead.
        detail: String,
    },
    /// An OVSDB operation failed.
    #[error("OVSDB: {0}")]
    Ovsdb(#[source] ovsdb::Error),
}

impl Error {
    /// A short, stable label for metrics and status reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::ReadMonitorScript { .. } => "read_monitor_script",
            Error::NotAMonitorScript { .. } => "not_a_monitor_script",
            Error::Io { .. } => "io",
            Error::Corrupt { .. } => "corrupt",
            Error::Xfrm(e) => e.metric_label(),
            Error::Blocking { .. } => "blocking",
            Error::Ovsdb(_) => "ovsdb",
            Error::Spawn { .. } => "spawn",
            Error::CommandTimeout { .. } => "command_timeout",
            Error::Unhealthy { .. } => "unhealthy",
            Error::CapabilityMissing { .. } => "capability_missing",
        }
    }
}
