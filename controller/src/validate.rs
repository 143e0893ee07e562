//! The pure core of CSR validation (SPEC §6).
//!
//! [`validate`] takes what the CSR says ([`CsrView`]), what the API server
//! says about the world right now ([`LiveContext`]) and the configured
//! [`Policy`], and returns either a [`ValidatedCsr`] — the only input the
//! signers accept — or the first [`Denial`]. No I/O happens here, so every
//! check is a unit test and the fuzzer can drive the parser directly.
//!
//! The order of checks is: who asked (requester, token-bound Pod, its
//! DaemonSet and template, the Node and its UID and chassis), then what was
//! asked (the PKCS#10 request: encoding, key, signature algorithm,
//! self-signature, subject, SANs, extensions), then how (Kubernetes usages,
//! lifetime). The request's name is never consulted: a CSR named like a
//! node's is worth nothing unless every binding above holds.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_PKCS1_RSAENCRYPTION, OID_PKCS1_SHA256WITHRSA,
    OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA, OID_SIG_ECDSA_WITH_SHA256,
    OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use crate::names;

/// The parts of a `certificates.k8s.io/v1` CSR that validation reads.
///
/// Built from the API object by the kube glue; tests build it directly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsrView {
    /// `metadata.name` (used in messages only, never as evidence).
    pub name: String,
    /// `spec.signerName`.
    pub signer_name: String,
    /// `spec.username`, stamped by the API server.
    pub username: String,
    /// `spec.extra`, stamped by the API server from the bound token.
    pub extra: BTreeMap<String, Vec<String>>,
    /// `spec.usages`.
    pub usages: Vec<String>,
    /// `spec.expirationSeconds`.
    pub expiration_seconds: Option<i64>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.request`: the PEM-encoded PKCS#10 request.
    pub request: Vec<u8>,
}

/// A Pod as the API server reports it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName` (empty while unscheduled).
    pub node_name: String,
    /// UID of the controlling owner reference when it is a DaemonSet.
    pub owner_daemon_set_uid: Option<String>,
    /// The Pod's `controller-revision-hash` label.
    pub template_hash: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `status.phase` is `Succeeded` or `Failed`.
    pub finished: bool,
}

/// A Node as the API server reports it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The node's chassis annotation (`ovn.kubernetes.io/chassis`).
    pub chassis: Option<String>,
}

/// The kube-ovn-cni DaemonSet as the API server reports it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonSetView {
    /// `metadata.uid`.
    pub uid: String,
    /// Hash of the current template: the `controller-revision-hash` of the
    /// DaemonSet's newest ControllerRevision.
    pub current_template_hash: Option<String>,
}

/// Live objects fetched for one CSR. `None` means "does not exist".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveContext {
    /// The Pod named by the token binding (looked up by name, UID compared here).
    pub pod: Option<PodView>,
    /// The Node named by the token binding.
    pub node: Option<NodeView>,
    /// The kube-ovn-cni DaemonSet.
    pub daemon_set: Option<DaemonSetView>,
}

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

/// The key algorithm of a validated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// RSA with the given modulus size in bits.
    Rsa(usize),
    /// ECDSA on NIST P-256.
    EcdsaP256,
}

/// A request that passed every check; the signers take nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedCsr {
    /// The chassis: the subject CN and the single DNS SAN.
    pub chassis: String,
    /// The Node name (token-bound).
    pub node_name: String,
    /// The Node UID (live, equal to the annotation).
    pub node_uid: String,
    /// The Pod UID (token-bound, live).
    pub pod_uid: String,
    /// Key algorithm.
    pub key_kind: KeyKind,
    /// The subjectPublicKey bits of the request (RSAPublicKey DER or EC point).
    pub public_key: Vec<u8>,
    /// The DER SubjectPublicKeyInfo of the request.
    pub spki_der: Vec<u8>,
    /// The lifetime to issue.
    pub lifetime: Duration,
}

/// The facts a PKCS#10 request states, once parsed and its signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// Subject attributes in order, as (short name, value).
    pub subject: Vec<(String, String)>,
    /// DNS SANs.
    pub dns_sans: Vec<String>,
    /// Key algorithm.
    pub key_kind: KeyKind,
    /// subjectPublicKey bits.
    pub public_key: Vec<u8>,
    /// DER SubjectPublicKeyInfo.
    pub spki_der: Vec<u8>,
}

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

/// Validates a CSR against live state and policy. Pure: no I/O, no clock.
pub fn validate(csr: &CsrView, ctx: &LiveContext, policy: &Policy) -> Result<ValidatedCsr, Denial> {
    if csr.signer_name != names::SIGNER_NAME {
        return Err(Denial::SignerName {
            signer: csr.signer_name.clone(),
        });
    }
    // Who asked.
    if csr.username != policy.requester() {
        return Err(Denial::Requester {
            username: csr.username.clone(),
        });
    }
    let pod_uid = single_extra(csr, names::EXTRA_POD_UID)?;
    let pod_name = single_extra(csr, names::EXTRA_POD_NAME)?;
    let bound_node = single_extra(csr, names::EXTRA_NODE_NAME)?;

    let pod = match &ctx.pod {
        Some(p) if p.uid == pod_uid && p.name == pod_name && !p.terminating && !p.finished => p,
        _ => {
            return Err(Denial::PodNotLive {
                pod_uid: pod_uid.to_owned(),
            });
        }
    };
    if pod.node_name != bound_node {
        return Err(Denial::PodNodeMismatch {
            pod_node: pod.node_name.clone(),
            bound_node: bound_node.to_owned(),
        });
    }
    let (ds_uid, current_hash) = match &ctx.daemon_set {
        Some(DaemonSetView {
            uid,
            current_template_hash: Some(h),
        }) if !h.is_empty() => (uid, h),
        _ => return Err(Denial::DaemonSetMissing),
    };
    if pod.owner_daemon_set_uid.as_deref() != Some(ds_uid.as_str()) {
        return Err(Denial::PodNotOwnedByDaemonSet);
    }
    if pod.template_hash.as_deref() != Some(current_hash.as_str()) {
        return Err(Denial::PodTemplateOutdated {
            pod_hash: pod.template_hash.clone(),
            current_hash: current_hash.clone(),
        });
    }

    // Which node, and is the claim about it true now.
    let annotated_node = annotation(csr, names::ANNOTATION_NODE)?;
    if annotated_node != bound_node {
        return Err(Denial::NodeBindingMismatch {
            annotated: annotated_node.to_owned(),
            bound: bound_node.to_owned(),
        });
    }
    let annotated_uid = annotation(csr, names::ANNOTATION_NODE_UID)?;
    let chassis = annotation(csr, names::ANNOTATION_CHASSIS)?;
    let node = match &ctx.node {
        Some(n) if n.name == bound_node => n,
        _ => {
            return Err(Denial::NodeNotFound {
                node: bound_node.to_owned(),
            });
        }
    };
    // Newer API servers also bind the token to the Node's UID: a token from
    // before the Node was re-created under the same name is worth nothing.
    if let Some(bound_uid) = csr.extra.get(names::EXTRA_NODE_UID).and_then(|v| v.first())
        && *bound_uid != node.uid
    {
        return Err(Denial::NodeUidMismatch {
            live: node.uid.clone(),
            annotated: bound_uid.clone(),
        });
    }
    if node.uid != annotated_uid {
        return Err(Denial::NodeUidMismatch {
            live: node.uid.clone(),
            annotated: annotated_uid.to_owned(),
        });
    }
    if !valid_chassis(chassis) {
        return Err(Denial::InvalidChassis);
    }
    if node.chassis.as_deref() != Some(chassis) {
        return Err(Denial::ChassisMismatch {
            node_chassis: node.chassis.clone(),
            annotated: chassis.to_owned(),
        });
    }

    // What was asked.
    let facts = inspect_request(&csr.request, policy)?;
    check_subject(&facts, chassis)?;
    check_sans(&facts, chassis)?;

    // How.
    if csr.usages.len() != 1 || csr.usages[0] != names::USAGE_IPSEC_TUNNEL {
        return Err(Denial::Usages {
            usages: csr.usages.clone(),
        });
    }
    let lifetime = check_lifetime(csr.expiration_seconds, policy)?;

    Ok(ValidatedCsr {
        chassis: chassis.to_owned(),
        node_name: bound_node.to_owned(),
        node_uid: node.uid.clone(),
        pod_uid: pod.uid.clone(),
        key_kind: facts.key_kind,
        public_key: facts.public_key,
        spki_der: facts.spki_der,
        lifetime,
    })
}

fn single_extra<'a>(csr: &'a CsrView, key: &'static str) -> Result<&'a str, Denial> {
    match csr.extra.get(key).map(Vec::as_slice) {
        Some([v]) if !v.is_empty() => Ok(v.as_str()),
        _ => Err(Denial::PodBindingMissing { key }),
    }
}

fn annotation<'a>(csr: &'a CsrView, key: &'static str) -> Result<&'a str, Denial> {
    match csr.annotations.get(key) {
        Some(v) if !v.is_empty() => Ok(v.as_str()),
        _ => Err(Denial::AnnotationMissing { key }),
    }
}

/// A chassis ends up in a certificate's CN and DNS SAN and in strongSwan's
/// configuration; the rule is `api`'s [`kube_ovn_ipsec_api::ident::Chassis`],
/// shared with the agent.
pub fn valid_chassis(chassis: &str) -> bool {
    kube_ovn_ipsec_api::ident::Chassis::new(chassis).is_ok()
}

fn check_lifetime(requested: Option<i64>, policy: &Policy) -> Result<Duration, Denial> {
    let (min, max) = (policy.min_lifetime.as_secs(), policy.max_lifetime.as_secs());
    match requested.and_then(|s| u64::try_from(s).ok()) {
        Some(s) if s >= min && s <= max => Ok(Duration::from_secs(s)),
        _ => Err(Denial::Lifetime {
            requested,
            min,
            max,
        }),
    }
}

fn check_subject(facts: &RequestFacts, chassis: &str) -> Result<(), Denial> {
    let mut o = 0;
    let mut cn = 0;
    for (ty, value) in &facts.subject {
        match ty.as_str() {
            "O" if value == names::SUBJECT_ORGANIZATION => o += 1,
            "CN" if value == chassis => cn += 1,
            "CN" => {
                return Err(Denial::Subject {
                    detail: format!("CN {value:?} is not the chassis {chassis:?}"),
                });
            }
            other => {
                return Err(Denial::Subject {
                    detail: format!("unexpected attribute {other}"),
                });
            }
        }
    }
    if o != 1 || cn != 1 || facts.subject.len() != 2 {
        return Err(Denial::Subject {
            detail: format!(
                "found {} O and {} CN in {} attributes",
                o,
                cn,
                facts.subject.len()
            ),
        });
    }
    Ok(())
}

fn check_sans(facts: &RequestFacts, chassis: &str) -> Result<(), Denial> {
    match facts.dns_sans.as_slice() {
        [one] if one == chassis => Ok(()),
        other => Err(Denial::SubjectAltNames {
            detail: format!("DNS SANs {other:?}"),
        }),
    }
}

/// PEM label of a PKCS#10 request.
const CSR_PEM_LABEL: &str = "CERTIFICATE REQUEST";
/// Requests larger than this are refused before parsing: an RSA-4096 request
/// is about 1.7 KiB of PEM, so 16 KiB is generous and bounds the work an
/// attacker can cause.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// Parses and checks a PEM PKCS#10 request on its own (no identity checks):
/// encoding, key type and size, signature algorithm, self-signature, and the
/// requested extensions. Never panics, whatever the input (fuzzed).
pub fn inspect_request(pem_bytes: &[u8], policy: &Policy) -> Result<RequestFacts, Denial> {
    if pem_bytes.len() > MAX_REQUEST_BYTES {
        return Err(Denial::MalformedRequest {
            detail: "request larger than 16 KiB",
        });
    }
    let blocks = pem::parse_many(pem_bytes).map_err(|_| Denial::MalformedRequest {
        detail: "request is not valid PEM",
    })?;
    let der = match blocks.as_slice() {
        [one] if one.tag() == CSR_PEM_LABEL => one.contents(),
        [_] => {
            return Err(Denial::MalformedRequest {
                detail: "PEM block is not a CERTIFICATE REQUEST",
            });
        }
        _ => {
            return Err(Denial::MalformedRequest {
                detail: "request must hold exactly one PEM block",
            });
        }
    };
    inspect_der(der, policy)
}

/// Like [`inspect_request`] for DER input.
pub fn inspect_der(der: &[u8], policy: &Policy) -> Result<RequestFacts, Denial> {
    let (rest, csr) =
        X509CertificationRequest::from_der(der).map_err(|_| Denial::MalformedRequest {
            detail: "request is not a PKCS#10 DER structure",
        })?;
    if !rest.is_empty() {
        return Err(Denial::MalformedRequest {
            detail: "trailing bytes after the request",
        });
    }
    let info = &csr.certification_request_info;
    if info.version.0 != 0 {
        return Err(Denial::MalformedRequest {
            detail: "request version is not v1",
        });
    }

    // Key first: a too-small RSA key would also fail signature verification
    // (the verifier refuses < 2048 bits), and the operator deserves the real
    // reason.
    let spki = &info.subject_pki;
    let key_kind = if spki.algorithm.algorithm == OID_PKCS1_RSAENCRYPTION {
        match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => {
                let bits = rsa.key_size();
                if !policy.rsa_bits.contains(&bits) || rsa.try_exponent().ok() != Some(65537) {
                    return Err(Denial::KeySize { bits });
                }
                KeyKind::Rsa(bits)
            }
            _ => {
                return Err(Denial::MalformedRequest {
                    detail: "RSA public key does not parse",
                });
            }
        }
    } else if spki.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        if curve.as_ref() != Some(&OID_EC_P256) {
            return Err(Denial::UnsupportedKeyType {
                detail: format!(
                    "EC curve {}",
                    curve
                        .map(|c| c.to_id_string())
                        .unwrap_or_else(|| "(none)".into())
                ),
            });
        }
        let point = spki.subject_public_key.data.as_ref();
        if point.len() != 65 || point[0] != 4 {
            return Err(Denial::MalformedRequest {
                detail: "P-256 point is not uncompressed",
            });
        }
        KeyKind::EcdsaP256
    } else {
        return Err(Denial::UnsupportedKeyType {
            detail: format!("key algorithm {}", spki.algorithm.algorithm.to_id_string()),
        });
    };

    let sig = &csr.signature_algorithm.algorithm;
    let sig_ok = match key_kind {
        KeyKind::Rsa(_) => {
            *sig == OID_PKCS1_SHA256WITHRSA
                || *sig == OID_PKCS1_SHA384WITHRSA
                || *sig == OID_PKCS1_SHA512WITHRSA
        }
        KeyKind::EcdsaP256 => *sig == OID_SIG_ECDSA_WITH_SHA256,
    };
    if !sig_ok {
        return Err(Denial::SignatureAlgorithm {
            oid: sig.to_id_string(),
        });
    }
    csr.verify_signature()
        .map_err(|_| Denial::SignatureInvalid)?;

    let mut subject = Vec::new();
    for rdn in info.subject.iter_rdn() {
        // Multi-valued RDNs are legal X.509 but nothing we issue uses them;
        // refusing them keeps "exactly O and CN" unambiguous.
        let mut attrs = rdn.iter();
        let (Some(attr), None) = (attrs.next(), attrs.next()) else {
            return Err(Denial::Subject {
                detail: "multi-valued RDN".into(),
            });
        };
        let ty = if *attr.attr_type() == OID_X509_COMMON_NAME {
            "CN".to_owned()
        } else if *attr.attr_type() == OID_X509_ORGANIZATION_NAME {
            "O".to_owned()
        } else {
            attr.attr_type().to_id_string()
        };
        let value = attr.as_str().map_err(|_| Denial::Subject {
            detail: format!("{ty} is not a string"),
        })?;
        subject.push((ty, value.to_owned()));
    }

    let mut dns_sans = Vec::new();
    let mut saw_extension_request = false;
    for attr in info.iter_attributes() {
        match attr.parsed_attribute() {
            ParsedCriAttribute::ExtensionRequest(req) if !saw_extension_request => {
                saw_extension_request = true;
                for ext in &req.extensions {
                    match ext.parsed_extension() {
                        ParsedExtension::SubjectAlternativeName(san) => {
                            for name in &san.general_names {
                                match name {
                                    GeneralName::DNSName(d) => dns_sans.push((*d).to_owned()),
                                    GeneralName::IPAddress(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "IP address SAN".into(),
                                        });
                                    }
                                    GeneralName::URI(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "URI SAN".into(),
                                        });
                                    }
                                    GeneralName::RFC822Name(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "email SAN".into(),
                                        });
                                    }
                                    _ => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "SAN of another type".into(),
                                        });
                                    }
                                }
                            }
                        }
                        ParsedExtension::BasicConstraints(bc) => {
                            if bc.ca {
                                return Err(Denial::CaRequested);
                            }
                        }
                        // Requested key usages and extended key usages are
                        // accepted only if harmless: the signer writes the
                        // leaf's usages itself and copies nothing else.
                        ParsedExtension::KeyUsage(ku) => {
                            if ku.key_cert_sign() || ku.crl_sign() {
                                return Err(Denial::CaRequested);
                            }
                        }
                        ParsedExtension::ExtendedKeyUsage(eku) => {
                            let only_ipsec = !eku.any
                                && !eku.server_auth
                                && !eku.client_auth
                                && !eku.code_signing
                                && !eku.email_protection
                                && !eku.time_stamping
                                && !eku.ocsp_signing
                                && eku
                                    .other
                                    .iter()
                                    .all(|o| o.to_id_string() == IPSEC_TUNNEL_EKU);
                            if !only_ipsec {
                                return Err(Denial::UnexpectedExtension {
                                    oid: format!("{} (extended key usage)", ext.oid.to_id_string()),
                                });
                            }
                        }
                        _ => {
                            return Err(Denial::UnexpectedExtension {
                                oid: ext.oid.to_id_string(),
                            });
                        }
                    }
                }
            }
            _ => {
                return Err(Denial::UnexpectedExtension {
                    oid: attr.oid.to_id_string(),
                });
            }
        }
    }

    Ok(RequestFacts {
        subject,
        dns_sans,
        key_kind,
        public_key: spki.subject_public_key.data.to_vec(),
        spki_der: spki.raw.to_vec(),
    })
}

/// id-kp-ipsecTunnel (RFC 2459), the X.509 meaning of Kubernetes' `ipsec tunnel` usage.
pub const IPSEC_TUNNEL_EKU: &str = "1.3.6.1.5.5.7.3.6";

#[cfg(test)]
pub(crate) mod tests;
