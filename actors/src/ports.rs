//! The side effects the actors need, as small traits the `runtime` crate
//! implements: the Kubernetes CSR API (kube-rs) and the OVSDB identity keys
//! (`ovsdb` crate); the key directory ([`KeyStore`], blocking, implemented
//! here by `keydir::KeyDir`, in the types of `keydir_format`); and (submodule `tunnel`, re-exported here) those of the
//! tunnel actors: the lease and XFRM guards, the IKE daemon and the
//! monitor. Fakes for tests live in `testing` (feature `test-util`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::keydir_format::{GenerationFile, IdentityPaths, KeyDirState, MovedAside};

/// A `certificates.k8s.io/v1` CertificateSigningRequest to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSubmission {
    /// `metadata.name` (derived, see `kube_ovn_ipsec_api::csr::csr_name`).
    pub name: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.request`: the PEM CSR (public data only).
    pub request_pem: Vec<u8>,
    /// `spec.signerName`.
    pub signer_name: String,
    /// `spec.usages`.
    pub usages: Vec<String>,
    /// `spec.expirationSeconds`.
    pub expiration_seconds: u32,
}

/// A created (or already existing) CSR object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrRef {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

/// What a CSR came to.
#[derive(Clone, PartialEq, Eq)]
pub enum CsrOutcome {
    /// Not decided within the wait.
    Pending,
    /// `status.certificate` is set (PEM, leaf first).
    Issued {
        /// The PEM chain.
        certificate_pem: Vec<u8>,
    },
    /// Condition `Denied`.
    Denied {
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// Condition `Failed`.
    Failed {
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The object is gone (deleted or garbage-collected).
    NotFound,
}

impl std::fmt::Debug for CsrOutcome {
    // The certificate is public, but PEM never reaches logs (SPEC §5): a
    // stray `?outcome` prints its size only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CsrOutcome::Pending => f.write_str("Pending"),
            CsrOutcome::Issued { certificate_pem } => f
                .debug_struct("Issued")
                .field("certificate_pem_bytes", &certificate_pem.len())
                .finish(),
            CsrOutcome::Denied { reason, message } => f
                .debug_struct("Denied")
                .field("reason", reason)
                .field("message", message)
                .finish(),
            CsrOutcome::Failed { reason, message } => f
                .debug_struct("Failed")
                .field("reason", reason)
                .field("message", message)
                .finish(),
            CsrOutcome::NotFound => f.write_str("NotFound"),
        }
    }
}

/// The Kubernetes CSR API, as the identity actor uses it.
///
/// The runtime implements it with kube-rs: `submit` is `Api::create`, and on
/// `409 AlreadyExists` a `get` of the same name (the name is derived from the
/// request bytes, so an existing object with it is this agent's own);
/// `wait` watches the object by name (`kube::runtime::wait::await_condition`
/// under a timeout) until `status.certificate` or a `Denied`/`Failed`
/// condition appears.
#[async_trait]
pub trait CsrApi: Send + Sync + Debug + 'static {
    /// Creates the CSR, or returns the existing one with this name.
    async fn submit(&self, csr: &CsrSubmission) -> Result<CsrRef>;
    /// Waits up to `timeout` for an outcome; [`CsrOutcome::Pending`] when
    /// none arrived in time.
    async fn wait(&self, name: &str, timeout: Duration) -> Result<CsrOutcome>;
}

/// The identity keys of `Open_vSwitch . other_config` as read from OVSDB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OvsdbIdentityKeys {
    /// `other_config:private_key`.
    pub private_key: Option<String>,
    /// `other_config:certificate`.
    pub certificate: Option<String>,
    /// `other_config:ca_cert`.
    pub ca_cert: Option<String>,
}

impl OvsdbIdentityKeys {
    /// The keys pointing at `paths`.
    pub fn from_paths(paths: &IdentityPaths) -> Self {
        let s = |p: &std::path::Path| Some(p.display().to_string());
        OvsdbIdentityKeys {
            private_key: s(&paths.private_key),
            certificate: s(&paths.certificate),
            ca_cert: s(&paths.ca_cert),
        }
    }

    /// The paths set, in key order.
    pub fn paths(&self) -> Vec<std::path::PathBuf> {
        [&self.private_key, &self.certificate, &self.ca_cert]
            .into_iter()
            .flatten()
            .map(std::path::PathBuf::from)
            .collect()
    }
}

/// OVSDB's identity keys. The OVSDB writer is their only writer; the
/// identity and monitor actors only read them.
///
/// The runtime implements it with the `ovsdb` crate's `MapWriter` on
/// `other_config`: one transaction with a `wait` on the map as the adapter
/// last read or wrote it, then a mutate that sets all three keys, other keys
/// untouched. A lost guard (another writer changed the map) is re-read and
/// retried inside that one call, a bounded number of times; callers do not
/// retry around it.
#[async_trait]
pub trait OvsdbIdentity: Send + Sync + Debug + 'static {
    /// Reads the three keys.
    async fn read(&self) -> Result<OvsdbIdentityKeys>;
    /// Points the three keys at `new` in one guarded transaction. Returns
    /// once OVSDB is confirmed to point at `new` (committed now, or already
    /// so); [`crate::Error::ActivationConflict`] when concurrent writers
    /// kept failing the guard.
    async fn activate(&self, new: &OvsdbIdentityKeys) -> Result<()>;
}

/// Runs blocking work (file I/O and fsyncs, key generation, netlink) on
/// tokio's blocking pool, so no actor handler blocks the executor: the one
/// way every port that blocks is called. A job that panics, or is dropped
/// because the runtime shuts down, is [`crate::Error::BlockingTask`].
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| crate::Error::BlockingTask(e.to_string()))?
}

/// The key directory, as the identity actor uses it once it is open and
/// locked (`KeyDir::open` of the `keydir` module, whose value holds the
/// lock).
///
/// Every method blocks (file I/O, fsync): the identity actor calls them only
/// through [`blocking`], one at a time, never on the async
/// executor. `keydir::KeyDir` implements it with real files; tests
/// use it in a temporary directory.
pub trait KeyStore: Send + Sync + Debug + 'static {
    /// The three OVSDB paths of a generation (no I/O).
    fn identity_paths(&self, generation: u64) -> IdentityPaths;
    /// Loads the state file (see `KeyDir::load`: unusable files are moved
    /// aside, orphan generation folders adopted as retired at `now_unix`).
    fn load(&self, now_unix: i64) -> Result<(KeyDirState, Option<MovedAside>)>;
    /// Reads one file of a generation.
    fn read_file(&self, generation: u64, name: &str) -> Result<Vec<u8>>;
    /// Creates the generation's folder if needed, writes `files` into it in
    /// order (each atomically), then saves `state`: the files a state record
    /// names are durable before the record is.
    fn write_generation(
        &self,
        generation: u64,
        files: &[GenerationFile<'_>],
        state: &KeyDirState,
    ) -> Result<()>;
    /// Saves the state file (atomically).
    fn save(&self, state: &KeyDirState) -> Result<()>;
    /// Removes retired generations past `grace_secs` that nothing (state or
    /// the `referenced` OVSDB paths) points at; updates `state.retired`
    /// (also on error) and returns the removed generations. The caller saves.
    fn collect_garbage(
        &self,
        state: &mut KeyDirState,
        now_unix: i64,
        grace_secs: i64,
        referenced: &[std::path::PathBuf],
    ) -> Result<Vec<u64>>;
}

mod datapath;
pub use self::datapath::{DatapathPort, DatapathSample, PeerSample, SaSample};
mod tunnel;
pub use self::tunnel::{
    Acknowledgement, GuardChange, GuardReadback, IkePort, LeaseSummary, MonitorPort,
    ProtectionPort, RunningMonitor, RunningProcess, SaSummary, TrustInstalled, protection_reason,
};
