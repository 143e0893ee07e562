//! The enable side decision by decision.

use super::*;

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

fn ds(hash: &str) -> LiveDaemonSet {
    LiveDaemonSet {
        uid: uid("ds-uid-1"),
        template_hash: hash.into(),
    }
}

fn trust(b: u8) -> Sha256Digest {
    Sha256Digest::from_bytes([b; 32])
}

fn nodes(names: &[&str]) -> BTreeMap<String, Uid> {
    names
        .iter()
        .map(|n| ((*n).to_owned(), uid(&format!("uid-{n}"))))
        .collect()
}

fn observed(names: &[&str]) -> Observation {
    Observation {
        want_enabled: true,
        daemon_set: Some(ds("h1")),
        trust: Some(trust(1)),
        scheduled: nodes(names),
        receipts: BTreeMap::new(),
        admissions: BTreeMap::new(),
        retirements: BTreeMap::new(),
        nb_ipsec: Some(false),
        sb_ipsec: Some(false),
        fresh_challenge: Challenge::from_bytes([7; 32]),
    }
}

fn all(o: &mut Observation, v: Verdict) {
    o.receipts = o.scheduled.keys().map(|n| (n.clone(), v.clone())).collect();
}

fn written(d: Decision) -> CoordinationRecord {
    written_why(d).0
}

fn written_why(d: Decision) -> (CoordinationRecord, String) {
    match d {
        Decision::Write { record, why } => (*record, why),
        other => panic!("expected a write, got {other:?}"),
    }
}

fn waiting_of(d: Decision) -> BTreeMap<String, String> {
    match d {
        Decision::Hold { waiting, .. } => waiting,
        other => panic!("expected a hold, got {other:?}"),
    }
}

/// Disabled → Prepare → Arm: returns the Arm record.
fn armed(o: &mut Observation) -> CoordinationRecord {
    let prepare = written(decide(&CoordinationRecord::initial(), o).unwrap());
    all(o, Verdict::Satisfied);
    written(decide(&prepare, o).unwrap())
}

#[test]
fn disabled_and_not_wanted_is_idle() {
    let mut o = observed(&["a"]);
    o.want_enabled = false;
    assert_eq!(
        decide(&CoordinationRecord::initial(), &o).unwrap(),
        Decision::Idle
    );
}

#[test]
fn enable_freezes_the_cohort_in_prepare() {
    let o = observed(&["a", "b", "c"]);
    let r = written(decide(&CoordinationRecord::initial(), &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Prepare);
    assert_eq!((r.generation, r.epoch), (1, 1));
    assert_eq!(r.daemon_set_uid, Some(uid("ds-uid-1")));
    assert_eq!(r.template_hash.as_deref(), Some("h1"));
    assert_eq!(r.trust_hash, Some(trust(1)));
    assert_eq!(r.targets, nodes(&["a", "b", "c"]));
}

#[test]
fn enable_without_daemonset_trust_or_nodes_holds_with_the_reason() {
    let r = CoordinationRecord::initial();
    for (tweak, want) in [
        (
            Box::new(|o: &mut Observation| o.daemon_set = None) as Box<dyn Fn(&mut Observation)>,
            "DaemonSet does not exist",
        ),
        (
            Box::new(|o: &mut Observation| o.trust = None),
            "trust bundle",
        ),
        (
            Box::new(|o: &mut Observation| o.scheduled.clear()),
            "no node",
        ),
    ] {
        let mut o = observed(&["a"]);
        tweak(&mut o);
        match decide(&r, &o).unwrap() {
            Decision::Hold { reason, .. } => assert!(reason.contains(want), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_prepare_barrier_names_every_waiting_node_and_passes_only_when_all_satisfy() {
    let mut o = observed(&["a", "b", "c"]);
    let prepare = written(decide(&CoordinationRecord::initial(), &o).unwrap());
    o.receipts.insert("a".into(), Verdict::Satisfied);
    o.receipts.insert(
        "b".into(),
        Verdict::Refused {
            check: "ReceiptEpochMismatch",
            message: "epoch 0, record 1".into(),
        },
    );
    match decide(&prepare, &o).unwrap() {
        Decision::Hold { waiting, .. } => {
            assert_eq!(waiting.len(), 2, "{waiting:?}");
            assert!(waiting["b"].starts_with("ReceiptEpochMismatch"));
            assert_eq!(waiting["c"], "no receipt yet");
        }
        other => panic!("{other:?}"),
    }
    all(&mut o, Verdict::Satisfied);
    let arm = written(decide(&prepare, &o).unwrap());
    assert_eq!(arm.phase, CoordinationPhase::Arm);
    assert_eq!(arm.epoch, prepare.epoch + 1);
    assert_eq!(arm.targets, prepare.targets);
}

#[test]
fn nb_is_set_only_after_the_arm_barrier_and_enabled_only_after_nb_and_sb_read_true() {
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    // Armed barrier incomplete: no NB write.
    o.receipts.insert("b".into(), Verdict::Missing);
    assert!(matches!(decide(&arm, &o).unwrap(), Decision::Hold { .. }));
    all(&mut o, Verdict::Satisfied);
    assert_eq!(decide(&arm, &o).unwrap(), Decision::SetNb(true));
    // NB true, SB not yet: wait, no second NB write.
    o.nb_ipsec = Some(true);
    match decide(&arm, &o).unwrap() {
        Decision::Hold { reason, .. } => assert!(reason.contains("SB_Global"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Unreadable NB: hold, never write blind.
    o.nb_ipsec = None;
    assert!(matches!(decide(&arm, &o).unwrap(), Decision::Hold { .. }));
    o.nb_ipsec = Some(true);
    o.sb_ipsec = Some(true);
    let enabled = written(decide(&arm, &o).unwrap());
    assert_eq!(enabled.phase, CoordinationPhase::Enabled);
    assert_eq!(enabled.epoch, arm.epoch + 1);
    assert_eq!(decide(&enabled, &o).unwrap(), Decision::Idle);
}

#[test]
fn a_template_trust_or_daemonset_change_restarts_from_prepare() {
    for tweak in [
        Box::new(|o: &mut Observation| o.daemon_set = Some(ds("h2")))
            as Box<dyn Fn(&mut Observation)>,
        Box::new(|o: &mut Observation| o.trust = Some(trust(2))),
        Box::new(|o: &mut Observation| {
            o.daemon_set = Some(LiveDaemonSet {
                uid: uid("ds-uid-2"),
                template_hash: "h1".into(),
            })
        }),
    ] {
        let mut o = observed(&["a"]);
        let arm = armed(&mut o);
        tweak(&mut o);
        let r = written(decide(&arm, &o).unwrap());
        assert_eq!(r.phase, CoordinationPhase::Prepare);
        assert_eq!(r.epoch, arm.epoch + 1);
        assert_eq!(r.generation, arm.generation, "same cycle");
        assert_eq!(
            r.template_hash.as_deref(),
            Some(o.daemon_set.as_ref().unwrap().template_hash.as_str())
        );
        assert_eq!(r.trust_hash, o.trust);
    }
}

#[test]
fn nodes_joining_or_leaving_mid_barrier_refreeze_the_cohort() {
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    o.scheduled = nodes(&["a", "c"]);
    let r = written(decide(&arm, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Prepare);
    assert_eq!(r.targets, nodes(&["a", "c"]));
}

#[test]
fn a_recreated_node_holds_the_barrier_until_retired() {
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-recreated"));
    match decide(&arm, &o).unwrap() {
        Decision::Hold { waiting, .. } => {
            assert!(waiting["b"].starts_with("NodeUIDChanged"), "{waiting:?}");
            assert!(!waiting.contains_key("a"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn disable_wanted_during_or_after_enable_starts_disabling_with_the_challenge() {
    let mut o = observed(&["a"]);
    let arm = armed(&mut o);
    o.want_enabled = false;
    let r = written(decide(&arm, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Disabling);
    assert_eq!(r.challenge, Some(o.fresh_challenge));
    assert_eq!(r.generation, arm.generation + 1);
}

#[test]
fn enabled_turns_a_switch_turned_off_by_hand_back_on() {
    let mut o = observed(&["a"]);
    let arm = armed(&mut o);
    o.nb_ipsec = Some(true);
    o.sb_ipsec = Some(true);
    let enabled = written(decide(&arm, &o).unwrap());
    o.nb_ipsec = Some(false);
    assert_eq!(decide(&enabled, &o).unwrap(), Decision::SetNb(true));
}

/// Disabled → Prepare → Arm → NB → Enabled over `names`: returns the
/// Enabled record, with `o` observing NB and SB true.
fn enabled(o: &mut Observation) -> CoordinationRecord {
    let arm = armed(o);
    o.nb_ipsec = Some(true);
    o.sb_ipsec = Some(true);
    let r = written(decide(&arm, o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Enabled);
    o.receipts.clear();
    r
}

#[test]
fn after_the_nb_flip_a_joiner_does_not_refreeze_and_the_frozen_cohort_finishes() {
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    o.nb_ipsec = Some(true);
    o.scheduled = nodes(&["a", "b", "c"]);
    // SB not yet true: hold, with the joiner told why it waits.
    let waiting = waiting_of(decide(&arm, &o).unwrap());
    assert!(waiting.is_empty(), "{waiting:?}");
    let st = node_status(&arm, &arm, &o);
    assert!(
        st["c"].contains("joins once the cohort is Enabled"),
        "{st:?}"
    );
    o.sb_ipsec = Some(true);
    let r = written(decide(&arm, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Enabled);
    assert_eq!(r.targets, nodes(&["a", "b"]), "the frozen cohort");
    // NB unreadable is not "false": no re-freeze that takes the joiner in.
    o.nb_ipsec = None;
    assert!(matches!(decide(&arm, &o).unwrap(), Decision::Hold { .. }));
}

#[test]
fn while_nb_may_be_on_a_restart_keeps_the_frozen_targets_and_drops_leavers() {
    for nb in [Some(true), None] {
        let mut o = observed(&["a", "b", "c"]);
        let arm = armed(&mut o);
        o.nb_ipsec = nb;
        o.scheduled = nodes(&["a", "b", "d"]);
        let (r, why) = written_why(decide(&arm, &o).unwrap());
        assert_eq!(r.phase, CoordinationPhase::Prepare);
        assert_eq!(r.targets, nodes(&["a", "b"]), "{nb:?}: c left, d waits");
        assert!(why.contains("left: c"), "{why}");
        // A trust change in the re-frozen Prepare, NB still on: the same
        // cohort again, d still out.
        o.trust = Some(trust(2));
        let r2 = written(decide(&r, &o).unwrap());
        assert_eq!(r2.targets, nodes(&["a", "b"]));
        assert_eq!(r2.trust_hash, Some(trust(2)));
    }
}

#[test]
fn enabled_admits_a_joiner_on_its_arm_receipt_with_a_new_epoch() {
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled = nodes(&["a", "b", "c"]);
    for v in [
        None,
        Some(Verdict::Refused {
            check: "ReceiptNotReady",
            message: "prepared for admission".into(),
        }),
    ] {
        o.admissions = v.iter().map(|v| ("c".to_owned(), v.clone())).collect();
        let waiting = waiting_of(decide(&en, &o).unwrap());
        assert!(waiting["c"].starts_with("admission: "), "{waiting:?}");
        let st = node_status(&en, &en, &o);
        assert_eq!(st["a"], "ok");
        assert_eq!(st["c"], waiting["c"]);
    }
    o.admissions.insert("c".into(), Verdict::Satisfied);
    let (r, why) = written_why(decide(&en, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Enabled);
    assert_eq!((r.generation, r.epoch), (en.generation, en.epoch + 1));
    assert_eq!(r.targets, nodes(&["a", "b", "c"]));
    assert!(why.contains("admitted c"), "{why}");
    // The new epoch has no verdict yet for anyone; then nothing to do.
    o.admissions.clear();
    assert_eq!(decide(&r, &o).unwrap(), Decision::Idle);
}

#[test]
fn enabled_keeps_nb_on_before_anything_else() {
    let mut o = observed(&["a"]);
    let en = enabled(&mut o);
    o.scheduled = nodes(&["a", "b"]);
    o.admissions.insert("b".into(), Verdict::Satisfied);
    o.nb_ipsec = Some(false);
    assert_eq!(decide(&en, &o).unwrap(), Decision::SetNb(true));
}

#[test]
fn enabled_drops_a_target_that_left_with_a_new_epoch() {
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled = nodes(&["a"]);
    let (r, why) = written_why(decide(&en, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Enabled);
    assert_eq!(r.epoch, en.epoch + 1);
    assert_eq!(r.targets, nodes(&["a"]));
    assert!(why.contains("dropped b"), "{why}");
}

#[test]
fn enabled_follows_the_live_trust_template_and_daemonset_for_admissions() {
    for tweak in [
        Box::new(|o: &mut Observation| o.daemon_set = Some(ds("h2")))
            as Box<dyn Fn(&mut Observation)>,
        Box::new(|o: &mut Observation| o.trust = Some(trust(2))),
        Box::new(|o: &mut Observation| {
            o.daemon_set = Some(LiveDaemonSet {
                uid: uid("ds-uid-2"),
                template_hash: "h1".into(),
            })
        }),
    ] {
        let mut o = observed(&["a", "b"]);
        let en = enabled(&mut o);
        tweak(&mut o);
        let r = written(decide(&en, &o).unwrap());
        assert_eq!(r.phase, CoordinationPhase::Enabled);
        assert_eq!((r.generation, r.epoch), (en.generation, en.epoch + 1));
        assert_eq!(r.targets, en.targets, "no one is dropped or re-judged");
        let live = o.daemon_set.as_ref().unwrap();
        assert_eq!(r.daemon_set_uid.as_ref(), Some(&live.uid));
        assert_eq!(
            r.template_hash.as_deref(),
            Some(live.template_hash.as_str())
        );
        assert_eq!(r.trust_hash, o.trust);
        assert_eq!(decide(&r, &o).unwrap(), Decision::Idle);
    }
}

#[test]
fn a_recreated_target_while_enabled_is_reported_not_dropped_or_readmitted() {
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    let waiting = waiting_of(decide(&en, &o).unwrap());
    assert!(waiting["b"].starts_with("NodeUIDChanged"), "{waiting:?}");
    assert!(
        waiting["b"].contains("retire-node b --uid uid-b"),
        "{waiting:?}"
    );
    assert!(node_status(&en, &en, &o)["b"].starts_with("NodeUIDChanged"));
}

#[test]
fn a_retirement_of_the_frozen_uid_removes_the_target_and_the_node_rejoins() {
    // Before the flip: a restart from Prepare that takes the new Node in.
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    o.retirements.insert("b".into(), uid("uid-b"));
    let (r, why) = written_why(decide(&arm, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Prepare);
    assert_eq!(r.targets["b"], uid("uid-b-2"));
    assert!(why.contains("retired b"), "{why}");
    assert_eq!(retirements_done(&arm, &r, &o.retirements), vec!["b"]);

    // After the flip: the restart leaves the new Node to admission.
    o.nb_ipsec = Some(true);
    let r = written(decide(&arm, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Prepare);
    assert_eq!(r.targets, nodes(&["a"]));

    // Enabled: a new epoch without it, then it is a joiner.
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    o.retirements.insert("b".into(), uid("uid-b"));
    let (r, why) = written_why(decide(&en, &o).unwrap());
    assert_eq!(
        (r.phase, r.epoch),
        (CoordinationPhase::Enabled, en.epoch + 1)
    );
    assert_eq!(r.targets, nodes(&["a"]));
    assert!(why.contains("retired b"), "{why}");
    assert_eq!(retirements_done(&en, &r, &o.retirements), vec!["b"]);
    o.retirements.clear();
    o.admissions.insert("b".into(), Verdict::Satisfied);
    let r2 = written(decide(&r, &o).unwrap());
    assert_eq!(r2.targets["b"], uid("uid-b-2"));
}

#[test]
fn a_retirement_naming_another_uid_is_refused_with_the_reason() {
    let mut o = observed(&["a", "b"]);
    let arm = armed(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    o.retirements.insert("b".into(), uid("uid-b-2"));
    o.retirements.insert("z".into(), uid("uid-z"));
    let waiting = waiting_of(decide(&arm, &o).unwrap());
    assert!(waiting["b"].starts_with("NodeUIDChanged"), "{waiting:?}");
    assert!(waiting["b"].contains("RetireRefused"), "{waiting:?}");
    assert!(waiting["z"].starts_with("RetireRefused"), "{waiting:?}");
    let st = node_status(&arm, &arm, &o);
    assert!(st["b"].contains("RetireRefused"), "{st:?}");
    assert!(st["z"].contains("not a target"), "{st:?}");
    // Nothing carried out, nothing consumed.
    assert!(retirements_done(&arm, &arm, &o.retirements).is_empty());
}

#[test]
fn retiring_one_node_does_not_readmit_another_recreated_one() {
    let mut o = observed(&["a", "b", "c"]);
    let arm = armed(&mut o);
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    o.scheduled.insert("c".into(), uid("uid-c-2"));
    o.retirements.insert("b".into(), uid("uid-b"));
    let r = written(decide(&arm, &o).unwrap());
    assert_eq!(r.targets["b"], uid("uid-b-2"));
    assert_eq!(
        r.targets["c"],
        uid("uid-c"),
        "c still needs its own retirement"
    );
    let waiting = waiting_of(decide(&r, &o).unwrap());
    assert!(waiting["c"].starts_with("NodeUIDChanged"), "{waiting:?}");
}

#[test]
fn status_after_a_write_has_no_verdict_for_the_new_epoch() {
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled = nodes(&["a", "b", "c", "d"]);
    o.admissions.insert("c".into(), Verdict::Satisfied);
    o.admissions.insert(
        "d".into(),
        Verdict::Refused {
            check: "ReceiptSignatureInvalid",
            message: "x".into(),
        },
    );
    let r = written(decide(&en, &o).unwrap());
    let st = node_status(&en, &r, &o);
    assert_eq!(st["c"], "ok");
    assert_eq!(st["d"], "admission: no receipt yet");
}
