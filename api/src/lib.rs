//! The kube-ovn-ipsec contract as types: every name, document and encoding
//! that the agent, the cleanup init container, the controller and the lab
//! share (SPEC.md). Pure code: no I/O, no clock, no randomness beyond the
//! CSPRNG inside signing.
//!
//! # Layout
//!
//! * [`names`] — annotation keys, token extra keys, signer, ConfigMap and
//!   Secret names, OVSDB keys, the capability marker, key directory,
//!   defaults (7-day lifetime, reserved marks, guard priority, caps) and exit
//!   codes.
//! * [`ident`] — validated [`Chassis`] and Kubernetes [`Uid`].
//! * [`time`] — [`Timestamp`], whole-second UTC with a single RFC 3339
//!   spelling.
//! * [`digest`] — [`Sha256Digest`], lowercase-hex serde.
//! * [`pki`] — strict PEM reader, [`Certificate`], [`TrustBundle`] (and the
//!   one trust-digest definition), chain and chassis-identity checks, the
//!   renewal point.
//! * [`csr`] — the CSR name derivation, with its byte layout.
//! * [`canonical`] — canonical JSON (RFC 8785 restricted to integers).
//! * [`signed`] — [`SigningKey`] (PKCS#8 RSA / P-256), detached signatures,
//!   the `payload.alg.signature` annotation form, typed-state verification.
//! * [`status`] — the `/status` document, [`Phase`], [`Reason`].
//! * [`coordination`] — the coordination record, phase state machine,
//!   [`Receipt`] and [`ReleaseReceipt`].
//! * [`error`] — the crate's one [`Error`] with `metric_label()`.
//! * `test_util` (feature `test-util`) — shared CA/leaf fixtures.
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

pub mod canonical;
pub mod coordination;
pub mod csr;
pub mod digest;
pub mod error;
pub mod ident;
pub mod names;
pub mod pki;
pub mod signed;
pub mod status;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
pub mod time;

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
