use super::*;
use crate::test_util::{p256_leaf, rsa_leaf};
use crate::{signed, test_util};
use proptest::prelude::*;

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_unix(secs).unwrap()
}

fn arm_record() -> CoordinationRecord {
    let mut r = CoordinationRecord::initial();
    r.generation = 3;
    r.epoch = 7;
    r.phase = CoordinationPhase::Arm;
    r.daemon_set_uid = Some(uid("ds-uid"));
    r.template_hash = Some("7d9f8b6c5".into());
    r.trust_hash = Some(Sha256Digest::of(b"trust"));
    r.targets.insert("node-a".into(), uid("node-a-uid"));
    r.targets.insert("node-b".into(), uid("node-b-uid"));
    r
}

fn receipt_for(record: &CoordinationRecord, observed: Timestamp) -> Receipt {
    Receipt {
        generation: record.generation,
        epoch: record.epoch,
        phase: record.phase,
        node_name: "node-a".into(),
        node_uid: uid("node-a-uid"),
        pod_uid: uid("pod-uid"),
        csr_name: "ovn-ipsec-0123456789abcdef0123456789abcdef".into(),
        csr_uid: uid("csr-uid"),
        template_hash: record.template_hash.clone().unwrap(),
        trust_hash: record.trust_hash.unwrap(),
        observed,
        status: test_util::ready_status(rsa_leaf().certificate.digest()),
    }
}

#[test]
fn transition_table_is_exactly_the_spec() {
    use CoordinationPhase::*;
    let allowed = [
        (Disabled, Prepare),
        (Prepare, Prepare),
        (Prepare, Arm),
        (Prepare, Disabling),
        (Arm, Prepare),
        (Arm, Enabled),
        (Arm, Disabling),
        (Enabled, Disabling),
        (Disabling, Disabling),
        (Disabling, Cleanup),
        (Disabling, Prepare),
        (Cleanup, Release),
        (Cleanup, Disabling),
        (Cleanup, Prepare),
        (Release, Disabled),
        (Release, Disabling),
        (Release, Prepare),
    ];
    for from in CoordinationPhase::ALL {
        for to in CoordinationPhase::ALL {
            assert_eq!(
                from.can_transition_to(to),
                allowed.contains(&(from, to)),
                "{from} -> {to}"
            );
            assert_eq!(
                check_transition(from, to).is_ok(),
                allowed.contains(&(from, to))
            );
        }
    }
}

#[test]
fn transition_bookkeeping() {
    let c1 = Challenge::from_bytes([1; 32]);
    let c2 = Challenge::from_bytes([2; 32]);
    let r0 = CoordinationRecord::initial();
    let r1 = r0.transition(CoordinationPhase::Prepare, None).unwrap();
    assert_eq!((r1.generation, r1.epoch), (1, 1));
    assert!(r1.transition(CoordinationPhase::Enabled, None).is_err());
    let r2 = r1.transition(CoordinationPhase::Arm, None).unwrap();
    assert_eq!((r2.generation, r2.epoch), (1, 2));
    assert!(r2.transition(CoordinationPhase::Disabling, None).is_err());
    assert!(r2.transition(CoordinationPhase::Enabled, Some(c1)).is_err());
    let r3 = r2
        .transition(CoordinationPhase::Disabling, Some(c1))
        .unwrap();
    assert_eq!((r3.generation, r3.epoch, r3.challenge), (2, 3, Some(c1)));
    // Re-entering Disabling needs a fresh challenge.
    assert!(
        r3.transition(CoordinationPhase::Disabling, Some(c1))
            .is_err()
    );
    let r4 = r3
        .transition(CoordinationPhase::Disabling, Some(c2))
        .unwrap();
    assert_eq!((r4.generation, r4.epoch, r4.challenge), (2, 4, Some(c2)));
    let r5 = r4.transition(CoordinationPhase::Cleanup, None).unwrap();
    assert_eq!(r5.challenge, Some(c2));
    // Re-enabled before the disable finished: a new cycle, no challenge.
    let again = r5.transition(CoordinationPhase::Prepare, None).unwrap();
    assert_eq!((again.generation, again.challenge), (3, None));
    let r6 = r5
        .transition(CoordinationPhase::Release, None)
        .unwrap()
        .transition(CoordinationPhase::Disabled, None)
        .unwrap();
    let r7 = r6.transition(CoordinationPhase::Prepare, None).unwrap();
    assert_eq!((r7.generation, r7.challenge), (3, None));
}

#[test]
fn record_validation_per_phase() {
    let mut r = arm_record();
    assert!(r.encode().is_ok());
    r.trust_hash = None;
    assert!(r.encode().is_err());
    let mut r = arm_record();
    r.phase = CoordinationPhase::Cleanup;
    assert!(r.validate().is_err(), "needs challenge and row UUIDs");
    r.challenge = Some(Challenge::from_bytes([9; 32]));
    assert!(r.validate().is_err(), "needs row UUIDs");
    r.nb_global_uuid = Some(Uuid::from_bytes([1; 16]));
    r.sb_global_uuid = Some(Uuid::from_bytes([2; 16]));
    assert!(r.validate().is_ok());
}

#[test]
fn record_wire_names_and_decode_errors() {
    let mut r = arm_record();
    r.nb_global_uuid = Some(Uuid::from_bytes([1; 16]));
    let text = r.encode().unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "challenge",
            "daemonSetUID",
            "epoch",
            "generation",
            "nbGlobalUUID",
            "phase",
            "sbGlobalUUID",
            "targets",
            "templateHash",
            "trustHash",
            "version"
        ]
    );
    assert_eq!(v["targets"]["node-a"], "node-a-uid");
    assert_eq!(CoordinationRecord::decode(text.as_bytes()).unwrap(), r);

    let mut v2 = v.clone();
    v2["version"] = 2.into();
    assert!(matches!(
        CoordinationRecord::decode(v2.to_string().as_bytes()),
        Err(Error::UnsupportedVersion { found: 2, .. })
    ));
    let mut v3 = v.clone();
    v3["extra"] = 1.into();
    assert!(matches!(
        CoordinationRecord::decode(v3.to_string().as_bytes()),
        Err(Error::InvalidDocument { .. })
    ));
    let big = vec![b' '; defaults::COORDINATION_MAX_BYTES + 1];
    assert!(matches!(
        CoordinationRecord::decode(&big),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn receipt_checks() {
    let record = arm_record();
    let now = ts(1_700_000_000);
    let good = receipt_for(&record, now.plus_secs(-30));
    good.check_against(&record, now).unwrap();

    type Mutation = Box<dyn Fn(&mut Receipt)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("generation", Box::new(|r| r.generation += 1)),
        ("epoch", Box::new(|r| r.epoch -= 1)),
        ("phase", Box::new(|r| r.phase = CoordinationPhase::Prepare)),
        ("nodeName", Box::new(|r| r.node_name = "node-z".into())),
        ("nodeUID", Box::new(|r| r.node_uid = uid("other"))),
        (
            "templateHash",
            Box::new(|r| r.template_hash = "other".into()),
        ),
        (
            "trustHash",
            Box::new(|r| r.trust_hash = Sha256Digest::of(b"x")),
        ),
        ("status", Box::new(|r| r.status.protection_armed = false)),
    ];
    for (field, mutate) in cases {
        let mut r = good.clone();
        mutate(&mut r);
        assert_eq!(
            r.check_against(&record, now),
            Err(Error::ReceiptMismatch { field }),
            "{field}"
        );
    }
    // Prepare barrier needs only identity + capability.
    let mut prep = record.clone();
    prep.phase = CoordinationPhase::Prepare;
    let mut r = receipt_for(&prep, now);
    r.status.protection_armed = false;
    r.status.runtime_healthy = false;
    r.check_against(&prep, now).unwrap();
    r.status.capability_verified = false;
    assert!(r.check_against(&prep, now).is_err());

    // Freshness: 120 s ok, 121 s stale, 1 s in the future rejected.
    receipt_for(&record, now.plus_secs(-120))
        .check_against(&record, now)
        .unwrap();
    assert!(matches!(
        receipt_for(&record, now.plus_secs(-121)).check_against(&record, now),
        Err(Error::ReceiptNotFresh { .. })
    ));
    assert!(matches!(
        receipt_for(&record, now.plus_secs(1)).check_against(&record, now),
        Err(Error::ReceiptNotFresh { .. })
    ));
}

fn release_record() -> CoordinationRecord {
    let mut r = arm_record();
    r.phase = CoordinationPhase::Release;
    r.challenge = Some(Challenge::from_bytes([5; 32]));
    r.nb_global_uuid = Some(Uuid::from_bytes([1; 16]));
    r.sb_global_uuid = Some(Uuid::from_bytes([2; 16]));
    r
}

fn release_for(record: &CoordinationRecord, observed: Timestamp) -> ReleaseReceipt {
    ReleaseReceipt {
        generation: record.generation,
        epoch: record.epoch,
        phase: record.phase,
        node_name: "node-b".into(),
        node_uid: uid("node-b-uid"),
        pod_uid: uid("cleanup-pod"),
        csr_name: "ovn-ipsec-aa".into(),
        csr_uid: uid("csr"),
        template_hash: record.template_hash.clone().unwrap(),
        trust_hash: Sha256Digest::of(b"rotated since"),
        observed,
        challenge: record.challenge.unwrap(),
        status: ReleaseStatus {
            lease_withdrawn: true,
            guards_removed: true,
            identity_cleared: true,
            drained: true,
            boot_id: Uuid::from_bytes([3; 16]),
            certificate_digest: p256_leaf().certificate.digest(),
        },
        certificate: p256_leaf().certificate.to_pem(),
    }
}

#[test]
fn release_receipt_checks() {
    let record = release_record();
    let now = ts(1_700_000_000);
    // An hour-old release receipt is still good: bound by epoch/challenge.
    let good = release_for(&record, now.plus_secs(-3600));
    good.check_against(&record, now).unwrap();
    let mut r = good.clone();
    r.challenge = Challenge::from_bytes([6; 32]);
    assert_eq!(
        r.check_against(&record, now),
        Err(Error::ReceiptMismatch { field: "challenge" })
    );
    let mut r = good.clone();
    r.status.drained = false;
    assert!(r.check_against(&record, now).is_err());
    assert!(
        release_for(&record, now.plus_secs(5))
            .check_against(&record, now)
            .is_err()
    );
    let mut arm = record.clone();
    arm.phase = CoordinationPhase::Disabling;
    assert!(release_for(&arm, now).check_against(&arm, now).is_err());
}

#[test]
fn receipts_sign_and_verify_rsa_and_p256() {
    let record = arm_record();
    let r = receipt_for(&record, ts(1_700_000_000));
    for leaf in [test_util::rsa_leaf(), test_util::p256_leaf()] {
        let s = signed::sign(&r, &leaf.signing_key()).unwrap();
        assert!(s.len() <= defaults::RECEIPT_MAX_BYTES);
        assert_eq!(signed::verify::<Receipt>(&s, &leaf.certificate).unwrap(), r);
    }
    let rel = release_for(&release_record(), ts(1_700_000_000));
    let leaf = test_util::p256_leaf();
    let s = signed::sign(&rel, &leaf.signing_key()).unwrap();
    assert_eq!(
        signed::verify::<ReleaseReceipt>(&s, &leaf.certificate).unwrap(),
        rel
    );
}

#[test]
fn oversized_receipt_is_refused_on_sign_and_decode() {
    let mut r = receipt_for(&arm_record(), ts(1_700_000_000));
    r.template_hash = "x".repeat(defaults::RECEIPT_MAX_BYTES);
    let key = p256_leaf().signing_key();
    assert!(matches!(
        signed::sign(&r, &key),
        Err(Error::TooLarge { .. })
    ));
    let huge = "a".repeat(defaults::RECEIPT_MAX_BYTES + 1);
    assert!(matches!(
        signed::decode::<Receipt>(&huge),
        Err(Error::TooLarge { .. })
    ));
}

// ---- property tests ----

fn arb_uid() -> impl Strategy<Value = Uid> {
    "[a-zA-Z0-9-]{1,40}".prop_map(|s| Uid::new(s).unwrap())
}

fn arb_digest() -> impl Strategy<Value = Sha256Digest> {
    any::<[u8; 32]>().prop_map(Sha256Digest::from_bytes)
}

fn arb_ts() -> impl Strategy<Value = Timestamp> {
    (0i64..4_000_000_000).prop_map(|s| Timestamp::from_unix(s).unwrap())
}

fn arb_phase() -> impl Strategy<Value = CoordinationPhase> {
    prop::sample::select(CoordinationPhase::ALL.to_vec())
}

fn arb_u53() -> impl Strategy<Value = u64> {
    0..=crate::canonical::MAX_SAFE_INTEGER
}

prop_compose! {
    fn arb_receipt()(
        generation in arb_u53(), epoch in arb_u53(), phase in arb_phase(),
        node_name in "[a-z0-9.-]{1,40}", node_uid in arb_uid(), pod_uid in arb_uid(),
        csr_name in any::<String>(), csr_uid in arb_uid(), template_hash in ".{0,20}",
        trust_hash in arb_digest(), observed in arb_ts(),
        flags in any::<[bool; 5]>(), certificate_digest in arb_digest(),
    ) -> Receipt {
        Receipt {
            generation, epoch, phase, node_name, node_uid, pod_uid, csr_name, csr_uid,
            template_hash, trust_hash, observed,
            status: ReceiptStatus {
                identity_ready: flags[0], capability_verified: flags[1],
                protection_armed: flags[2], configuration_applied: flags[3],
                runtime_healthy: flags[4], certificate_digest,
            },
        }
    }
}

prop_compose! {
    fn arb_release()(
        base in arb_receipt(), challenge in any::<[u8; 32]>(), flags in any::<[bool; 4]>(),
        boot in any::<[u8; 16]>(),
    ) -> ReleaseReceipt {
        ReleaseReceipt {
            generation: base.generation, epoch: base.epoch, phase: base.phase,
            node_name: base.node_name, node_uid: base.node_uid, pod_uid: base.pod_uid,
            csr_name: base.csr_name, csr_uid: base.csr_uid, template_hash: base.template_hash,
            trust_hash: base.trust_hash, observed: base.observed,
            challenge: Challenge::from_bytes(challenge),
            status: ReleaseStatus {
                lease_withdrawn: flags[0], guards_removed: flags[1], identity_cleared: flags[2],
                drained: flags[3], boot_id: Uuid::from_bytes(boot),
                certificate_digest: base.status.certificate_digest,
            },
            certificate: String::new(),
        }
    }
}

prop_compose! {
    fn arb_record()(
        generation in arb_u53(), epoch in arb_u53(), phase in arb_phase(),
        ds in arb_uid(), template_hash in ".{0,20}", trust in arb_digest(),
        targets in prop::collection::btree_map("[a-z0-9.-]{1,20}", arb_uid(), 0..8),
        challenge in any::<[u8; 32]>(), nb in any::<[u8; 16]>(), sb in any::<[u8; 16]>(),
    ) -> CoordinationRecord {
        // Fill every field so each phase's invariants hold.
        CoordinationRecord {
            version: COORDINATION_VERSION, generation, epoch, phase,
            daemon_set_uid: Some(ds), template_hash: Some(template_hash),
            trust_hash: Some(trust), targets,
            challenge: Some(Challenge::from_bytes(challenge)),
            nb_global_uuid: Some(Uuid::from_bytes(nb)), sb_global_uuid: Some(Uuid::from_bytes(sb)),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn record_round_trip(r in arb_record()) {
        let text = r.encode().unwrap();
        prop_assert_eq!(CoordinationRecord::decode(text.as_bytes()).unwrap(), r);
    }

    #[test]
    fn receipt_canonical_round_trip(r in arb_receipt()) {
        let bytes = crate::canonical::to_canonical_vec(&r).unwrap();
        let back: Receipt = crate::canonical::from_canonical_slice(&bytes).unwrap();
        prop_assert_eq!(back, r);
    }

    #[test]
    fn release_canonical_round_trip(r in arb_release()) {
        let bytes = crate::canonical::to_canonical_vec(&r).unwrap();
        let back: ReleaseReceipt = crate::canonical::from_canonical_slice(&bytes).unwrap();
        prop_assert_eq!(back, r);
    }

    #[test]
    fn record_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = CoordinationRecord::decode(&bytes);
    }

    #[test]
    fn transition_never_yields_a_disallowed_phase(r in arb_record(), to in arb_phase(), c in any::<[u8; 32]>()) {
        let challenge = (to == CoordinationPhase::Disabling).then(|| Challenge::from_bytes(c));
        match r.transition(to, challenge) {
            Ok(next) => {
                prop_assert!(r.phase.can_transition_to(to));
                prop_assert_eq!(next.epoch, r.epoch + 1);
                prop_assert_eq!(next.phase, to);
            }
            Err(_) => prop_assert!(
                !r.phase.can_transition_to(to) || r.challenge == challenge
            ),
        }
    }
}

proptest! {
    // Signing is the slow part in debug builds (RSA at -O0); fewer cases.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn signed_receipt_round_trip(r in arb_receipt(), rsa in any::<bool>()) {
        let leaf = if rsa { test_util::rsa_leaf() } else { test_util::p256_leaf() };
        let s = signed::sign(&r, &leaf.signing_key()).unwrap();
        prop_assert_eq!(signed::verify::<Receipt>(&s, &leaf.certificate).unwrap(), r);
    }

    #[test]
    fn signed_release_round_trip(r in arb_release(), rsa in any::<bool>()) {
        let leaf = if rsa { test_util::rsa_leaf() } else { test_util::p256_leaf() };
        let s = signed::sign(&r, &leaf.signing_key()).unwrap();
        prop_assert_eq!(signed::verify::<ReleaseReceipt>(&s, &leaf.certificate).unwrap(), r);
    }
}
