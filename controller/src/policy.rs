//! [`Policy`]: what the operator allows a node to ask for.
//!
//! Its own module because both the PKCS#10 parser (accepted RSA sizes) and
//! the identity checks (requester, lifetime bounds) read it; neither owns it.

use std::time::Duration;

/// What the operator allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Namespace of the kube-ovn-cni DaemonSet and ServiceAccount.
    pub cni_namespace: String,
    /// Name of the kube-ovn-cni ServiceAccount.
    pub service_account: String,
    /// Shortest leaf lifetime accepted.
    pub min_lifetime: Duration,
    /// Longest leaf lifetime accepted.
    pub max_lifetime: Duration,
    /// RSA modulus sizes accepted, in bits.
    pub rsa_bits: Vec<usize>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            cni_namespace: "kube-system".into(),
            service_account: "kube-ovn-cni".into(),
            // Kubernetes itself refuses expirationSeconds below 600 s; an
            // hour keeps renewal (40–60% of lifetime) from becoming a storm.
            min_lifetime: Duration::from_secs(3600),
            max_lifetime: Duration::from_secs(30 * 24 * 3600),
            rsa_bits: vec![2048, 3072, 4096],
        }
    }
}

impl Policy {
    /// The `spec.username` the API server stamps for the CNI ServiceAccount.
    pub fn requester(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.cni_namespace, self.service_account
        )
    }
}
