//! Contract names the controller uses (SPEC §2, §6): re-exported from the
//! `api` crate where they live, plus the few that only the controller reads.

pub use kube_ovn_ipsec_api::names::k8s::{
    ANNOTATION_CHASSIS, ANNOTATION_GENERATION, ANNOTATION_NODE, ANNOTATION_NODE_UID, CA_SECRET,
    EXTRA_NODE_NAME, EXTRA_POD_NAME, EXTRA_POD_UID, SIGNER_NAME, SIGNING_CA_ANNOTATION,
    SUBJECT_ORGANIZATION, TRUST_CONFIGMAP, TRUST_CONFIGMAP_KEY,
};

/// Node annotation where Kube-OVN publishes the node's chassis (system-id).
pub const NODE_CHASSIS_ANNOTATION: &str = kube_ovn_ipsec_api::names::k8s::ANNOTATION_OVN_CHASSIS;
/// The only Kubernetes usage a node CSR may request.
pub const USAGE_IPSEC_TUNNEL: &str = kube_ovn_ipsec_api::names::k8s::CSR_USAGES[0];
/// `spec.extra` key the API server stamps from a Pod-bound token: the
/// Node's UID (Kubernetes 1.32+). Checked when present. (Not in `api` yet.)
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
/// Pod and ControllerRevision label carrying the DaemonSet template hash.
pub const TEMPLATE_HASH_LABEL: &str = "controller-revision-hash";
/// Key of the CA certificate (PEM) in [`CA_SECRET`] (`kubernetes.io/tls` layout).
pub const CA_SECRET_CERT_KEY: &str = "tls.crt";
/// Key of the CA private key (PKCS#8 PEM) in [`CA_SECRET`].
pub const CA_SECRET_KEY_KEY: &str = "tls.key";
/// Annotation on [`TRUST_CONFIGMAP`] carrying the bundle's SHA-256 digest,
/// so operators and the CA retirement step can compare it with node status.
pub const TRUST_DIGEST_ANNOTATION: &str = "kube-ovn.io/ipsec-trust-digest";
