//! Why a CSR is denied: [`Denial`], one variant per check of SPEC §6.
//!
//! Shared by the PKCS#10 parser ([`crate::pkcs10`], the request's own
//! faults) and the identity checks ([`crate::validate`], who asked and
//! whether the claim holds now). Each variant has a stable CamelCase
//! [`Denial::reason`] for the CSR `Denied` condition and the metrics, and a
//! message naming the failed check that never echoes the request.

use std::fmt;

use crate::names;

/// Why a CSR is denied: one variant per check of SPEC §6.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Denial {
    /// `spec.signerName` is not ours (never signed, normally filtered earlier).
    SignerName {
        /// The signer named.
        signer: String,
    },
    /// `spec.username` is not the kube-ovn-cni ServiceAccount.
    Requester {
        /// Who asked.
        username: String,
    },
    /// The token-bound Pod UID, Pod name or Node name is missing or ambiguous.
    PodBindingMissing {
        /// The `spec.extra` key at fault.
        key: &'static str,
    },
    /// The token-bound Pod does not exist, has another UID, is terminating or finished.
    PodNotLive {
        /// The token-bound Pod UID.
        pod_uid: String,
    },
    /// The token-bound Pod runs on another node than the token's node.
    PodNodeMismatch {
        /// Where the Pod runs.
        pod_node: String,
        /// The token's node.
        bound_node: String,
    },
    /// The kube-ovn-cni DaemonSet does not exist or has no current template.
    DaemonSetMissing,
    /// The Pod is not controlled by the current kube-ovn-cni DaemonSet.
    PodNotOwnedByDaemonSet,
    /// The Pod runs an older (or unknown) template of the DaemonSet.
    PodTemplateOutdated {
        /// The Pod's template hash.
        pod_hash: Option<String>,
        /// The DaemonSet's current template hash.
        current_hash: String,
    },
    /// A required CSR annotation is missing.
    AnnotationMissing {
        /// The annotation key.
        key: &'static str,
    },
    /// The CSR's node annotation names another node than the token binding.
    NodeBindingMismatch {
        /// The annotated node.
        annotated: String,
        /// The token-bound node.
        bound: String,
    },
    /// The token-bound Node does not exist.
    NodeNotFound {
        /// The node name.
        node: String,
    },
    /// The live Node's UID differs from `kube-ovn.io/ipsec-node-uid`.
    NodeUidMismatch {
        /// The live UID.
        live: String,
        /// The annotated UID.
        annotated: String,
    },
    /// The chassis annotation is not a valid chassis name.
    InvalidChassis,
    /// The Node's chassis annotation differs from `kube-ovn.io/ipsec-chassis`.
    ChassisMismatch {
        /// The Node's chassis, if it has one.
        node_chassis: Option<String>,
        /// The CSR's chassis.
        annotated: String,
    },
    /// `spec.request` is not exactly one well-formed PEM PKCS#10 request.
    MalformedRequest {
        /// What is wrong, without echoing the input.
        detail: &'static str,
    },
    /// The request's key is neither RSA nor EC P-256.
    UnsupportedKeyType {
        /// The algorithm found.
        detail: String,
    },
    /// The request's RSA key has a size (or exponent) that is not allowed.
    KeySize {
        /// The modulus size in bits.
        bits: usize,
    },
    /// The request is signed with an algorithm that is not allowed (e.g. SHA-1).
    SignatureAlgorithm {
        /// The algorithm OID.
        oid: String,
    },
    /// The request's self-signature does not verify.
    SignatureInvalid,
    /// The subject is not exactly `O=kube-ovn, CN=<chassis>`.
    Subject {
        /// What differs.
        detail: String,
    },
    /// The SANs are not exactly `DNS:<chassis>`.
    SubjectAltNames {
        /// What differs.
        detail: String,
    },
    /// The request asks for a CA certificate.
    CaRequested,
    /// The request carries an extension or attribute that is not allowed.
    UnexpectedExtension {
        /// The OID.
        oid: String,
    },
    /// `spec.usages` is not exactly `[ipsec tunnel]`.
    Usages {
        /// The usages requested.
        usages: Vec<String>,
    },
    /// `spec.expirationSeconds` is missing or outside the configured bounds.
    Lifetime {
        /// The requested seconds.
        requested: Option<i64>,
        /// Lower bound, seconds.
        min: u64,
        /// Upper bound, seconds.
        max: u64,
    },
}

impl Denial {
    /// CamelCase reason for the CSR `Denied` condition and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Denial::SignerName { .. } => "WrongSigner",
            Denial::Requester { .. } => "RequesterNotCniServiceAccount",
            Denial::PodBindingMissing { .. } => "PodBindingMissing",
            Denial::PodNotLive { .. } => "PodNotLive",
            Denial::PodNodeMismatch { .. } => "PodNodeMismatch",
            Denial::DaemonSetMissing => "DaemonSetMissing",
            Denial::PodNotOwnedByDaemonSet => "PodNotOwnedByDaemonSet",
            Denial::PodTemplateOutdated { .. } => "PodTemplateOutdated",
            Denial::AnnotationMissing { .. } => "AnnotationMissing",
            Denial::NodeBindingMismatch { .. } => "NodeBindingMismatch",
            Denial::NodeNotFound { .. } => "NodeNotFound",
            Denial::NodeUidMismatch { .. } => "NodeUIDMismatch",
            Denial::InvalidChassis => "InvalidChassis",
            Denial::ChassisMismatch { .. } => "ChassisMismatch",
            Denial::MalformedRequest { .. } => "MalformedRequest",
            Denial::UnsupportedKeyType { .. } => "UnsupportedKeyType",
            Denial::KeySize { .. } => "KeySizeNotAllowed",
            Denial::SignatureAlgorithm { .. } => "SignatureAlgorithmNotAllowed",
            Denial::SignatureInvalid => "SignatureInvalid",
            Denial::Subject { .. } => "SubjectMismatch",
            Denial::SubjectAltNames { .. } => "SubjectAltNameMismatch",
            Denial::CaRequested => "CARequested",
            Denial::UnexpectedExtension { .. } => "UnexpectedExtension",
            Denial::Usages { .. } => "UsagesNotAllowed",
            Denial::Lifetime { .. } => "LifetimeOutOfBounds",
        }
    }

    /// Every reason [`Denial::reason`] can return (for metrics pre-registration and docs).
    pub const ALL_REASONS: &'static [&'static str] = &[
        "WrongSigner",
        "RequesterNotCniServiceAccount",
        "PodBindingMissing",
        "PodNotLive",
        "PodNodeMismatch",
        "DaemonSetMissing",
        "PodNotOwnedByDaemonSet",
        "PodTemplateOutdated",
        "AnnotationMissing",
        "NodeBindingMismatch",
        "NodeNotFound",
        "NodeUIDMismatch",
        "InvalidChassis",
        "ChassisMismatch",
        "MalformedRequest",
        "UnsupportedKeyType",
        "KeySizeNotAllowed",
        "SignatureAlgorithmNotAllowed",
        "SignatureInvalid",
        "SubjectMismatch",
        "SubjectAltNameMismatch",
        "CARequested",
        "UnexpectedExtension",
        "UsagesNotAllowed",
        "LifetimeOutOfBounds",
    ];
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::SignerName { signer } => {
                write!(
                    f,
                    "signer check failed: signerName {signer:?} is not {}",
                    names::SIGNER_NAME
                )
            }
            Denial::Requester { username } => write!(
                f,
                "requester check failed: {username:?} is not the kube-ovn-cni ServiceAccount"
            ),
            Denial::PodBindingMissing { key } => write!(
                f,
                "pod binding check failed: spec.extra[{key:?}] must hold exactly one value \
                 (requests must use a Pod-bound ServiceAccount token)"
            ),
            Denial::PodNotLive { pod_uid } => write!(
                f,
                "pod check failed: token-bound Pod {pod_uid} is not a live Pod \
                 (deleted, replaced, terminating or finished)"
            ),
            Denial::PodNodeMismatch {
                pod_node,
                bound_node,
            } => write!(
                f,
                "pod node check failed: the Pod runs on {pod_node:?}, the token names {bound_node:?}"
            ),
            Denial::DaemonSetMissing => write!(
                f,
                "daemonset check failed: the kube-ovn-cni DaemonSet or its current template is missing"
            ),
            Denial::PodNotOwnedByDaemonSet => write!(
                f,
                "pod owner check failed: the Pod is not controlled by the current kube-ovn-cni DaemonSet"
            ),
            Denial::PodTemplateOutdated {
                pod_hash,
                current_hash,
            } => write!(
                f,
                "pod template check failed: the Pod runs template {pod_hash:?}, current is {current_hash:?}"
            ),
            Denial::AnnotationMissing { key } => {
                write!(
                    f,
                    "annotation check failed: annotation {key:?} is missing or empty"
                )
            }
            Denial::NodeBindingMismatch { annotated, bound } => write!(
                f,
                "node binding check failed: the CSR names node {annotated:?}, the token is bound to {bound:?}"
            ),
            Denial::NodeNotFound { node } => {
                write!(f, "node check failed: Node {node:?} does not exist")
            }
            Denial::NodeUidMismatch { live, annotated } => write!(
                f,
                "node UID check failed: Node UID is {live}, the CSR claims {annotated}"
            ),
            Denial::InvalidChassis => {
                write!(
                    f,
                    "chassis check failed: the chassis annotation is not a valid chassis name"
                )
            }
            Denial::ChassisMismatch {
                node_chassis,
                annotated,
            } => write!(
                f,
                "chassis check failed: the Node's chassis is {node_chassis:?}, the CSR claims {annotated:?}"
            ),
            Denial::MalformedRequest { detail } => {
                write!(f, "request encoding check failed: {detail}")
            }
            Denial::UnsupportedKeyType { detail } => write!(
                f,
                "key type check failed: {detail} (allowed: RSA 2048/3072/4096, ECDSA P-256)"
            ),
            Denial::KeySize { bits } => write!(
                f,
                "key size check failed: RSA-{bits} (or its exponent) is not allowed"
            ),
            Denial::SignatureAlgorithm { oid } => write!(
                f,
                "signature algorithm check failed: {oid} is not allowed \
                 (allowed: RSA PKCS#1 SHA-256/384/512, ECDSA SHA-256)"
            ),
            Denial::SignatureInvalid => {
                write!(
                    f,
                    "self-signature check failed: the request's signature does not verify"
                )
            }
            Denial::Subject { detail } => {
                write!(
                    f,
                    "subject check failed: must be exactly O=kube-ovn, CN=<chassis>: {detail}"
                )
            }
            Denial::SubjectAltNames { detail } => write!(
                f,
                "subject alternative name check failed: must be exactly DNS:<chassis>: {detail}"
            ),
            Denial::CaRequested => {
                write!(
                    f,
                    "CA check failed: the request asks for basicConstraints CA:true"
                )
            }
            Denial::UnexpectedExtension { oid } => write!(
                f,
                "extension check failed: requested extension or attribute {oid} is not allowed"
            ),
            Denial::Usages { usages } => write!(
                f,
                "usages check failed: {usages:?} is not exactly [\"{}\"]",
                names::USAGE_IPSEC_TUNNEL
            ),
            Denial::Lifetime {
                requested,
                min,
                max,
            } => write!(
                f,
                "lifetime check failed: expirationSeconds {requested:?} is outside [{min}, {max}]"
            ),
        }
    }
}
