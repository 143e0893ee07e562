//! The crate's one error type.
//!
//! Every fallible function in this crate returns [`Error`]. Messages never
//! contain key material, PEM bodies or signature bytes: they name the check
//! that failed and, where it helps, a line number or a field name, so they can
//! go into logs, CSR denial reasons and `/status` unchanged.

use std::fmt;

/// Shorthand for `Result<T, kube_ovn_ipsec_api::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building, encoding, decoding, signing or
/// verifying a contract document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The input is not a well-formed PEM certificate bundle: text outside a
    /// block, an unexpected block label, bad base64, an unterminated block or
    /// no block at all. `reason` names the problem and the line.
    #[error("invalid PEM: {reason}")]
    InvalidPem {
        /// What was wrong and where (a line number, never the content).
        reason: String,
    },

    /// A DER blob is not a parseable X.509 certificate, or has trailing bytes.
    #[error("invalid certificate: {reason}")]
    InvalidCertificate {
        /// What the parser rejected.
        reason: String,
    },

    /// A trust bundle is unusable as a set of trust anchors (empty, or a
    /// member is not a CA certificate).
    #[error("invalid trust bundle: {reason}")]
    InvalidTrustBundle {
        /// Which member failed and why.
        reason: String,
    },

    /// A public or private key uses an algorithm or size this project does not
    /// accept (only RSA >= 2048 bits and ECDSA P-256 leaves; RSA and ECDSA
    /// P-256/P-384 CA signatures).
    #[error("unsupported key: {reason}")]
    UnsupportedKey {
        /// The algorithm or size that was found.
        reason: String,
    },

    /// A PKCS#8 private key could not be loaded. Carries no key bytes.
    #[error("invalid private key: {reason}")]
    InvalidPrivateKey {
        /// Why the key was rejected (as reported by aws-lc-rs).
        reason: String,
    },

    /// The crypto library refused to produce a signature.
    #[error("signing failed")]
    SigningFailed,

    /// A signature did not verify: the document, the signature or the
    /// certificate is not the one that produced it.
    #[error("signature verification failed")]
    BadSignature,

    /// The algorithm a signed document declares is not the one the verifying
    /// certificate's key uses (prevents algorithm confusion).
    #[error("signature algorithm {declared} does not match certificate key {certificate}")]
    AlgorithmMismatch {
        /// The algorithm named in the document.
        declared: String,
        /// The key algorithm of the certificate.
        certificate: String,
    },

    /// An encoded document is larger than its cap. Checked before any
    /// decoding so oversized annotations cost nothing.
    #[error("document is {len} bytes, larger than the {max}-byte cap")]
    TooLarge {
        /// Length of the rejected input.
        len: usize,
        /// The cap that applies.
        max: usize,
    },

    /// A signed-document envelope is syntactically wrong (field count, base64,
    /// unknown algorithm name).
    #[error("malformed signed document: {reason}")]
    MalformedEnvelope {
        /// What was wrong.
        reason: String,
    },

    /// A payload is valid JSON but not in canonical form (key order,
    /// whitespace, escapes, duplicate keys), so its signature is meaningless.
    #[error("payload is not canonical JSON")]
    NonCanonical,

    /// A value cannot be expressed in the canonical encoding (a float, or an
    /// integer outside +/-(2^53 - 1)).
    #[error("value not representable in canonical JSON: {reason}")]
    NotCanonicalizable {
        /// The offending value's kind.
        reason: String,
    },

    /// JSON that does not match the expected schema (missing or unknown
    /// field, wrong type).
    #[error("invalid document: {reason}")]
    InvalidDocument {
        /// serde's description of the mismatch.
        reason: String,
    },

    /// A document carries a `version` this build does not understand.
    #[error("unsupported document version {found}, expected {expected}")]
    UnsupportedVersion {
        /// The version found.
        found: u64,
        /// The version this build reads and writes.
        expected: u64,
    },

    /// A chassis name, Kubernetes UID, digest or timestamp string is not in
    /// its required form.
    #[error("invalid {kind}: {reason}")]
    InvalidValue {
        /// Which kind of value (`chassis`, `uid`, `digest`, `timestamp`, ...).
        kind: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// A coordination phase change that the state machine does not allow.
    #[error("coordination transition {from} -> {to} is not allowed")]
    InvalidTransition {
        /// The current phase.
        from: String,
        /// The requested phase.
        to: String,
    },

    /// A receipt does not answer the current coordination record: wrong
    /// generation, epoch, phase, hash, node or challenge.
    #[error("receipt does not match the coordination record: {field}")]
    ReceiptMismatch {
        /// The first field that differed.
        field: &'static str,
    },

    /// A receipt was observed too long ago or in the future.
    #[error("receipt is stale or from the future: {reason}")]
    ReceiptNotFresh {
        /// How far off it is.
        reason: String,
    },

    /// A certificate is outside its validity window at the time of the check.
    #[error("certificate is not valid at {at}: valid {not_before} .. {not_after}")]
    CertificateNotValidNow {
        /// The time of the check (RFC 3339).
        at: String,
        /// The certificate's notBefore (RFC 3339).
        not_before: String,
        /// The certificate's notAfter (RFC 3339).
        not_after: String,
    },

    /// No path leads from the certificate (through the intermediates given
    /// with it) to a CA of the trust bundle: a signature does not verify,
    /// an issuer is not a CA allowed to sign certificates, is expired or
    /// exceeds its path length, or an intermediate is missing.
    #[error("certificate does not chain to the trust bundle")]
    Untrusted,

    /// A certificate's subject or SANs do not name the expected chassis
    /// exactly (`O=kube-ovn, CN=<chassis>`, SANs exactly `DNS:<chassis>`).
    #[error("certificate identity mismatch: {reason}")]
    IdentityMismatch {
        /// Which part differed.
        reason: String,
    },
}

impl Error {
    /// A short, stable, snake_case label for this variant, for metrics
    /// (`..._errors_total{reason="bad_signature"}`). Labels never carry the
    /// variant's data, so cardinality stays bounded.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidPem { .. } => "invalid_pem",
            Error::InvalidCertificate { .. } => "invalid_certificate",
            Error::InvalidTrustBundle { .. } => "invalid_trust_bundle",
            Error::UnsupportedKey { .. } => "unsupported_key",
            Error::InvalidPrivateKey { .. } => "invalid_private_key",
            Error::SigningFailed => "signing_failed",
            Error::BadSignature => "bad_signature",
            Error::AlgorithmMismatch { .. } => "algorithm_mismatch",
            Error::TooLarge { .. } => "too_large",
            Error::MalformedEnvelope { .. } => "malformed_envelope",
            Error::NonCanonical => "non_canonical",
            Error::NotCanonicalizable { .. } => "not_canonicalizable",
            Error::InvalidDocument { .. } => "invalid_document",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::InvalidValue { .. } => "invalid_value",
            Error::InvalidTransition { .. } => "invalid_transition",
            Error::ReceiptMismatch { .. } => "receipt_mismatch",
            Error::ReceiptNotFresh { .. } => "receipt_not_fresh",
            Error::CertificateNotValidNow { .. } => "certificate_not_valid_now",
            Error::Untrusted => "untrusted",
            Error::IdentityMismatch { .. } => "identity_mismatch",
        }
    }

    pub(crate) fn invalid_value(kind: &'static str, reason: impl fmt::Display) -> Self {
        Error::InvalidValue {
            kind,
            reason: reason.to_string(),
        }
    }

    pub(crate) fn document(err: serde_json::Error) -> Self {
        // serde_json messages name the field and type, plus a line/column;
        // none of our schemas has a field that may hold secrets.
        Error::InvalidDocument {
            reason: err.to_string(),
        }
    }
}
