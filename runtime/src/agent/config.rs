//! Flags of `kube-ovn-ipsec run`. Every flag has an environment fallback so
//! the chart can feed the downward API (`NODE_NAME`, `POD_NAME`,
//! `POD_NAMESPACE`, `POD_UID`) and `OVN_IPSEC_KEY_DIR` without a wrapper
//! script.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use actors::pki::KeyType;
use kube_ovn_ipsec_api::names::{defaults, host, k8s};

/// Key algorithm of the node identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyAlgorithm {
    /// RSA-2048: the default, and the only key type OVS 3.1's
    /// ovs-monitor-ipsec loads into strongSwan.
    Rsa2048,
    /// ECDSA P-256.
    EcdsaP256,
}

impl From<KeyAlgorithm> for KeyType {
    fn from(a: KeyAlgorithm) -> Self {
        match a {
            KeyAlgorithm::Rsa2048 => KeyType::Rsa2048,
            KeyAlgorithm::EcdsaP256 => KeyType::EcdsaP256,
        }
    }
}

/// `kube-ovn-ipsec run` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// This Pod's name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// This Pod's namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: String,
    /// This Pod's UID (downward API `metadata.uid`); part of the CSR name.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: String,
    /// Key directory. Hosts with a read-only `/etc` (Talos) use
    /// `/var/lib/ovs_ipsec_keys`.
    #[arg(long, env = host::ENV_KEY_DIR, default_value = host::DEFAULT_KEY_DIR)]
    pub key_dir: PathBuf,
    /// The local Open_vSwitch database.
    #[arg(
        long,
        env = "OVSDB_REMOTE",
        default_value = "unix:/run/openvswitch/db.sock"
    )]
    pub ovsdb: String,
    /// Where `/status`, `/readyz`, `/healthz` and `/metrics` are served.
    #[arg(long, env = "OVN_IPSEC_STATUS_ADDR", default_value = "0.0.0.0:10667")]
    pub status_addr: SocketAddr,
    /// Requested certificate lifetime (`expirationSeconds`), in seconds.
    #[arg(long, env = "OVN_IPSEC_CERT_LIFETIME", default_value_t = defaults::CERTIFICATE_LIFETIME_SECS)]
    pub certificate_lifetime: u32,
    /// Key algorithm.
    #[arg(
        long,
        env = "OVN_IPSEC_KEY_ALGORITHM",
        value_enum,
        default_value = "rsa2048"
    )]
    pub key_algorithm: KeyAlgorithm,
    /// How long one wait for the CSR may take before it counts as timed out,
    /// in seconds.
    #[arg(long, env = "OVN_IPSEC_REQUEST_TIMEOUT", default_value_t = 300)]
    pub request_timeout: u64,
    /// Namespace of ConfigMap `ovn-ipsec-trust` (the controller's).
    #[arg(long, env = "OVN_IPSEC_TRUST_NAMESPACE", default_value = "kube-system")]
    pub trust_namespace: String,
    /// Name of the trust ConfigMap.
    #[arg(long, default_value = k8s::TRUST_CONFIGMAP)]
    pub trust_configmap: String,
    /// A kubeconfig to use instead of the in-cluster ServiceAccount (the lab
    /// and tests).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How long the chassis (`external_ids:system-id`) may be missing from
    /// OVSDB before start-up gives up, in seconds.
    #[arg(long, default_value_t = 120)]
    pub chassis_timeout: u64,
}

impl RunArgs {
    /// [`RunArgs::request_timeout`] as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout)
    }
}
