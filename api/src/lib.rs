//! The kube-ovn-ipsec contract as types: every name, document and encoding
//! that the agent, the cleanup init container, the controller and the lab
//! share (SPEC.md). Pure code: no I/O, no clock reads outside
//! [`SystemClock`], no randomness beyond the
//! CSPRNG inside signing.
//!
//! # Layout
//!
//! * [`clock`] — the [`Clock`](clock::Clock) trait, [`SystemClock`](clock::SystemClock)
//!   (the only reader of the system clock) and [`FixedClock`](clock::FixedClock).
//! * [`names`] — annotation keys, token extra keys, signer, ConfigMap and
//!   Secret names, OVSDB keys, the capability marker, key directory,
//!   defaults (7-day lifetime, reserved marks, guard priority, caps) and exit
//!   codes.
//! * [`ident`] — validated [`Chassis`] and Kubernetes [`Uid`].
//! * [`time`] — [`Timestamp`], whole-second UTC with a single RFC 3339
//!   spelling.
//! * [`digest`] — [`Sha256Digest`], lowercase-hex serde.
//! * [`pki`] — the strict PEM codec, [`Certificate`], the SPKI key-type
//!   parser, [`TrustBundle`] (the one trust-digest definition and the one
//!   chain verifier, intermediates included), the leaf profile constants
//!   (`ipsec tunnel` EKU, backdate), chassis-identity checks, the renewal
//!   point.
//! * [`csr`] — the CSR name derivation, with its byte layout.
//! * [`canonical`] — canonical JSON (RFC 8785 restricted to integers).
//! * [`signed`] — [`SigningKey`] (PKCS#8 RSA / P-256), detached signatures,
//!   the `payload.alg.signature` annotation form, typed-state verification.
//! * [`status`] — the `/status` document, [`Phase`].
//! * [`reason`] — [`Reason`], shared by the status document and the data
//!   path's health.
//! * [`datapath`] — per-peer data-path health ([`PeerState`](datapath::PeerState))
//!   and the MTU arithmetic of the encrypted overlay.
//! * [`backoff`] — the 1 s … 30 s restart/retry schedule, reset after 60 s
//!   healthy (actors, processes, renewals, OVSDB reconnects).
//! * [`conflict`] — the one read-modify-replace loop retried on a write
//!   conflict (the caller says what a conflict is).
//! * [`strongswan`] — `ipsec statusall` and `listcerts` output, parsed (the
//!   agent's probe and the testbed's waits read it the same way).
//! * [`rekeying`] — lifetimes and rekey timing of every IKE_SA and
//!   CHILD_SA (rekeyed, never reauthenticated), checked once and handed to
//!   the patched monitor.
//! * [`coordination`] — the coordination record, phase state machine,
//!   [`Receipt`] and [`ReleaseReceipt`].
//! * [`logsafe`] — what may reach a log line: the event targets never
//!   written (they echo response bodies) and the redaction of PEM and
//!   tokens every emitted line passes through (both binaries' loggers).
//! * [`error`] — the crate's one [`Error`] with `metric_label()`.
//! * `test_util` (feature `test-util`) — the one test CA of the workspace
//!   (roots, intermediates, leaves, signed CSRs) and shared leaf fixtures.
//!
//! # Flow of a receipt
//!
//! ```text
//! agent:      Receipt { .. } --signed::sign(key)--> "b64url(json).rsa-pkcs1v15-sha256.b64url(sig)"
//!                                                        | Node annotation kube-ovn.io/ipsec-receipt
//! controller: signed::decode::<Receipt>(s)?              v
//!               .verify(&node_cert)?        -- signature, algorithm bound to the cert key
//!             trust.verify_leaf(&node_cert, now)?        -- chains to ovn-ipsec-trust
//!             node_cert.check_chassis_identity(&chassis)?
//!             receipt.check_against(&record, now)?       -- epoch, phase, hashes, freshness
//!             (+ live Pod / CSR binding checks against the API)
//! ```

pub mod backoff;
pub mod canonical;
pub mod clock;
pub mod conflict;
pub mod coordination;
pub mod csr;
pub mod datapath;
pub mod digest;
pub mod error;
pub mod ident;
pub mod lease;
pub mod logsafe;
pub mod names;
pub mod pki;
pub mod reason;
pub mod rekeying;
pub mod signed;
pub mod status;
pub mod strongswan;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
pub mod time;

pub use clock::{Clock, FixedClock, SystemClock};
pub use coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus, ReleaseReceipt,
    ReleaseStatus,
};
pub use digest::Sha256Digest;
pub use error::{Error, Result};
pub use ident::{Chassis, Uid};
pub use pki::{Certificate, KeyAlgorithm, TrustBundle};
pub use signed::{SignatureAlgorithm, SigningKey, Unverified};
pub use status::{Phase, Reason, Status};
pub use time::Timestamp;
