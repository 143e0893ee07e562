//! A node's receipt judged against the stored record and live objects
//! (SPEC §7), as pure functions: the shell reads the Node's annotation,
//! [`peek`]s (or [`peek_release`]s) which CSR and Pod the receipt names,
//! fetches those, and [`judge`]s (or [`judge_release`]s). Every refusal
//! names the check ([`Verdict::Refused`]'s `check`, used as the Event
//! reason) and never panics.
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
//!
//! A *release* receipt (annotation `kube-ovn.io/ipsec-release-receipt`,
//! the cleanup init container's last act) goes through the same checks of
//! what it is, whose key signed it and the Pod it names — each one
//! implementation, its Event reason prefixed `ReleaseReceipt` instead of
//! `Receipt` so an Event says which annotation failed — with three
//! differences. The signer is the certificate the receipt carries
//! (chained to the trust, naming this node's chassis): the CSR that issued
//! it is usually gone, kube-controller-manager deleting issued CSRs an
//! hour after approval. While the CSR still exists it must have issued
//! that certificate and name this node, but its requester Pod is not
//! compared: it was the node's *old* agent Pod (the cleanup Pod replaced
//! it and never issues a certificate). And the
//! named Pod's `ipsec-cleanup` init container must have terminated with
//! exit code 0 (`ReleaseInitNotTerminated` while it runs or waits,
//! `ReleaseInitFailed` with the exit code and reason otherwise). Then
//! [`ReleaseReceipt::check_against`]: generation, epoch, phase `Release`,
//! node and UID, template hash, challenge, not in the future, every step
//! done.
//!
//! Both kinds are judged by one implementation: the binding checks, then
//! the record-side checks named as Event reasons, written over a private
//! trait that [`Receipt`] and [`ReleaseReceipt`] implement with what
//! tells them apart (how the signing certificate is found and the CSR
//! bound, what the Pod must show, what a refusal adds).

use std::collections::BTreeMap;

use kube_ovn_ipsec_api::coordination::{
    CoordinationPhase, CoordinationRecord, NodeReceipt, Receipt, ReleaseReceipt,
};
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::signed::{self, SignedPayload, Unverified};
use kube_ovn_ipsec_api::time::Timestamp;

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

/// The state of a Pod's `ipsec-cleanup` init container, from its
/// `status.initContainerStatuses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitState {
    /// Not started yet, or waiting to be restarted: the reason the
    /// kubelet gives (e.g. `PodInitializing`, `CrashLoopBackOff`; empty
    /// when it gives none).
    Waiting(String),
    /// Running now.
    Running,
    /// Ended.
    Terminated {
        /// Its exit code.
        exit_code: i32,
        /// The kubelet's reason and the container's termination message,
        /// as far as given.
        reason: String,
    },
}

/// The Pod a release receipt names: its facts and its cleanup init
/// container's state (`None`: the Pod reports no status for it yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupPodFacts {
    /// What any receipt's Pod is checked for.
    pub pod: PodFacts,
    /// The `ipsec-cleanup` init container's state.
    pub cleanup_init: Option<InitState>,
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

/// What one node's receipt annotation came to for the stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A receipt for this record's generation, epoch and phase, verified
    /// end to end and satisfying the phase's barrier.
    Satisfied,
    /// No receipt annotation.
    Missing,
    /// A receipt that does not satisfy the barrier: `check` names the
    /// check (an Event reason), `message` says what was found.
    Refused {
        /// The check that failed, e.g. `ReceiptEpochMismatch`.
        check: &'static str,
        /// What the check found.
        message: String,
    },
}

impl Verdict {
    /// Why this node holds the barrier, for status and Events.
    pub fn waiting_reason(&self) -> Option<String> {
        match self {
            Verdict::Satisfied => None,
            Verdict::Missing => Some("no receipt yet".into()),
            Verdict::Refused { check, message } => Some(format!("{check}: {message}")),
        }
    }
}

fn refused(check: &'static str, message: impl Into<String>) -> Verdict {
    Verdict::Refused {
        check,
        message: message.into(),
    }
}

/// Which annotation is judged: the shared checks' Event reasons carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Doc {
    /// `kube-ovn.io/ipsec-receipt`.
    Receipt,
    /// `kube-ovn.io/ipsec-release-receipt`.
    Release,
}

/// A check of what a receipt is, whose key signed it and whom it binds,
/// which both kinds of receipt go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Malformed,
    NodeMismatch,
    CsrMissing,
    CsrMismatch,
    CsrNotIssued,
    CertificateInvalid,
    CertificateUntrusted,
    ChassisMismatch,
    SignatureInvalid,
    CertificateMismatch,
    PodMismatch,
    PodNotLive,
    TemplateMismatch,
}

/// A record-side check (what the verified receipt says against the
/// record), as its Event reason tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Observed too long ago, or in the future.
    Fresh,
    /// The status does not show what the phase needs.
    Status,
    /// Another challenge than the record's.
    Challenge,
    /// Another generation, epoch or phase than the record's.
    Epoch,
    /// Any other field (node, UID, hashes).
    Other,
}

impl Claim {
    /// Which record-side check `e` (from a `check_against`) failed.
    fn of(e: &kube_ovn_ipsec_api::Error) -> Claim {
        match e {
            kube_ovn_ipsec_api::Error::ReceiptNotFresh { .. } => Claim::Fresh,
            kube_ovn_ipsec_api::Error::ReceiptMismatch { field: "status" } => Claim::Status,
            kube_ovn_ipsec_api::Error::ReceiptMismatch { field: "challenge" } => Claim::Challenge,
            kube_ovn_ipsec_api::Error::ReceiptMismatch { field }
                if *field == "epoch" || *field == "generation" || *field == "phase" =>
            {
                Claim::Epoch
            }
            _ => Claim::Other,
        }
    }
}

impl Doc {
    /// The Event reason of `check` for this annotation.
    fn name(self, check: Check) -> &'static str {
        use Check::*;
        match self {
            Doc::Receipt => match check {
                Malformed => "ReceiptMalformed",
                NodeMismatch => "ReceiptNodeMismatch",
                CsrMissing => "ReceiptCsrMissing",
                CsrMismatch => "ReceiptCsrMismatch",
                CsrNotIssued => "ReceiptCsrNotIssued",
                CertificateInvalid => "ReceiptCertificateInvalid",
                CertificateUntrusted => "ReceiptCertificateUntrusted",
                ChassisMismatch => "ReceiptChassisMismatch",
                SignatureInvalid => "ReceiptSignatureInvalid",
                CertificateMismatch => "ReceiptCertificateMismatch",
                PodMismatch => "ReceiptPodMismatch",
                PodNotLive => "ReceiptPodNotLive",
                TemplateMismatch => "ReceiptTemplateMismatch",
            },
            Doc::Release => match check {
                Malformed => "ReleaseReceiptMalformed",
                NodeMismatch => "ReleaseReceiptNodeMismatch",
                CsrMissing => "ReleaseReceiptCsrMissing",
                CsrMismatch => "ReleaseReceiptCsrMismatch",
                CsrNotIssued => "ReleaseReceiptCsrNotIssued",
                CertificateInvalid => "ReleaseReceiptCertificateInvalid",
                CertificateUntrusted => "ReleaseReceiptCertificateUntrusted",
                ChassisMismatch => "ReleaseReceiptChassisMismatch",
                SignatureInvalid => "ReleaseReceiptSignatureInvalid",
                CertificateMismatch => "ReleaseReceiptCertificateMismatch",
                PodMismatch => "ReleaseReceiptPodMismatch",
                PodNotLive => "ReleaseReceiptPodNotLive",
                TemplateMismatch => "ReleaseReceiptTemplateMismatch",
            },
        }
    }

    /// The Event reason of a record-side `claim` for this annotation. A
    /// receipt carries no challenge and a release no freshness limit,
    /// hence `Stale` for the one and `InFuture` for the other.
    fn claim(self, claim: Claim) -> &'static str {
        match self {
            Doc::Receipt => match claim {
                Claim::Fresh => "ReceiptStale",
                Claim::Status => "ReceiptNotReady",
                Claim::Epoch => "ReceiptEpochMismatch",
                Claim::Challenge | Claim::Other => "ReceiptMismatch",
            },
            Doc::Release => match claim {
                Claim::Fresh => "ReleaseReceiptInFuture",
                Claim::Status => "ReleaseReceiptIncomplete",
                Claim::Challenge => "ReleaseReceiptChallengeMismatch",
                Claim::Epoch => "ReleaseReceiptEpochMismatch",
                Claim::Other => "ReleaseReceiptMismatch",
            },
        }
    }

    /// How a refusal's message calls this annotation.
    fn noun(self) -> &'static str {
        match self {
            Doc::Receipt => "receipt",
            Doc::Release => "release receipt",
        }
    }

    fn refuse(self, check: Check, message: impl Into<String>) -> Verdict {
        refused(self.name(check), message)
    }
}

/// What tells the two kinds of receipt apart in their judgement: the
/// annotation, the Pod's facts, how the signing certificate is found and
/// the CSR bound, what the Pod must show beyond being the bound one, and
/// what a record-side refusal adds. The judgement itself ([`binding`],
/// [`record_verdict`]) is written once over it.
trait Judged: NodeReceipt + SignedPayload + Sized {
    /// The annotation this kind is read from.
    const DOC: Doc;
    /// What is read about the Pod the receipt names.
    type Pod;

    /// The facts every receipt's Pod is checked for.
    fn pod_facts(pod: &Self::Pod) -> &PodFacts;

    /// The receipt, once its signature verifies with the certificate this
    /// kind is signed with and the CSR it names binds it as this kind
    /// requires.
    fn signed(
        receipt: Unverified<Self>,
        trust: &TrustBundle,
        node: NodeFacts<'_>,
        csr: Option<&CsrFacts>,
        now: Timestamp,
    ) -> Result<Self, Verdict>;

    /// What the bound Pod must show besides (nothing, unless overridden).
    fn pod_done(&self, _pod: Option<&Self::Pod>) -> Result<(), Verdict> {
        Ok(())
    }

    /// What a refusal of record-side `claim` adds to the check's message
    /// (nothing, unless overridden).
    fn detail(&self, _claim: Claim, _record: &CoordinationRecord) -> String {
        String::new()
    }
}

impl Judged for Receipt {
    const DOC: Doc = Doc::Receipt;
    type Pod = PodFacts;

    fn pod_facts(pod: &PodFacts) -> &PodFacts {
        pod
    }

    /// The signer is the certificate the live CSR issued; the CSR was
    /// requested by the Pod the receipt names, for this node.
    fn signed(
        receipt: Unverified<Self>,
        trust: &TrustBundle,
        node: NodeFacts<'_>,
        csr: Option<&CsrFacts>,
        now: Timestamp,
    ) -> Result<Self, Verdict> {
        let doc = Self::DOC;
        let claimed = receipt.peek();
        let named = (claimed.csr_name.as_str(), &claimed.csr_uid);
        let (cert, csr) = signer(doc, trust, node, csr, named, now)?;
        let receipt = verified(receipt, &cert)?;
        // Whom it binds: the CSR's requester is the receipt's Pod (which
        // the shared Pod check then finds live, the frozen DaemonSet's,
        // from the frozen template, on this node).
        if csr.requester_pod_uid.as_deref() != Some(receipt.pod_uid.as_str()) {
            return Err(doc.refuse(
                Check::PodMismatch,
                format!(
                    "CSR {} was requested by Pod {:?}, the receipt names Pod {}",
                    receipt.csr_name, csr.requester_pod_uid, receipt.pod_uid
                ),
            ));
        }
        csr_for_node(doc, csr, &receipt.csr_name, node)?;
        Ok(receipt)
    }
}

impl Judged for ReleaseReceipt {
    const DOC: Doc = Doc::Release;
    type Pod = CleanupPodFacts;

    fn pod_facts(pod: &CleanupPodFacts) -> &PodFacts {
        &pod.pod
    }

    /// The signer is the certificate the receipt carries: the CSR that
    /// issued it is usually gone by now (kube-controller-manager deletes
    /// issued CSRs an hour after approval). While the CSR still exists it
    /// must be the one that issued this very certificate, for this node;
    /// its requester is the node's old agent Pod, not the cleanup Pod the
    /// receipt names.
    fn signed(
        receipt: Unverified<Self>,
        trust: &TrustBundle,
        node: NodeFacts<'_>,
        csr: Option<&CsrFacts>,
        now: Timestamp,
    ) -> Result<Self, Verdict> {
        let doc = Self::DOC;
        let carried = receipt.peek().certificate.as_bytes();
        let cert = certified(doc, trust, node, carried, now)?;
        let receipt = verified(receipt, &cert)?;
        if let Some(csr) = csr {
            issued_by(doc, csr, &receipt, &cert, node)?;
        }
        Ok(receipt)
    }

    /// The cleanup init container ran to a successful end.
    fn pod_done(&self, pod: Option<&CleanupPodFacts>) -> Result<(), Verdict> {
        let init = pod.and_then(|p| p.cleanup_init.as_ref());
        match init_refusal(&self.pod_uid, init) {
            Some(v) => Err(v),
            None => Ok(()),
        }
    }

    /// Which cycle and challenge it answers: what an operator needs to
    /// tell a stale receipt (the cleanup must run again) from a foreign
    /// one.
    fn detail(&self, claim: Claim, record: &CoordinationRecord) -> String {
        let short = |c: Option<&kube_ovn_ipsec_api::coordination::Challenge>| {
            c.and_then(|c| c.to_string().get(..12).map(str::to_owned))
                .unwrap_or_else(|| "none".into())
        };
        match claim {
            Claim::Epoch => format!(
                " (the receipt answers generation {} epoch {} {}; the record is generation {} \
                 epoch {} {})",
                self.generation,
                self.epoch,
                self.phase,
                record.generation,
                record.epoch,
                record.phase
            ),
            Claim::Challenge => format!(
                " (the receipt answers challenge {}…, the record's is {}…)",
                short(Some(&self.challenge)),
                short(record.challenge.as_ref())
            ),
            _ => String::new(),
        }
    }
}

/// Decodes a signed annotation without trusting it. `None`:
/// [`Verdict::Missing`].
fn decode<R: Judged>(annotation: Option<&str>) -> Result<Unverified<R>, Verdict> {
    let Some(a) = annotation else {
        return Err(Verdict::Missing);
    };
    signed::decode::<R>(a).map_err(|e| R::DOC.refuse(Check::Malformed, e.to_string()))
}

/// Decodes a receipt annotation without trusting it, to learn which CSR
/// and Pod to fetch. `None` annotation: [`Verdict::Missing`].
pub fn peek(annotation: Option<&str>) -> Result<Unverified<Receipt>, Verdict> {
    decode(annotation)
}

/// Decodes a release receipt annotation without trusting it, to learn
/// which CSR and Pod to fetch. `None` annotation: [`Verdict::Missing`].
pub fn peek_release(annotation: Option<&str>) -> Result<Unverified<ReleaseReceipt>, Verdict> {
    decode(annotation)
}

/// Whether a Node's annotations say it may hold this project's state: its
/// receipt (`receipt`) decodes, names the Node's live UID (`node_uid`) and
/// answers an enable-side phase, and no release receipt (`release`)
/// answers that epoch or a later one. Nothing is verified: a claim only
/// makes the disable ask the node for a verified release, so a forged one
/// costs the forger's own Node a retirement and hides nothing. An
/// undecodable release receipt counts as none (the claim stands).
pub fn claims_state(node_uid: &Uid, receipt: Option<&str>, release: Option<&str>) -> bool {
    let Ok(receipt) = peek(receipt) else {
        return false;
    };
    let r = receipt.peek();
    if r.node_uid != *node_uid || !r.phase.is_enable_side() {
        return false;
    }
    match peek_release(release) {
        Ok(release) => {
            let rel = release.peek();
            (rel.generation, rel.epoch) < (r.generation, r.epoch)
        }
        Err(_) => true,
    }
}

/// Which certificate signed a receipt, as far as the live CSR says: the
/// CSR named `csr_name` exists with UID `csr_uid` and carries an issued
/// certificate that chains to the trust and names the node's chassis.
/// Returns that certificate and the CSR.
fn signer<'c>(
    doc: Doc,
    trust: &TrustBundle,
    node: NodeFacts<'_>,
    csr: Option<&'c CsrFacts>,
    (csr_name, csr_uid): (&str, &Uid),
    now: Timestamp,
) -> Result<(Certificate, &'c CsrFacts), Verdict> {
    let Some(csr) = csr else {
        return Err(doc.refuse(Check::CsrMissing, format!("CSR {csr_name} does not exist")));
    };
    if csr.uid != csr_uid.as_str() {
        return Err(doc.refuse(
            Check::CsrMismatch,
            format!(
                "CSR {csr_name} has UID {}, the receipt names {csr_uid}",
                csr.uid
            ),
        ));
    }
    let Some(pem) = &csr.certificate_pem else {
        return Err(doc.refuse(
            Check::CsrNotIssued,
            format!("CSR {csr_name} has no certificate"),
        ));
    };
    Ok((certified(doc, trust, node, pem, now)?, csr))
}

/// The certificate in `pem`, if it chains to the trust and names this
/// node's chassis: only this node holds a key such a certificate names
/// (the controller issued it against the live Node and Pod).
fn certified(
    doc: Doc,
    trust: &TrustBundle,
    node: NodeFacts<'_>,
    pem: &[u8],
    now: Timestamp,
) -> Result<Certificate, Verdict> {
    let cert = Certificate::from_pem(pem)
        .map_err(|e| doc.refuse(Check::CertificateInvalid, e.to_string()))?;
    trust
        .verify_leaf(&cert, now)
        .map_err(|e| doc.refuse(Check::CertificateUntrusted, e.to_string()))?;
    let Some(chassis) = node.chassis else {
        return Err(doc.refuse(Check::ChassisMismatch, "the Node has no chassis annotation"));
    };
    Chassis::new(chassis)
        .and_then(|c| cert.check_chassis_identity(&c))
        .map_err(|e| doc.refuse(Check::ChassisMismatch, e.to_string()))?;
    Ok(cert)
}

/// The signature verifies with `cert`, and the signed status names that
/// very certificate.
fn verified<R: Judged>(receipt: Unverified<R>, cert: &Certificate) -> Result<R, Verdict> {
    let doc = R::DOC;
    let receipt = receipt
        .verify(cert)
        .map_err(|e| doc.refuse(Check::SignatureInvalid, e.to_string()))?;
    if *receipt.head().certificate_digest != cert.digest() {
        return Err(doc.refuse(
            Check::CertificateMismatch,
            "the receipt's status names another certificate than its CSR's",
        ));
    }
    Ok(receipt)
}

/// The CSR was requested for this node.
fn csr_for_node(
    doc: Doc,
    csr: &CsrFacts,
    csr_name: &str,
    node: NodeFacts<'_>,
) -> Result<(), Verdict> {
    if csr.node_annotation.as_deref() != Some(node.name) {
        return Err(doc.refuse(
            Check::CsrMismatch,
            format!(
                "CSR {csr_name} was requested for node {:?}",
                csr.node_annotation
            ),
        ));
    }
    Ok(())
}

/// The CSR a release receipt names, where it still exists: the one with
/// the UID the receipt names, which issued `cert`, for this node.
fn issued_by(
    doc: Doc,
    csr: &CsrFacts,
    receipt: &ReleaseReceipt,
    cert: &Certificate,
    node: NodeFacts<'_>,
) -> Result<(), Verdict> {
    if csr.uid != receipt.csr_uid.as_str() {
        return Err(doc.refuse(
            Check::CsrMismatch,
            format!(
                "CSR {} has UID {}, the receipt names {}",
                receipt.csr_name, csr.uid, receipt.csr_uid
            ),
        ));
    }
    let issued = csr
        .certificate_pem
        .as_deref()
        .and_then(|pem| Certificate::from_pem(pem).ok());
    if issued.map(|c| c.digest()) != Some(cert.digest()) {
        return Err(doc.refuse(
            Check::CertificateMismatch,
            format!(
                "CSR {} did not issue the certificate the receipt carries",
                receipt.csr_name
            ),
        ));
    }
    csr_for_node(doc, csr, &receipt.csr_name, node)
}

/// The Pod `pod_uid` is live on this node, the frozen DaemonSet's, from
/// the frozen template.
fn bound_pod<'p>(
    doc: Doc,
    record: &CoordinationRecord,
    node: NodeFacts<'_>,
    pod: Option<&'p PodFacts>,
    pod_uid: &Uid,
) -> Result<&'p PodFacts, Verdict> {
    let Some(pod) = pod.filter(|p| p.uid == pod_uid.as_str()) else {
        return Err(doc.refuse(Check::PodNotLive, format!("Pod {pod_uid} does not exist")));
    };
    if !pod.live || pod.node_name != node.name {
        return Err(doc.refuse(
            Check::PodNotLive,
            format!("Pod {} is not live on {}", pod.uid, node.name),
        ));
    }
    if pod.owner_uid.as_deref() != record.daemon_set_uid.as_ref().map(|u| u.as_str()) {
        return Err(doc.refuse(
            Check::PodMismatch,
            format!("Pod {} is not the frozen DaemonSet's", pod.uid),
        ));
    }
    if pod.template_hash.is_none() || pod.template_hash != record.template_hash {
        return Err(doc.refuse(
            Check::TemplateMismatch,
            format!(
                "Pod {} runs template {:?}, the cohort is frozen at {:?}",
                pod.uid, pod.template_hash, record.template_hash
            ),
        ));
    }
    Ok(pod)
}

/// The checks of what a receipt is, whose key signed it and whom it
/// binds, for either kind: it names this node, its signature and CSR
/// hold ([`Judged::signed`]), the Pod it names is live on this node from
/// the frozen DaemonSet and template, and that Pod shows what this kind
/// needs ([`Judged::pod_done`]). The verified receipt when they pass.
fn binding<R: Judged>(
    record: &CoordinationRecord,
    trust: &TrustBundle,
    node: NodeFacts<'_>,
    receipt: Unverified<R>,
    csr: Option<&CsrFacts>,
    pod: Option<&R::Pod>,
    now: Timestamp,
) -> Result<R, Verdict> {
    let doc = R::DOC;
    let named = receipt.peek().head().node_name;
    if named != node.name {
        return Err(doc.refuse(
            Check::NodeMismatch,
            format!("the {} names node {named}", doc.noun()),
        ));
    }
    let receipt = R::signed(receipt, trust, node, csr, now)?;
    let facts = pod.map(R::pod_facts);
    bound_pod(doc, record, node, facts, receipt.head().pod_uid)?;
    receipt.pod_done(pod)?;
    Ok(receipt)
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
    match binding(record, trust, node, receipt, csr, pod, now) {
        Ok(receipt) => claims(record, answer, &receipt, now),
        Err(v) => v,
    }
}

/// Judges a release receipt (from [`peek_release`]) for `node` against the
/// stored `Release` record, the trust, and the CSR and cleanup Pod it
/// names as they are live now (see the module doc for how it differs
/// from [`judge`]).
pub fn judge_release(
    record: &CoordinationRecord,
    trust: &TrustBundle,
    node: NodeFacts<'_>,
    receipt: Unverified<ReleaseReceipt>,
    csr: Option<&CsrFacts>,
    pod: Option<&CleanupPodFacts>,
    now: Timestamp,
) -> Verdict {
    match binding(record, trust, node, receipt, csr, pod, now) {
        Ok(receipt) => release_claims(record, &receipt, now),
        Err(v) => v,
    }
}

/// The check of a release receipt whose cleanup init container has not
/// terminated yet (running, waiting, or no status): a wait, not a fault.
pub const INIT_NOT_TERMINATED: &str = "ReleaseInitNotTerminated";

/// Why the cleanup Pod's init container does not show a finished,
/// successful run, if it does not.
fn init_refusal(pod_uid: &Uid, init: Option<&InitState>) -> Option<Verdict> {
    let container = kube_ovn_ipsec_api::names::k8s::INIT_CONTAINER_CLEANUP;
    let not_terminated = |what: String| {
        Some(refused(
            INIT_NOT_TERMINATED,
            format!("Pod {pod_uid}: {container} {what}"),
        ))
    };
    match init {
        None => not_terminated("has no status yet".into()),
        Some(InitState::Running) => not_terminated("is running".into()),
        Some(InitState::Waiting(reason)) if reason.is_empty() => {
            not_terminated("is waiting".into())
        }
        Some(InitState::Waiting(reason)) => not_terminated(format!("is waiting ({reason})")),
        Some(InitState::Terminated { exit_code: 0, .. }) => None,
        Some(InitState::Terminated { exit_code, reason }) => Some(refused(
            "ReleaseInitFailed",
            format!("Pod {pod_uid}: {container} exited with code {exit_code}: {reason}"),
        )),
    }
}

/// The outcome of a verified receipt's record-side checks (`checked`, its
/// `check_against` against `record` or the barrier it is judged as), each
/// failure named as its Event reason.
fn record_verdict<R: Judged>(
    record: &CoordinationRecord,
    receipt: &R,
    checked: kube_ovn_ipsec_api::Result<()>,
) -> Verdict {
    let Err(e) = checked else {
        return Verdict::Satisfied;
    };
    let claim = Claim::of(&e);
    let detail = receipt.detail(claim, record);
    refused(R::DOC.claim(claim), format!("{e}{detail}"))
}

/// The record-side checks of a verified release receipt
/// ([`ReleaseReceipt::check_against`], what [`judge_release`] ends with),
/// each failure named as its Event reason.
pub fn release_claims(
    record: &CoordinationRecord,
    receipt: &ReleaseReceipt,
    now: Timestamp,
) -> Verdict {
    record_verdict(record, receipt, receipt.check_against(record, now))
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
    match answer {
        Answer::Barrier => record_verdict(record, receipt, receipt.check_against(record, now)),
        Answer::Admission { node, uid } => admission(record, node, uid, receipt, now),
    }
}

/// [`claims`] for a node asking to be admitted (see there).
fn admission(
    record: &CoordinationRecord,
    node: &str,
    uid: &Uid,
    receipt: &Receipt,
    now: Timestamp,
) -> Verdict {
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
        Ok(()) if prepared => refused(
            "ReceiptNotReady",
            "prepared for admission (identity and capability); \
             waiting for its Arm receipt",
        ),
        checked => record_verdict(record, receipt, checked),
    }
}

#[cfg(test)]
mod tests;
