//! A node's receipt judged against the stored record and live objects
//! (SPEC §7), as pure functions: the shell reads the Node's annotation,
//! [`peek`]s which CSR and Pod the receipt names, fetches those, and
//! [`judge`]s. Every refusal names the check ([`Verdict::Refused`]'s
//! `check`, used as the Event reason) and never panics.
//!
//! Order of the checks: what the receipt is (decodable, within the size
//! cap), whose key signed it (the CSR it names exists with that UID and
//! carries an issued certificate that chains to the trust and names this
//! node's chassis; the signature verifies with it; the status names that
//! certificate), whom it binds (the CSR was requested by the Pod the
//! receipt names, for this node; that Pod is live, on this node, owned by
//! the frozen DaemonSet, from the frozen template), and what it says
//! (generation, epoch, phase, hashes, freshness, the barrier's flags).
//! Pod readiness is never consulted: only signed evidence counts.
//!
//! A receipt answers either the record's own barrier (a frozen target in
//! `Prepare`/`Arm`) or, while the record is `Enabled`, asks for the
//! admission of a node the DaemonSet schedules to that is not a target
//! ([`Answer`]). Both go through the same checks; an admission is judged as
//! the `Arm` barrier that node would have passed, for the record's own
//! generation and epoch, under the UID its Node has now.

use std::collections::BTreeMap;

use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord, Receipt};
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::signed::{self, Unverified};
use kube_ovn_ipsec_api::time::Timestamp;

use super::machine::Verdict;

/// The CSR a receipt names, as read from the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsrFacts {
    /// `metadata.uid`.
    pub uid: String,
    /// `status.certificate` (PEM), if issued.
    pub certificate_pem: Option<Vec<u8>>,
    /// `spec.extra["authentication.kubernetes.io/pod-uid"]`: the Pod whose
    /// token requested it.
    pub requester_pod_uid: Option<String>,
    /// Annotation `kube-ovn.io/ipsec-node`: the node it was requested for.
    pub node_annotation: Option<String>,
}

/// The Pod a receipt names, as read from the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// The controlling owner's UID (the DaemonSet's, for a CNI Pod).
    pub owner_uid: Option<String>,
    /// Label `controller-revision-hash`.
    pub template_hash: Option<String>,
    /// Not terminating and not finished.
    pub live: bool,
}

/// The node whose annotation is judged.
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// Annotation `ovn.kubernetes.io/chassis`.
    pub chassis: Option<&'a str>,
}

/// What a receipt is judged as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// A frozen target's answer to the record's own barrier.
    Barrier,
    /// A node asking to be admitted while the record is `Enabled`: it is
    /// scheduled, not a target, and its Node has UID `uid` now.
    Admission {
        /// The Node's name.
        node: &'a str,
        /// The Node's live UID.
        uid: &'a Uid,
    },
}

fn refused(check: &'static str, message: impl Into<String>) -> Verdict {
    Verdict::Refused {
        check,
        message: message.into(),
    }
}

/// Decodes a receipt annotation without trusting it, to learn which CSR
/// and Pod to fetch. `None` annotation: [`Verdict::Missing`].
pub fn peek(annotation: Option<&str>) -> Result<Unverified<Receipt>, Verdict> {
    let Some(a) = annotation else {
        return Err(Verdict::Missing);
    };
    signed::decode::<Receipt>(a).map_err(|e| refused("ReceiptMalformed", e.to_string()))
}

/// Judges `receipt` (from [`peek`]) for `node` against the stored record,
/// the trust, and the CSR and Pod it names as they are live now, as
/// `answer`.
#[allow(clippy::too_many_arguments)] // each is one live fact the checks compare
pub fn judge(
    record: &CoordinationRecord,
    answer: Answer<'_>,
    trust: &TrustBundle,
    node: NodeFacts<'_>,
    receipt: Unverified<Receipt>,
    csr: Option<&CsrFacts>,
    pod: Option<&PodFacts>,
    now: Timestamp,
) -> Verdict {
    let claimed = receipt.peek().clone();
    if claimed.node_name != node.name {
        return refused(
            "ReceiptNodeMismatch",
            format!("the receipt names node {}", claimed.node_name),
        );
    }
    // Whose key: the CSR's issued certificate, chained and named.
    let Some(csr) = csr else {
        return refused(
            "ReceiptCsrMissing",
            format!("CSR {} does not exist", claimed.csr_name),
        );
    };
    if csr.uid != claimed.csr_uid.as_str() {
        return refused(
            "ReceiptCsrMismatch",
            format!(
                "CSR {} has UID {}, the receipt names {}",
                claimed.csr_name, csr.uid, claimed.csr_uid
            ),
        );
    }
    let Some(pem) = &csr.certificate_pem else {
        return refused(
            "ReceiptCsrNotIssued",
            format!("CSR {} has no certificate", claimed.csr_name),
        );
    };
    let cert = match Certificate::from_pem(pem) {
        Ok(c) => c,
        Err(e) => return refused("ReceiptCertificateInvalid", e.to_string()),
    };
    if let Err(e) = trust.verify_leaf(&cert, now) {
        return refused("ReceiptCertificateUntrusted", e.to_string());
    }
    let Some(chassis) = node.chassis else {
        return refused(
            "ReceiptChassisMismatch",
            "the Node has no chassis annotation",
        );
    };
    let named = Chassis::new(chassis).and_then(|c| cert.check_chassis_identity(&c));
    if let Err(e) = named {
        return refused("ReceiptChassisMismatch", e.to_string());
    }
    let receipt = match receipt.verify(&cert) {
        Ok(r) => r,
        Err(e) => return refused("ReceiptSignatureInvalid", e.to_string()),
    };
    if receipt.status.certificate_digest != cert.digest() {
        return refused(
            "ReceiptCertificateMismatch",
            "the receipt's status names another certificate than its CSR's",
        );
    }
    // Whom it binds: the CSR's requester is the receipt's Pod, that Pod is
    // the frozen DaemonSet's, from the frozen template, live on this node.
    if csr.requester_pod_uid.as_deref() != Some(receipt.pod_uid.as_str()) {
        return refused(
            "ReceiptPodMismatch",
            format!(
                "CSR {} was requested by Pod {:?}, the receipt names Pod {}",
                receipt.csr_name, csr.requester_pod_uid, receipt.pod_uid
            ),
        );
    }
    if csr.node_annotation.as_deref() != Some(node.name) {
        return refused(
            "ReceiptCsrMismatch",
            format!(
                "CSR {} was requested for node {:?}",
                receipt.csr_name, csr.node_annotation
            ),
        );
    }
    let Some(pod) = pod.filter(|p| p.uid == receipt.pod_uid.as_str()) else {
        return refused(
            "ReceiptPodNotLive",
            format!("Pod {} does not exist", receipt.pod_uid),
        );
    };
    if !pod.live || pod.node_name != node.name {
        return refused(
            "ReceiptPodNotLive",
            format!("Pod {} is not live on {}", pod.uid, node.name),
        );
    }
    if pod.owner_uid.as_deref() != record.daemon_set_uid.as_ref().map(|u| u.as_str()) {
        return refused(
            "ReceiptPodMismatch",
            format!("Pod {} is not the frozen DaemonSet's", pod.uid),
        );
    }
    if pod.template_hash.is_none() || pod.template_hash != record.template_hash {
        return refused(
            "ReceiptTemplateMismatch",
            format!(
                "Pod {} runs template {:?}, the cohort is frozen at {:?}",
                pod.uid, pod.template_hash, record.template_hash
            ),
        );
    }
    // What it says, against the record.
    claims(record, answer, &receipt, now)
}

/// The record-side checks of a verified receipt, as `answer` (what
/// [`judge`] ends with, after the signature and the binding passed):
/// generation, epoch, phase, node UID, hashes, freshness and the barrier's
/// flags, each failure named as its Event reason.
///
/// An admission is checked as the `Arm` barrier of the record's generation
/// and epoch with the node as its only target. A joiner's `Prepare`
/// receipt, otherwise valid, is its first step and not yet enough:
/// `ReceiptNotReady`, saying so.
pub fn claims(
    record: &CoordinationRecord,
    answer: Answer<'_>,
    receipt: &Receipt,
    now: Timestamp,
) -> Verdict {
    let checked = match answer {
        Answer::Barrier => receipt.check_against(record, now),
        Answer::Admission { node, uid } => {
            if record.phase != CoordinationPhase::Enabled {
                return refused(
                    "ReceiptEpochMismatch",
                    format!(
                        "nodes are admitted only while Enabled, not {}",
                        record.phase
                    ),
                );
            }
            let prepared = receipt.phase == CoordinationPhase::Prepare;
            let mut barrier = record.clone();
            barrier.phase = if prepared {
                CoordinationPhase::Prepare
            } else {
                CoordinationPhase::Arm
            };
            barrier.targets = BTreeMap::from([(node.to_owned(), uid.clone())]);
            match receipt.check_against(&barrier, now) {
                Ok(()) if prepared => {
                    return refused(
                        "ReceiptNotReady",
                        "prepared for admission (identity and capability); \
                         waiting for its Arm receipt",
                    );
                }
                other => other,
            }
        }
    };
    if let Err(e) = checked {
        let check = match &e {
            kube_ovn_ipsec_api::Error::ReceiptNotFresh { .. } => "ReceiptStale",
            kube_ovn_ipsec_api::Error::ReceiptMismatch { field: "status" } => "ReceiptNotReady",
            kube_ovn_ipsec_api::Error::ReceiptMismatch { field }
                if *field == "epoch" || *field == "generation" || *field == "phase" =>
            {
                "ReceiptEpochMismatch"
            }
            _ => "ReceiptMismatch",
        };
        return refused(check, e.to_string());
    }
    Verdict::Satisfied
}

#[cfg(test)]
mod tests;
