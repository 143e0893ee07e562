//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the agent's actors and their ports.
///
/// Variants carry paths, names and short reasons, never key material or PEM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key directory (or a file in it) cannot be written: a read-only
    /// `/etc` (Talos) or missing permissions.
    #[error(
        "key directory {path} is not writable ({source}); set OVN_IPSEC_KEY_DIR \
         (e.g. /var/lib/ovs_ipsec_keys on hosts with a read-only /etc)"
    )]
    KeyDirReadOnly {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The key directory's filesystem is full (or over quota).
    #[error(
        "key directory {path} has no space left ({source}); free space on that filesystem — \
         the active identity stays in use, the failed write left nothing behind"
    )]
    KeyDirFull {
        /// The file or directory being written.
        path: PathBuf,
        /// The OS error (ENOSPC or EDQUOT).
        source: std::io::Error,
    },
    /// Another process holds the key directory's owner lock (or this
    /// process has no open key directory).
    #[error(
        "key directory {path} is owned by another process{}; each node runs one \
         kube-ovn-ipsec agent: stop the other one (a second ipsec container or a leftover \
         process on the host)",
        holder.map(|p| format!(" (PID {p})")).unwrap_or_default()
    )]
    KeyDirLocked {
        /// The directory.
        path: PathBuf,
        /// The owner's PID as it recorded it in the lock file, when known.
        holder: Option<u32>,
    },
    /// Other I/O on the key directory failed.
    #[error("key directory I/O on {path}: {source}")]
    KeyDirIo {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A generation's files are missing or do not match the state record.
    #[error("generation {generation} in the key directory is inconsistent: {reason}")]
    GenerationInconsistent {
        /// The generation.
        generation: u64,
        /// What does not match.
        reason: String,
    },
    /// Key generation or CSR encoding failed.
    #[error("key or CSR generation failed: {0}")]
    KeyGeneration(String),
    /// The issued certificate was rejected.
    #[error("issued certificate rejected: {0}")]
    CertificateRejected(String),
    /// The trust bundle is unusable.
    #[error("trust bundle rejected: {0}")]
    TrustBundleInvalid(String),
    /// No trust bundle has been received yet.
    #[error("no trust bundle yet")]
    TrustBundleMissing,
    /// The CSR was denied by the controller.
    #[error("CSR {name} denied: {reason}")]
    CsrDenied {
        /// CSR name.
        name: String,
        /// The Denied condition's reason.
        reason: String,
    },
    /// The signer reported a failure on the CSR.
    #[error("CSR {name} failed: {reason}")]
    CsrFailed {
        /// CSR name.
        name: String,
        /// The Failed condition's reason.
        reason: String,
    },
    /// The CSR was not issued within the request timeout.
    #[error("CSR {name} not issued within the request timeout")]
    CsrTimeout {
        /// CSR name.
        name: String,
    },
    /// The Kubernetes API call failed.
    #[error("CSR API: {0}")]
    CsrApi(String),
    /// The OVSDB transaction failed or OVSDB is unreachable.
    #[error("OVSDB: {0}")]
    Ovsdb(String),
    /// Every guarded attempt of an activation lost to another writer of
    /// `other_config`; OVSDB keeps the previous generation.
    #[error("OVSDB other_config kept changing concurrently; activation gave up")]
    ActivationConflict,
    /// A job on the blocking pool (key-directory I/O, key generation) did
    /// not complete: it panicked or the runtime is shutting down.
    #[error("blocking job: {0}")]
    BlockingTask(String),
    /// An actor could not be spawned.
    #[error("spawning actor {actor}: {reason}")]
    Spawn {
        /// The child's name.
        actor: String,
        /// Why.
        reason: String,
    },
    /// A message could not be delivered or an RPC timed out.
    #[error("actor messaging: {0}")]
    Messaging(String),
    /// The lease or the guards could not be obtained, armed or published.
    #[error("output protection: {detail}")]
    Protection {
        /// The status reason it maps to.
        reason: kube_ovn_ipsec_api::status::Reason,
        /// What failed (no keys).
        detail: String,
    },
    /// A coordination receipt could not be signed or published.
    #[error("coordination receipt: {0}")]
    Receipt(String),
    /// A runtime process (IKE daemon, monitor) exited, failed its probe or
    /// could not be started.
    #[error("{process}: {reason}")]
    Process {
        /// `ike` or `monitor`.
        process: &'static str,
        /// Why.
        reason: String,
    },
}

impl Error {
    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::KeyDirReadOnly { .. } => "key_dir_read_only",
            Error::KeyDirLocked { .. } => "key_dir_locked",
            Error::KeyDirFull { .. } => "key_dir_full",
            Error::KeyDirIo { .. } => "key_dir_io",
            Error::GenerationInconsistent { .. } => "generation_inconsistent",
            Error::KeyGeneration(_) => "key_generation",
            Error::CertificateRejected(_) => "certificate_rejected",
            Error::TrustBundleInvalid(_) => "trust_bundle_invalid",
            Error::TrustBundleMissing => "trust_bundle_missing",
            Error::CsrDenied { .. } => "csr_denied",
            Error::CsrFailed { .. } => "csr_failed",
            Error::CsrTimeout { .. } => "csr_timeout",
            Error::CsrApi(_) => "csr_api",
            Error::Ovsdb(_) => "ovsdb",
            Error::ActivationConflict => "activation_conflict",
            Error::BlockingTask(_) => "blocking_task",
            Error::Spawn { .. } => "spawn",
            Error::Messaging(_) => "messaging",
            Error::Protection { .. } => "protection",
            Error::Process { .. } => "process",
            Error::Receipt(_) => "receipt",
        }
    }

    /// The status reason this error maps to.
    pub fn status_reason(&self) -> kube_ovn_ipsec_api::status::Reason {
        use kube_ovn_ipsec_api::status::Reason;
        match self {
            Error::KeyDirReadOnly { .. } => Reason::KeyDirReadOnly,
            Error::KeyDirLocked { .. } => Reason::KeyDirLocked,
            Error::KeyDirFull { .. } => Reason::KeyDirFull,
            Error::CertificateRejected(_) | Error::GenerationInconsistent { .. } => {
                Reason::CertificateMismatch
            }
            Error::TrustBundleInvalid(_) => Reason::TrustBundleInvalid,
            Error::TrustBundleMissing => Reason::TrustBundleMissing,
            Error::CsrDenied { .. } => Reason::CsrDenied,
            Error::CsrFailed { .. } | Error::KeyGeneration(_) => Reason::CsrFailed,
            Error::CsrTimeout { .. } => Reason::CsrTimeout,
            Error::CsrApi(_) => Reason::CsrApiError,
            Error::Ovsdb(_) | Error::ActivationConflict => Reason::ActivationFailed,
            Error::KeyDirIo { .. } => Reason::KeyDirReadOnly,
            Error::Spawn { .. } | Error::Messaging(_) | Error::BlockingTask(_) => Reason::Unknown,
            Error::Receipt(_) => Reason::WaitingForCoordination,
            Error::Protection { reason, .. } => *reason,
            Error::Process { process, .. } => match *process {
                "ike" => Reason::IkeDaemonUnhealthy,
                _ => Reason::MonitorUnhealthy,
            },
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
