//! The two generations the identity works with: the active one and the
//! pending one. Plain data: the machine holds them, and the steps it plans
//! (`mint`, `recovery`) make and read them, so they live below all three.

use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::pki::Certificate;

use crate::keydir::CsrBinding;
use crate::pki::PrivateKey;

/// The active generation.
#[derive(Debug, Clone)]
pub(crate) struct Active {
    /// Its number.
    pub generation: u64,
    /// Its leaf.
    pub certificate: Certificate,
    /// Whether the OVSDB writer confirmed OVSDB points at it.
    pub confirmed: bool,
    /// Digest of its `ca.pem` (`None` when unreadable): a trust bundle that
    /// differs gets a trust-only generation.
    pub ca_digest: Option<Sha256Digest>,
    /// The CSR its certificate was issued for, when recorded.
    pub csr: Option<CsrBinding>,
}

/// A pending generation: its key and CSR.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Its number.
    pub generation: u64,
    /// Its key (never logged: `Debug` prints the digest).
    pub key: PrivateKey,
    /// The CSR as submitted (empty for a trust-only generation).
    pub request_pem: String,
    /// The derived CSR name (empty for a trust-only generation).
    pub csr_name: String,
    /// Digest of the `ca.pem` stored with its certificate.
    pub ca_digest: Option<Sha256Digest>,
}
