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
        nb_ipsec: Some(false),
        sb_ipsec: Some(false),
        fresh_challenge: Challenge::from_bytes([7; 32]),
    }
}

fn all(o: &mut Observation, v: Verdict) {
    o.receipts = o.scheduled.keys().map(|n| (n.clone(), v.clone())).collect();
}

fn written(d: Decision) -> CoordinationRecord {
    match d {
        Decision::Write { record, .. } => *record,
        other => panic!("expected a write, got {other:?}"),
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
