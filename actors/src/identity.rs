//! The identity actor: owns the key directory and the node's IPsec identity
//! (SPEC §2).
//!
//! Cold start: generate a key, build the CSR, persist key and binding
//! (fsync'd, 0600) *before* creating the CSR, create it, wait until it is
//! issued or denied, verify the certificate (pending key, subject/SAN, chain
//! to the trust bundle, sane lifetime), store it and ask the OVSDB writer to
//! activate the generation. Only the writer's confirmed `Activated` promotes
//! the generation to active in the key directory. A restart resumes the
//! pending CSR with the same key. Renewal repeats the flow for the next
//! generation while the current one stays active; failures retry with
//! backoff and never touch the active identity. A trust bundle under which
//! the leaf no longer verifies triggers renewal at once; one under which it
//! still verifies is activated as a trust-only generation (same key and
//! certificate, new `ca.pem`).
//!
//! Nothing here logs or publishes key material or PEM: logs carry
//! generations, CSR names, digests and error labels.
//!
//! # Layout
//!
//! - `machine` — the pure state machine: the `Phase` of
//!   the next generation, the inputs (messages, job results) and the
//!   effects a transition asks for. No I/O, no actor, no clock: the caller
//!   hands in the time. Its unit tests drive it input by input.
//! - `recovery` — reading the key directory at start (active and pending
//!   generation) and deciding what is usable and what is abandoned.
//! - `mint` — making a generation: key, CSR, the binding persisted before
//!   the CSR exists; a trust-only generation; storing an issued
//!   certificate; the CSR object to submit.
//! - `actor` — the thin [`IdentityActor`] shell: turns messages into
//!   inputs, runs the effects through the ports, and every key-directory
//!   job (key generation included) on `tokio::task::spawn_blocking`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::names::defaults;
use ractor::{ActorRef, RpcReplyPort};

use crate::bus::{ActivationEvent, Bus, RenewalEvent};
use crate::error::{Error, Result};
use crate::keydir::OwnerLock;
use crate::metrics::Metrics;
use crate::pki::KeyType;
use crate::ports::{CsrApi, OvsdbIdentity};
use crate::status::StatusBoard;
use kube_ovn_ipsec_api::backoff::BackoffPolicy;
use kube_ovn_ipsec_api::clock::Clock;

mod actor;
mod generation;
mod machine;
mod mint;
mod recovery;

pub use actor::{IdentityActor, IdentityState};

/// Who this node is and how it asks for an identity.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// The Node's name (annotation `kube-ovn.io/ipsec-node`).
    pub node_name: String,
    /// The Node's UID.
    pub node_uid: Uid,
    /// This Pod's UID (part of the CSR name).
    pub pod_uid: Uid,
    /// The chassis (OVS `system-id`).
    pub chassis: Chassis,
    /// The key directory (`OVN_IPSEC_KEY_DIR`).
    pub key_dir: PathBuf,
    /// Key type (RSA-2048 by default).
    pub key_type: KeyType,
    /// `expirationSeconds` of the CSR.
    pub expiration_seconds: u32,
    /// How long one wait for the CSR may take before `CsrTimeout`.
    pub request_timeout: Duration,
    /// Retry schedule for failed attempts.
    pub retry: BackoffPolicy,
    /// How long a retired generation is kept before collection.
    pub gc_grace: Duration,
    /// The window over which nodes renew onto a newly announced signing CA
    /// (`Certificate::rotation_time`), so a CA rotation does not send every
    /// node's CSR at once.
    pub rotation_spread: Duration,
    /// The process's owner lock on `key_dir`, taken before anything else
    /// touched the node (the agent's start-up does). `None` makes the actor
    /// take the lock itself when it opens the directory (tests, tools).
    pub owner: Option<Arc<OwnerLock>>,
}

impl IdentityConfig {
    /// Defaults for everything but the node's names and the key directory.
    pub fn new(
        node_name: String,
        node_uid: Uid,
        pod_uid: Uid,
        chassis: Chassis,
        key_dir: PathBuf,
    ) -> Self {
        IdentityConfig {
            node_name,
            node_uid,
            pod_uid,
            chassis,
            key_dir,
            key_type: KeyType::Rsa2048,
            expiration_seconds: defaults::CERTIFICATE_LIFETIME_SECS,
            request_timeout: Duration::from_secs(300),
            retry: BackoffPolicy::default(),
            gc_grace: Duration::from_secs(3600),
            rotation_spread: Duration::from_secs(defaults::ROTATION_SPREAD_SECS),
            owner: None,
        }
    }
}

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct IdentityArgs {
    /// Configuration.
    pub config: IdentityConfig,
    /// The Kubernetes CSR API.
    pub csr_api: Arc<dyn CsrApi>,
    /// OVSDB, read only here: garbage collection never removes a generation
    /// OVSDB still points at.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Wall clock for certificate validity.
    pub clock: Arc<dyn Clock>,
    /// Status.
    pub board: StatusBoard,
    /// Metrics.
    pub metrics: Arc<dyn Metrics>,
    /// Event ports.
    pub bus: Bus,
    /// ConfigMap `ovn-ipsec-trust` as the runtime's watcher last saw it.
    /// A watch rather than messages alone, so every incarnation of this
    /// actor starts from the current bundle.
    pub trust: tokio::sync::watch::Receiver<Option<TrustSource>>,
}

/// What the trust ConfigMap says: the bundle, and which of its CAs the
/// controller signs with now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustSource {
    /// `ca.crt` (PEM).
    pub bundle_pem: Vec<u8>,
    /// The signing CA's fingerprint (hex SHA-256 of its DER), from the
    /// `kube-ovn.io/ipsec-signing-ca` annotation.
    pub signing_ca: Option<String>,
}

impl From<Vec<u8>> for TrustSource {
    /// A bundle without a signing-CA mark.
    fn from(bundle_pem: Vec<u8>) -> Self {
        TrustSource {
            bundle_pem,
            signing_ca: None,
        }
    }
}

/// What the identity actor is doing, for tests and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySnapshot {
    /// Whether the key directory is open and locked.
    pub key_dir_open: bool,
    /// The active generation, and whether OVSDB confirmed it.
    pub active: Option<(u64, bool)>,
    /// The pending generation and its CSR name.
    pub pending: Option<(u64, String)>,
    /// Key digest of the pending key.
    pub pending_key_digest: Option<String>,
    /// The trust bundle held.
    pub trust_digest: Option<Sha256Digest>,
}

/// Messages of the identity actor.
#[derive(Debug)]
pub enum IdentityMsg {
    /// The trust ConfigMap's content; sent by the forwarder of
    /// [`IdentityArgs::trust`] on every change, or directly.
    TrustBundle(TrustSource),
    /// From the renewal timer.
    Renewal(RenewalEvent),
    /// From the OVSDB writer.
    Activation(ActivationEvent),
    /// Internal: what the actor's own CSR task and timers report back
    /// (the CSR object exists, the CSR wait ended, a backoff delay
    /// elapsed, time to collect garbage), fed to the machine as it is.
    Internal(Internal),
    /// Diagnostics.
    Snapshot(RpcReplyPort<IdentitySnapshot>),
}

/// A message the identity actor sends itself: opaque outside this module.
#[derive(Debug)]
pub struct Internal(pub(crate) machine::Input);

/// Asks the identity actor for its snapshot (1 s timeout).
pub async fn snapshot(identity: &ActorRef<IdentityMsg>) -> Result<IdentitySnapshot> {
    ractor::call_t!(identity, IdentityMsg::Snapshot, 1_000)
        .map_err(|e| Error::Messaging(e.to_string()))
}

#[cfg(test)]
mod tests;
