//! The pure identity checks of CSR validation (SPEC §6): allow or deny.
//!
//! [`validate`] takes what the CSR says ([`CsrView`]), what the API server
//! says about the world right now ([`LiveContext`]) and the configured
//! [`Policy`], and returns either a [`ValidatedCsr`] — the only input the
//! signers accept — or the first [`Denial`]. No I/O happens here, so every
//! check is a unit test. The request bytes themselves are read by the
//! PKCS#10 parser in [`crate::pkcs10`]; this module checks the facts it
//! returns against the chassis the live state vouches for.
//!
//! The order of checks is: who asked (requester, token-bound Pod, its
//! DaemonSet and template, the Node and its UID and chassis), then what was
//! asked (the PKCS#10 request: encoding, key, signature algorithm,
//! self-signature, subject, SANs, extensions), then how (Kubernetes usages,
//! lifetime). The request's name is never consulted: a CSR named like a
//! node's is worth nothing unless every binding above holds.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::denial::Denial;
use crate::names;
use crate::pkcs10::{KeyKind, RequestFacts, inspect_request};
use crate::policy::Policy;

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

#[cfg(test)]
pub(crate) mod tests;
