//! The crate's one error type.
//!
//! Operational failures only: a CSR that fails validation is not an error
//! but a [`crate::validate::Denial`], and a cert-manager result that fails
//! its checks is a [`crate::certmanager::Rejection`].

use crate::certmanager::Rejection;

/// What can go wrong while the controller runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A Kubernetes API request failed.
    #[error("kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// Generating or parsing a key or certificate with rcgen failed.
    #[error("certificate operation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The CA Secret exists but does not hold a usable CA.
    #[error("CA secret is invalid: {0}")]
    CaSecretInvalid(String),
    /// The trust bundle ConfigMap is missing, empty or not PEM certificates.
    #[error("trust bundle is invalid: {0}")]
    TrustBundleInvalid(String),
    /// A CA rotation step was refused (the reason says which precondition failed).
    #[error("CA rotation refused: {0}")]
    RotationRefused(String),
    /// cert-manager returned something that failed validation.
    #[error("cert-manager result rejected: {0}")]
    CertManagerRejected(Rejection),
    /// cert-manager has not issued yet, or reported a failure.
    #[error("cert-manager request not ready: {0}")]
    CertManagerPending(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Encoding the metrics failed.
    #[error("metrics encoding failed")]
    Metrics(#[from] std::fmt::Error),
    /// An object from the API server lacks a field the controller needs.
    #[error("object is missing {0}")]
    MissingField(&'static str),
}

impl Error {
    /// A short, stable label for metrics (`error` label values).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Certificate(_) => "certificate",
            Error::CaSecretInvalid(_) => "ca_secret_invalid",
            Error::TrustBundleInvalid(_) => "trust_bundle_invalid",
            Error::RotationRefused(_) => "rotation_refused",
            Error::CertManagerRejected(_) => "cert_manager_rejected",
            Error::CertManagerPending(_) => "cert_manager_pending",
            Error::Config(_) => "config",
            Error::Metrics(_) => "metrics",
            Error::MissingField(_) => "missing_field",
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
