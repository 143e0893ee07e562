//! The crate's one error type, and [`Rejection`], the reasons a
//! cert-manager result is refused.
//!
//! Operational failures only: a CSR that fails validation is not an error
//! but a [`crate::denial::Denial`]. A cert-manager result that fails its
//! checks is a [`Rejection`], carried by [`Error::CertManagerRejected`]; it
//! lives here so this module is a leaf that imports no other module of the
//! crate.

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
    /// A Secret's body does not decode ([`crate::secret::decode`]): which
    /// Secret, which field and what is wrong with it, never its value.
    #[error("Secret {secret} does not decode: {field} {problem}")]
    SecretUndecodable {
        /// `namespace/name`.
        secret: String,
        /// The field, e.g. `data[tls.key]`.
        field: String,
        /// What is wrong with it, e.g. `is not valid base64`.
        problem: String,
    },
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
    /// A coordination record could not be built or encoded.
    #[error("coordination record: {0}")]
    Coordination(kube_ovn_ipsec_api::Error),
}

impl Error {
    /// Whether this is the API server's `409 Conflict`: a write lost to a
    /// concurrent writer (a stale resourceVersion, or a create of a name
    /// that now exists), which a read-modify-replace answers by reading
    /// again.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if is_conflict(e))
    }

    /// A short, stable label for metrics (`error` label values).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Certificate(_) => "certificate",
            Error::CaSecretInvalid(_) => "ca_secret_invalid",
            Error::SecretUndecodable { .. } => "secret_undecodable",
            Error::TrustBundleInvalid(_) => "trust_bundle_invalid",
            Error::RotationRefused(_) => "rotation_refused",
            Error::CertManagerRejected(_) => "cert_manager_rejected",
            Error::CertManagerPending(_) => "cert_manager_pending",
            Error::Config(_) => "config",
            Error::Metrics(_) => "metrics",
            Error::MissingField(_) => "missing_field",
            Error::Coordination(_) => "coordination",
        }
    }
}

/// Whether a Kubernetes API error is `409 Conflict` (see
/// [`Error::is_conflict`]).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Why a cert-manager result is not copied into the CSR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The CertificateRequest is not in the controller's namespace.
    #[error("namespace check failed: CertificateRequest is in {0:?}")]
    Namespace(String),
    /// The CertificateRequest is not the one the controller created.
    #[error(
        "ownership check failed: CertificateRequest was not created by this controller for this CSR"
    )]
    NotOurs,
    /// The CertificateRequest names another issuer.
    #[error("issuer check failed: {0} is not the configured ClusterIssuer")]
    Issuer(String),
    /// The CertificateRequest's requester is not the controller's ServiceAccount.
    #[error("requester check failed: {0:?} is not the controller's ServiceAccount")]
    Requester(String),
    /// The usages differ from `[ipsec tunnel]`.
    #[error("usages check failed: {0:?}")]
    Usages(Vec<String>),
    /// The certificate is missing or does not parse.
    #[error("certificate check failed: {0}")]
    Malformed(&'static str),
    /// The certificate's key is not the CSR's key.
    #[error("key check failed: the certificate carries another public key")]
    KeyMismatch,
    /// The certificate's subject or SANs do not name the chassis exactly.
    #[error("name check failed: {0}")]
    Names(String),
    /// The certificate is a CA.
    #[error("CA check failed: the certificate has CA:true")]
    IsCa,
    /// The certificate's lifetime exceeds what was requested, or it is not valid now.
    #[error("lifetime check failed: {0}")]
    Lifetime(String),
    /// The chain does not verify to the trust bundle.
    #[error("chain check failed: the certificate does not verify to the trust bundle")]
    Chain,
}

impl Rejection {
    /// CamelCase reason for the CSR `Failed` condition and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::Namespace(_) => "CertManagerNamespace",
            Rejection::NotOurs => "CertManagerRequestNotOurs",
            Rejection::Issuer(_) => "CertManagerIssuer",
            Rejection::Requester(_) => "CertManagerRequester",
            Rejection::Usages(_) => "CertManagerUsages",
            Rejection::Malformed(_) => "CertManagerMalformedCertificate",
            Rejection::KeyMismatch => "CertManagerKeyMismatch",
            Rejection::Names(_) => "CertManagerNames",
            Rejection::IsCa => "CertManagerIsCA",
            Rejection::Lifetime(_) => "CertManagerLifetime",
            Rejection::Chain => "CertManagerChainUntrusted",
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
