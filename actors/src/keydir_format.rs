//! The key directory's format (SPEC §2): its layout, the names of its
//! files and the records of its state file. Plain data and pure functions:
//! the key store trait (`ports`) speaks in these types and the key
//! directory itself (`keydir`) reads and writes them, so they live below
//! both.
//!
//! ```text
//! <dir>/                      0700
//!   .lock                     owner lock (flock, held for the process lifetime)
//!   state.json                {version, lastGeneration, active, pending, retired}
//!   gen-000001/               0700
//!     private.key             0600, PKCS#8 PEM
//!     request.csr             the CSR exactly as submitted (its bytes name it)
//!     cert.pem                the verified leaf (after issuance)
//!     ca.pem                  the trust bundle it was verified against
//!   state.json.corrupt-<unix> a state file that could not be read, moved aside
//! ```
//!
//! Active and pending live in *one* state file so that a single rename
//! switches both: a crash can never leave "pending promoted" without
//! "active replaced". The state holds digests and names only; key material
//! lives in the generation folders.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The state file's format version this build reads and writes.
pub const STATE_VERSION: u32 = 1;
/// Name of the state file.
pub const STATE_FILE: &str = "state.json";
/// Name of the owner lock file.
pub const LOCK_FILE: &str = ".lock";
/// File names inside a generation folder.
pub mod files {
    /// The private key (PKCS#8 PEM, 0600).
    pub const PRIVATE_KEY: &str = "private.key";
    /// The CSR as submitted (PEM).
    pub const REQUEST: &str = "request.csr";
    /// The issued leaf certificate (PEM).
    pub const CERTIFICATE: &str = "cert.pem";
    /// The trust bundle (PEM).
    pub const CA: &str = "ca.pem";
}

/// Where a pending request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PendingStage {
    /// Key and request persisted; the CSR may or may not exist yet.
    Prepared,
    /// The CSR object exists (its UID is recorded).
    Submitted,
    /// The certificate was issued, verified and stored; awaiting activation.
    Issued,
}

/// The binding of a pending key to its CSR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRecord {
    /// The generation this request will become.
    pub generation: u64,
    /// SHA-256 (hex) of the private key's PKCS#8 DER.
    pub key_digest: String,
    /// The derived CSR name.
    pub csr_name: String,
    /// The CSR object's UID once created.
    pub csr_uid: Option<String>,
    /// The trust digest (hex) the request was made under.
    pub trust_digest: String,
    /// Progress of the request.
    pub stage: PendingStage,
    /// Whether this generation reuses the active key and certificate with a
    /// new trust bundle only (no CSR).
    #[serde(default)]
    pub trust_refresh: bool,
    /// The UID of the Pod whose token requests the CSR (absent in a state
    /// file written before it was recorded, and for a trust refresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_pod_uid: Option<String>,
}

/// The generation OVSDB was last confirmed to point at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveRecord {
    /// The generation.
    pub generation: u64,
    /// SHA-256 (hex) of its certificate's DER.
    pub certificate_digest: String,
    /// The CSR its certificate was issued for (absent in a state file
    /// written before it was recorded): a coordination receipt names it,
    /// so the controller can tie the signing key to the requesting Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<CsrBinding>,
}

/// The CSR object a generation's certificate came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsrBinding {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The UID of the Pod whose token requested it: the controller ties a
    /// coordination receipt to the live Pod through it, so an identity
    /// another Pod requested is renewed (absent: recorded before this was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// A generation that is no longer active, kept for a grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetiredRecord {
    /// The generation.
    pub generation: u64,
    /// When it was retired (Unix seconds).
    pub retired_at: i64,
}

/// The content of `state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyDirState {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Highest generation number ever allocated.
    pub last_generation: u64,
    /// The active generation.
    pub active: Option<ActiveRecord>,
    /// The pending generation.
    pub pending: Option<PendingRecord>,
    /// Retired generations awaiting garbage collection.
    #[serde(default)]
    pub retired: Vec<RetiredRecord>,
}

/// The three files OVSDB's `other_config` points at for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdentityPaths {
    /// `other_config:private_key`.
    pub private_key: PathBuf,
    /// `other_config:certificate`.
    pub certificate: PathBuf,
    /// `other_config:ca_cert`.
    pub ca_cert: PathBuf,
}

/// A state file that could not be used and was moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    /// Where it now is.
    pub moved_to: PathBuf,
    /// Why (parse error or unknown version).
    pub reason: String,
}

/// One file of a generation folder, as the key store's `write_generation`
/// takes it.
#[derive(Debug, Clone, Copy)]
pub struct GenerationFile<'a> {
    /// The file name (one of [`files`]).
    pub name: &'static str,
    /// The content.
    pub data: &'a [u8],
    /// Whether it is secret (mode 0600; others get 0644).
    pub secret: bool,
}

/// The folder name of a generation.
pub fn generation_dir_name(generation: u64) -> String {
    format!("gen-{generation:06}")
}

/// The generation a folder name is of (`None`: not a generation folder).
pub(crate) fn parse_generation_dir(name: &str) -> Option<u64> {
    name.strip_prefix("gen-")?.parse().ok()
}

/// The three OVSDB paths of `generation` in the key directory `dir` (the
/// one layout: the open key directory and readers that hold none, such as
/// the receipt signer, use it).
pub fn identity_paths_in(dir: &Path, generation: u64) -> IdentityPaths {
    let g = dir.join(generation_dir_name(generation));
    IdentityPaths {
        private_key: g.join(files::PRIVATE_KEY),
        certificate: g.join(files::CERTIFICATE),
        ca_cert: g.join(files::CA),
    }
}
