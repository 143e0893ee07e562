//! Every check of a receipt, with real keys: one that passes, then each
//! way of failing, each with its own reason.

use kube_ovn_ipsec_api::coordination::CoordinationPhase;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::test_util::{CaSpec, TestCa, TestKeyAlg, TestLeaf};

use super::*;

const NOW: i64 = 1_900_000_000;

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_unix(secs).unwrap()
}

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

struct Fx {
    ca: TestCa,
    leaf: TestLeaf,
    record: CoordinationRecord,
    csr: CsrFacts,
    pod: PodFacts,
}

impl Fx {
    fn new() -> Self {
        let ca = CaSpec::new("evidence CA")
            .valid(ts(NOW - 86400), ts(NOW + 86400 * 365))
            .self_signed();
        let leaf = ca
            .leaf("chassis-a")
            .key(TestKeyAlg::P256)
            .valid(ts(NOW - 3600), ts(NOW + 86400))
            .issue();
        let mut record = CoordinationRecord::initial();
        record.generation = 1;
        record.epoch = 2;
        record.phase = CoordinationPhase::Arm;
        record.daemon_set_uid = Some(uid("ds-uid"));
        record.template_hash = Some("h1".into());
        record.trust_hash = Some(ca.trust_bundle().digest());
        record.targets.insert("node-a".into(), uid("node-a-uid"));
        let csr = CsrFacts {
            uid: "csr-uid".into(),
            certificate_pem: Some(leaf.cert_pem().into_bytes()),
            requester_pod_uid: Some("pod-uid".into()),
            node_annotation: Some("node-a".into()),
        };
        let pod = PodFacts {
            uid: "pod-uid".into(),
            node_name: "node-a".into(),
            owner_uid: Some("ds-uid".into()),
            template_hash: Some("h1".into()),
            live: true,
        };
        Fx {
            ca,
            leaf,
            record,
            csr,
            pod,
        }
    }

    fn receipt(&self) -> Receipt {
        Receipt {
            generation: self.record.generation,
            epoch: self.record.epoch,
            phase: self.record.phase,
            node_name: "node-a".into(),
            node_uid: uid("node-a-uid"),
            pod_uid: uid("pod-uid"),
            csr_name: "ovn-ipsec-node-a".into(),
            csr_uid: uid("csr-uid"),
            template_hash: "h1".into(),
            trust_hash: self.record.trust_hash.unwrap(),
            observed: ts(NOW - 10),
            status: kube_ovn_ipsec_api::test_util::ready_status(self.leaf.certificate.digest()),
        }
    }

    fn signed(&self, r: &Receipt) -> String {
        signed::sign(r, &self.leaf.signing_key()).unwrap()
    }

    fn judge_with(&self, annotation: &str, chassis: Option<&str>) -> Verdict {
        self.judge_as(annotation, chassis, Answer::Barrier)
    }

    fn judge_as(&self, annotation: &str, chassis: Option<&str>, answer: Answer<'_>) -> Verdict {
        let unverified = match peek(Some(annotation)) {
            Ok(u) => u,
            Err(v) => return v,
        };
        judge(
            &self.record,
            answer,
            &self.ca.trust_bundle(),
            NodeFacts {
                name: "node-a",
                chassis,
            },
            unverified,
            Some(&self.csr),
            Some(&self.pod),
            ts(NOW),
        )
    }

    fn judge(&self, annotation: &str) -> Verdict {
        self.judge_with(annotation, Some("chassis-a"))
    }
}

fn check_of(v: &Verdict) -> &'static str {
    match v {
        Verdict::Refused { check, .. } => check,
        Verdict::Satisfied => "Satisfied",
        Verdict::Missing => "Missing",
    }
}

#[test]
fn a_good_receipt_satisfies_the_barrier() {
    let f = Fx::new();
    assert_eq!(f.judge(&f.signed(&f.receipt())), Verdict::Satisfied);
}

#[test]
fn no_annotation_is_missing_and_garbage_is_malformed() {
    assert_eq!(peek(None).unwrap_err(), Verdict::Missing);
    let f = Fx::new();
    assert_eq!(check_of(&f.judge("not-a-receipt")), "ReceiptMalformed");
    let huge = "a".repeat(64 * 1024);
    assert_eq!(check_of(&f.judge(&huge)), "ReceiptMalformed");
}

#[test]
fn another_nodes_key_or_a_tampered_payload_fails_the_signature() {
    let f = Fx::new();
    let other = f.ca.leaf("chassis-a").key(TestKeyAlg::P256).issue();
    let forged = signed::sign(&f.receipt(), &other.signing_key()).unwrap();
    assert_eq!(check_of(&f.judge(&forged)), "ReceiptSignatureInvalid");
}

#[test]
fn a_certificate_outside_the_trust_or_for_another_chassis_is_refused() {
    let mut f = Fx::new();
    let good = f.signed(&f.receipt());
    assert_eq!(
        check_of(&f.judge_with(&good, Some("chassis-b"))),
        "ReceiptChassisMismatch"
    );
    assert_eq!(
        check_of(&f.judge_with(&good, None)),
        "ReceiptChassisMismatch"
    );
    let stranger = CaSpec::new("someone else").self_signed();
    let leaf = stranger.leaf("chassis-a").key(TestKeyAlg::P256).issue();
    f.csr.certificate_pem = Some(leaf.cert_pem().into_bytes());
    assert_eq!(check_of(&f.judge(&good)), "ReceiptCertificateUntrusted");
}

#[test]
fn a_receipt_naming_another_certificate_is_refused() {
    let f = Fx::new();
    let mut r = f.receipt();
    r.status.certificate_digest = f.ca.leaf("chassis-a").issue().certificate.digest();
    assert_eq!(
        check_of(&f.judge(&f.signed(&r))),
        "ReceiptCertificateMismatch"
    );
}

#[test]
fn the_csr_must_exist_with_its_uid_and_be_issued() {
    let mut f = Fx::new();
    let good = f.signed(&f.receipt());
    let unverified = peek(Some(&good)).unwrap();
    let v = judge(
        &f.record,
        Answer::Barrier,
        &f.ca.trust_bundle(),
        NodeFacts {
            name: "node-a",
            chassis: Some("chassis-a"),
        },
        unverified,
        None,
        Some(&f.pod),
        ts(NOW),
    );
    assert_eq!(check_of(&v), "ReceiptCsrMissing");
    f.csr.uid = "another-csr".into();
    assert_eq!(check_of(&f.judge(&good)), "ReceiptCsrMismatch");
    let mut f = Fx::new();
    f.csr.certificate_pem = None;
    assert_eq!(check_of(&f.judge(&good)), "ReceiptCsrNotIssued");
}

/// The check a good receipt fails once `tweak` changed the live facts.
fn after(tweak: fn(&mut Fx)) -> &'static str {
    let mut f = Fx::new();
    let good = f.signed(&f.receipt());
    tweak(&mut f);
    check_of(&f.judge(&good))
}

#[test]
fn another_pod_a_dead_pod_or_another_template_is_refused() {
    assert_eq!(
        after(|f| f.csr.requester_pod_uid = Some("other-pod".into())),
        "ReceiptPodMismatch"
    );
    assert_eq!(
        after(|f| f.pod.owner_uid = Some("someone-else".into())),
        "ReceiptPodMismatch"
    );
    assert_eq!(after(|f| f.pod.live = false), "ReceiptPodNotLive");
    assert_eq!(
        after(|f| f.pod.uid = "recreated".into()),
        "ReceiptPodNotLive"
    );
    assert_eq!(
        after(|f| f.pod.node_name = "node-b".into()),
        "ReceiptPodNotLive"
    );
    assert_eq!(
        after(|f| f.pod.template_hash = Some("h0".into())),
        "ReceiptTemplateMismatch"
    );
    assert_eq!(
        after(|f| f.csr.node_annotation = Some("node-b".into())),
        "ReceiptCsrMismatch"
    );
}

#[test]
fn a_stale_future_other_epoch_or_unready_receipt_is_refused() {
    let f = Fx::new();
    let mut r = f.receipt();
    r.observed = ts(NOW - 121);
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptStale");
    let mut r = f.receipt();
    r.observed = ts(NOW + 30);
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptStale");
    let mut r = f.receipt();
    r.epoch = 1;
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptEpochMismatch");
    let mut r = f.receipt();
    r.phase = CoordinationPhase::Prepare;
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptEpochMismatch");
    let mut r = f.receipt();
    r.status.protection_armed = false;
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptNotReady");
    let mut r = f.receipt();
    r.node_name = "node-b".into();
    assert_eq!(check_of(&f.judge(&f.signed(&r))), "ReceiptNodeMismatch");
}

/// The record `Enabled` at epoch 3 with node-b its only target: node-a is
/// a joiner, and its good receipt is an `Arm` receipt for epoch 3.
fn enabled_without_node_a() -> Fx {
    let mut f = Fx::new();
    f.record.phase = CoordinationPhase::Enabled;
    f.record.epoch = 3;
    f.record.targets = [("node-b".to_owned(), uid("node-b-uid"))].into();
    f
}

fn arm_receipt(f: &Fx) -> Receipt {
    Receipt {
        phase: CoordinationPhase::Arm,
        ..f.receipt()
    }
}

fn admit(f: &Fx, r: &Receipt) -> Verdict {
    let live = uid("node-a-uid");
    f.judge_as(
        &f.signed(r),
        Some("chassis-a"),
        Answer::Admission {
            node: "node-a",
            uid: &live,
        },
    )
}

#[test]
fn a_joiners_arm_receipt_for_the_enabled_epoch_admits_it() {
    let f = enabled_without_node_a();
    assert_eq!(admit(&f, &arm_receipt(&f)), Verdict::Satisfied);
    // The same receipt is no answer to a barrier: Enabled has none and
    // node-a is not a target.
    assert_eq!(
        check_of(&f.judge(&f.signed(&arm_receipt(&f)))),
        "ReceiptEpochMismatch"
    );
}

#[test]
fn a_joiners_prepare_receipt_says_it_is_prepared_and_waits() {
    let f = enabled_without_node_a();
    let mut r = f.receipt();
    r.phase = CoordinationPhase::Prepare;
    r.status.protection_armed = false;
    r.status.configuration_applied = false;
    r.status.runtime_healthy = false;
    let v = admit(&f, &r);
    assert_eq!(check_of(&v), "ReceiptNotReady");
    assert!(
        v.waiting_reason()
            .unwrap()
            .contains("prepared for admission"),
        "{v:?}"
    );
    // Without identity and capability it is not even prepared.
    r.status.capability_verified = false;
    let v = admit(&f, &r);
    assert_eq!(check_of(&v), "ReceiptNotReady");
    assert!(!v.waiting_reason().unwrap().contains("prepared"), "{v:?}");
}

#[test]
fn an_admission_needs_the_epoch_the_live_node_uid_the_hashes_and_every_flag() {
    let f = enabled_without_node_a();
    let mut r = arm_receipt(&f);
    r.epoch = 2;
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptEpochMismatch");
    let mut r = arm_receipt(&f);
    r.node_uid = uid("node-a-old-uid");
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptMismatch");
    let mut r = arm_receipt(&f);
    r.trust_hash = Sha256Digest::from_bytes([9; 32]);
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptMismatch");
    let mut r = arm_receipt(&f);
    r.template_hash = "h0".into();
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptMismatch");
    let mut r = arm_receipt(&f);
    r.status.runtime_healthy = false;
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptNotReady");
    let mut r = arm_receipt(&f);
    r.observed = ts(NOW - 121);
    assert_eq!(check_of(&admit(&f, &r)), "ReceiptStale");
    // Its Pod must still be the live Pod of the frozen template.
    let mut f = enabled_without_node_a();
    f.pod.template_hash = Some("h2".into());
    assert_eq!(
        check_of(&admit(&f, &arm_receipt(&f))),
        "ReceiptTemplateMismatch"
    );
}

#[test]
fn no_admission_outside_enabled() {
    let mut f = enabled_without_node_a();
    f.record.phase = CoordinationPhase::Arm;
    assert_eq!(
        check_of(&admit(&f, &arm_receipt(&f))),
        "ReceiptEpochMismatch"
    );
}

// ---- Release receipts ----

use kube_ovn_ipsec_api::coordination::{Challenge, ReleaseStatus};

/// A `Release` record for node-a (template `c1`, the cleanup shape), the
/// node's identity issued through its old agent Pod's CSR, and the live
/// cleanup Pod whose init container exited 0.
struct Rel {
    ca: TestCa,
    leaf: TestLeaf,
    record: CoordinationRecord,
    csr: CsrFacts,
    pod: CleanupPodFacts,
}

impl Rel {
    fn new() -> Self {
        let Fx { ca, leaf, csr, .. } = Fx::new();
        let mut record = CoordinationRecord::initial();
        record.generation = 2;
        record.epoch = 7;
        record.phase = CoordinationPhase::Release;
        record.daemon_set_uid = Some(uid("ds-uid"));
        record.template_hash = Some("c1".into());
        record.trust_hash = Some(ca.trust_bundle().digest());
        record.targets.insert("node-a".into(), uid("node-a-uid"));
        record.challenge = Some(Challenge::from_bytes([3; 32]));
        record.nb_global_uuid = Some(uuid::Uuid::from_u128(1));
        record.sb_global_uuid = Some(uuid::Uuid::from_u128(2));
        record.validate().unwrap();
        let pod = CleanupPodFacts {
            pod: PodFacts {
                uid: "cleanup-pod".into(),
                node_name: "node-a".into(),
                owner_uid: Some("ds-uid".into()),
                template_hash: Some("c1".into()),
                live: true,
            },
            cleanup_init: Some(InitState::Terminated {
                exit_code: 0,
                reason: "Completed".into(),
            }),
        };
        Rel {
            ca,
            leaf,
            record,
            // The CSR's requester is the agent Pod the cleanup Pod replaced.
            csr,
            pod,
        }
    }

    fn receipt(&self) -> ReleaseReceipt {
        ReleaseReceipt {
            generation: 2,
            epoch: 7,
            phase: CoordinationPhase::Release,
            node_name: "node-a".into(),
            node_uid: uid("node-a-uid"),
            pod_uid: uid("cleanup-pod"),
            csr_name: "ovn-ipsec-node-a".into(),
            csr_uid: uid("csr-uid"),
            template_hash: "c1".into(),
            trust_hash: self.record.trust_hash.unwrap(),
            // Written once, long before the last node of a serial rollout
            // is done: no age limit.
            observed: ts(NOW - 86400),
            challenge: Challenge::from_bytes([3; 32]),
            status: ReleaseStatus {
                lease_withdrawn: true,
                guards_removed: true,
                identity_cleared: true,
                drained: true,
                boot_id: uuid::Uuid::from_u128(42),
                certificate_digest: self.leaf.certificate.digest(),
            },
            certificate: self.leaf.certificate.to_pem(),
        }
    }

    fn signed(&self, r: &ReleaseReceipt) -> String {
        signed::sign(r, &self.leaf.signing_key()).unwrap()
    }

    fn judge_with(&self, annotation: &str, chassis: Option<&str>) -> Verdict {
        self.judge_full(annotation, chassis, Some(&self.csr))
    }

    fn judge_full(
        &self,
        annotation: &str,
        chassis: Option<&str>,
        csr: Option<&CsrFacts>,
    ) -> Verdict {
        let unverified = match peek_release(Some(annotation)) {
            Ok(u) => u,
            Err(v) => return v,
        };
        judge_release(
            &self.record,
            &self.ca.trust_bundle(),
            NodeFacts {
                name: "node-a",
                chassis,
            },
            unverified,
            csr,
            Some(&self.pod),
            ts(NOW),
        )
    }

    fn judge(&self, annotation: &str) -> Verdict {
        self.judge_with(annotation, Some("chassis-a"))
    }

    /// The verdict on a good receipt once `tweak` changed it (before it
    /// is signed).
    fn claiming(&self, tweak: impl FnOnce(&mut ReleaseReceipt)) -> Verdict {
        let mut r = self.receipt();
        tweak(&mut r);
        self.judge(&self.signed(&r))
    }
}

/// The check a good release receipt fails once `tweak` changed the live
/// facts.
fn release_after(tweak: fn(&mut Rel)) -> Verdict {
    let mut f = Rel::new();
    let good = f.signed(&f.receipt());
    tweak(&mut f);
    f.judge(&good)
}

fn message_of(v: &Verdict) -> &str {
    match v {
        Verdict::Refused { message, .. } => message,
        _ => "",
    }
}

#[test]
fn a_release_receipt_of_the_live_cleanup_pod_satisfies_release() {
    let f = Rel::new();
    assert_eq!(f.judge(&f.signed(&f.receipt())), Verdict::Satisfied);
    // The CSR was requested by the old agent Pod, not the cleanup Pod: the
    // requester is not compared for a release.
    assert_eq!(f.csr.requester_pod_uid.as_deref(), Some("pod-uid"));
}

#[test]
fn a_missing_malformed_or_challenge_less_release_receipt_is_not_one() {
    assert_eq!(peek_release(None).unwrap_err(), Verdict::Missing);
    let f = Rel::new();
    assert_eq!(check_of(&f.judge("garbage")), "ReleaseReceiptMalformed");
    assert_eq!(
        check_of(&f.judge(&"a".repeat(64 * 1024))),
        "ReleaseReceiptMalformed"
    );
    // The same payload without its challenge, properly signed under the
    // release domain, does not even decode.
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(transparent)]
    struct Raw(serde_json::Value);
    impl SignedPayload for Raw {
        const DOMAIN: &'static [u8] = kube_ovn_ipsec_api::coordination::RELEASE_RECEIPT_DOMAIN;
        const MAX_ENCODED_LEN: usize = 8192;
    }
    let mut raw = serde_json::to_value(f.receipt()).unwrap();
    raw.as_object_mut().unwrap().remove("challenge");
    let unchallenged = signed::sign(&Raw(raw), &f.leaf.signing_key()).unwrap();
    assert_eq!(check_of(&f.judge(&unchallenged)), "ReleaseReceiptMalformed");
    // A barrier receipt is no release receipt.
    let barrier = Fx::new();
    let receipt = barrier.signed(&barrier.receipt());
    assert_eq!(check_of(&f.judge(&receipt)), "ReleaseReceiptMalformed");
}

#[test]
fn a_release_receipt_signed_by_another_key_or_certificate_is_refused() {
    let f = Rel::new();
    let other = f.ca.leaf("chassis-a").key(TestKeyAlg::P256).issue();
    let forged = signed::sign(&f.receipt(), &other.signing_key()).unwrap();
    assert_eq!(
        check_of(&f.judge(&forged)),
        "ReleaseReceiptSignatureInvalid"
    );
    let good = f.signed(&f.receipt());
    assert_eq!(
        check_of(&f.judge_with(&good, Some("chassis-b"))),
        "ReleaseReceiptChassisMismatch"
    );
    let v = f.claiming(|r| r.status.certificate_digest = other.certificate.digest());
    assert_eq!(check_of(&v), "ReleaseReceiptCertificateMismatch");
    // The carried certificate is the signer: one from another CA is not
    // trusted, whatever key signed.
    let stranger = CaSpec::new("someone else").self_signed();
    let leaf = stranger.leaf("chassis-a").key(TestKeyAlg::P256).issue();
    let mut r = f.receipt();
    r.certificate = leaf.certificate.to_pem();
    r.status.certificate_digest = leaf.certificate.digest();
    let v = f.judge(&signed::sign(&r, &leaf.signing_key()).unwrap());
    assert_eq!(check_of(&v), "ReleaseReceiptCertificateUntrusted");
    // While the CSR exists, it must have issued that very certificate,
    // for this node.
    let v = release_after(|f| {
        let stranger = CaSpec::new("someone else").self_signed();
        let leaf = stranger.leaf("chassis-a").key(TestKeyAlg::P256).issue();
        f.csr.certificate_pem = Some(leaf.cert_pem().into_bytes());
    });
    assert_eq!(check_of(&v), "ReleaseReceiptCertificateMismatch");
    let v = release_after(|f| f.csr.uid = "another".into());
    assert_eq!(check_of(&v), "ReleaseReceiptCsrMismatch");
    let v = release_after(|f| f.csr.node_annotation = Some("node-b".into()));
    assert_eq!(check_of(&v), "ReleaseReceiptCsrMismatch");
    let v = release_after(|f| f.csr.certificate_pem = None);
    assert_eq!(check_of(&v), "ReleaseReceiptCertificateMismatch");
    let v = f.claiming(|r| r.node_name = "node-b".into());
    assert_eq!(check_of(&v), "ReleaseReceiptNodeMismatch");
}

#[test]
fn a_release_receipt_for_another_pod_than_the_live_cleanup_pod_is_refused() {
    let f = Rel::new();
    // The old agent Pod (gone), or any Pod that is not the live one here.
    let v = f.claiming(|r| r.pod_uid = uid("pod-uid"));
    assert_eq!(check_of(&v), "ReleaseReceiptPodNotLive");
    assert!(message_of(&v).contains("pod-uid"), "{v:?}");
    let v = release_after(|f| f.pod.pod.node_name = "node-b".into());
    assert_eq!(check_of(&v), "ReleaseReceiptPodNotLive");
    let v = release_after(|f| f.pod.pod.live = false);
    assert_eq!(check_of(&v), "ReleaseReceiptPodNotLive");
    let v = release_after(|f| f.pod.pod.owner_uid = Some("other-ds".into()));
    assert_eq!(check_of(&v), "ReleaseReceiptPodMismatch");
    // The agent's template, not the recorded cleanup one.
    let v = release_after(|f| f.pod.pod.template_hash = Some("h1".into()));
    assert_eq!(check_of(&v), "ReleaseReceiptTemplateMismatch");
}

#[test]
fn only_an_init_container_that_exited_zero_satisfies_release() {
    let v = release_after(|f| f.pod.cleanup_init = None);
    assert_eq!(check_of(&v), "ReleaseInitNotTerminated");
    let v = release_after(|f| f.pod.cleanup_init = Some(InitState::Running));
    assert_eq!(check_of(&v), "ReleaseInitNotTerminated");
    assert!(message_of(&v).contains("ipsec-cleanup is running"), "{v:?}");
    let v =
        release_after(|f| f.pod.cleanup_init = Some(InitState::Waiting("CrashLoopBackOff".into())));
    assert_eq!(check_of(&v), "ReleaseInitNotTerminated");
    assert!(message_of(&v).contains("CrashLoopBackOff"), "{v:?}");
    let v = release_after(|f| {
        f.pod.cleanup_init = Some(InitState::Terminated {
            exit_code: 1,
            reason: "Error: a foreign owner holds the lease's reqid".into(),
        })
    });
    assert_eq!(check_of(&v), "ReleaseInitFailed");
    assert!(
        message_of(&v).contains("exited with code 1: Error: a foreign owner"),
        "{v:?}"
    );
}

#[test]
fn a_release_receipt_for_another_epoch_challenge_node_or_template_is_refused() {
    let f = Rel::new();
    type Case = (fn(&mut ReleaseReceipt), &'static str);
    let cases: [Case; 9] = [
        (|r| r.epoch = 6, "ReleaseReceiptEpochMismatch"),
        (|r| r.generation = 1, "ReleaseReceiptEpochMismatch"),
        (
            |r| r.phase = CoordinationPhase::Cleanup,
            "ReleaseReceiptEpochMismatch",
        ),
        (
            |r| r.challenge = Challenge::from_bytes([4; 32]),
            "ReleaseReceiptChallengeMismatch",
        ),
        (|r| r.observed = ts(NOW + 60), "ReleaseReceiptInFuture"),
        (|r| r.status.drained = false, "ReleaseReceiptIncomplete"),
        (
            |r| r.status.guards_removed = false,
            "ReleaseReceiptIncomplete",
        ),
        (|r| r.node_uid = uid("node-a-old"), "ReleaseReceiptMismatch"),
        (|r| r.template_hash = "h1".into(), "ReleaseReceiptMismatch"),
    ];
    for (tweak, want) in cases {
        let v = f.claiming(tweak);
        assert_eq!(check_of(&v), want, "{v:?}");
    }
    // The record went back to Disabling (a new challenge): the receipt for
    // the old Release answers nothing.
    let mut f = Rel::new();
    let good = f.signed(&f.receipt());
    f.record = f
        .record
        .transition(
            CoordinationPhase::Disabling,
            Some(Challenge::from_bytes([5; 32])),
        )
        .unwrap();
    assert_eq!(check_of(&f.judge(&good)), "ReleaseReceiptEpochMismatch");
}

#[test]
fn a_release_receipt_verifies_after_its_csr_was_garbage_collected() {
    // kube-controller-manager deletes issued CSRs an hour after approval:
    // the certificate the receipt carries is the evidence then.
    let f = Rel::new();
    let good = f.signed(&f.receipt());
    assert_eq!(
        check_of(&f.judge_full(&good, Some("chassis-a"), None)),
        "Satisfied"
    );
    // Still only for this node's chassis.
    assert_eq!(
        check_of(&f.judge_full(&good, Some("chassis-b"), None)),
        "ReleaseReceiptChassisMismatch"
    );
}

#[test]
fn a_node_claims_state_from_an_enable_side_receipt_until_a_later_release() {
    let f = Fx::new(); // an Arm receipt of generation 1, epoch 2
    let rel = Rel::new(); // a release receipt of generation 2, epoch 7
    let me = uid("node-a-uid");
    let receipt = f.signed(&f.receipt());
    let release = rel.signed(&rel.receipt());
    assert!(claims_state(&me, Some(&receipt), None));
    assert!(claims_state(&me, Some(&receipt), Some("garbage")));
    // Released since: no claim.
    assert!(!claims_state(&me, Some(&receipt), Some(&release)));
    // A receipt after that release (the next enable): a claim again.
    let mut later = f.receipt();
    (later.generation, later.epoch) = (3, 8);
    assert!(claims_state(&me, Some(&f.signed(&later)), Some(&release)));
    // Another Node UID, no receipt, or garbage: no claim.
    assert!(!claims_state(&uid("other"), Some(&receipt), None));
    assert!(!claims_state(&me, None, None));
    assert!(!claims_state(&me, Some("garbage"), None));
}
