//! The decision, branch by branch: the enable side, then the disable
//! side.

use super::*;

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

fn ds(hash: &str) -> LiveDaemonSet {
    LiveDaemonSet {
        uid: uid("ds-uid-1"),
        template_hash: hash.into(),
        cleanup_shape: false,
    }
}

const NB_ROW: Uuid = Uuid::from_u128(0x4e42);
const SB_ROW: Uuid = Uuid::from_u128(0x5342);

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
        nodes: nodes(names),
        receipts: BTreeMap::new(),
        admissions: BTreeMap::new(),
        retirements: BTreeMap::new(),
        nb_ipsec: Some(false),
        sb_ipsec: Some(false),
        nb_global_uuid: Some(NB_ROW),
        sb_global_uuid: Some(SB_ROW),
        releases: BTreeMap::new(),
        claimants: BTreeMap::new(),
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
                ..ds("h1")
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
    o.nodes = nodes(&["a", "b", "c"]);
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
fn enabled_keeps_a_target_without_a_pod_and_drops_it_when_its_node_is_gone() {
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    // A rollout's gap, or a DaemonSet that no longer selects b: b still
    // holds its guards, so it stays a target (the next disable asks it).
    o.scheduled = nodes(&["a"]);
    assert_eq!(decide(&en, &o).unwrap(), Decision::Idle);
    let st = node_status(&en, &en, &o);
    assert!(
        st["b"].starts_with("ok; the DaemonSet has no Pod"),
        "{st:?}"
    );
    o.nodes = nodes(&["a"]);
    let (r, why) = written_why(decide(&en, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Enabled);
    assert_eq!(r.epoch, en.epoch + 1);
    assert_eq!(r.targets, nodes(&["a"]));
    assert!(why.contains("dropped b: the Node is gone"), "{why}");
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
                ..ds("h1")
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

// ---- The disable side ----

fn challenge(b: u8) -> Challenge {
    Challenge::from_bytes([b; 32])
}

/// The chart's DaemonSet with IPsec disabled: template `c1`, the
/// `ipsec-cleanup` init container and no `ipsec` container.
fn cleanup_ds() -> LiveDaemonSet {
    LiveDaemonSet {
        cleanup_shape: true,
        ..ds("c1")
    }
}

fn hold_reason(d: Decision) -> String {
    match d {
        Decision::Hold { reason, .. } => reason,
        other => panic!("expected a hold, got {other:?}"),
    }
}

/// Enabled over `names`, then intent off: the `Disabling` record (challenge
/// 1), with `o` still observing NB and SB true and the enable-shape
/// DaemonSet.
fn disabling_over(names: &[&str], o: &mut Observation) -> CoordinationRecord {
    *o = observed(names);
    let en = enabled(o);
    o.want_enabled = false;
    o.fresh_challenge = challenge(1);
    let r = written(decide(&en, o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Disabling);
    assert_eq!(r.challenge, Some(challenge(1)));
    o.fresh_challenge = challenge(2);
    r
}

/// ... then NB and SB off and the DaemonSet in the cleanup shape: the
/// `Cleanup` record.
fn cleanup_over(names: &[&str], o: &mut Observation) -> CoordinationRecord {
    let d = disabling_over(names, o);
    o.nb_ipsec = Some(false);
    o.sb_ipsec = Some(false);
    o.daemon_set = Some(cleanup_ds());
    let r = written(decide(&d, o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Cleanup);
    r
}

/// ... then the next pass: the `Release` record.
fn release_over(names: &[&str], o: &mut Observation) -> CoordinationRecord {
    let c = cleanup_over(names, o);
    let r = written(decide(&c, o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Release);
    r
}

fn refused(check: &'static str) -> Verdict {
    Verdict::Refused {
        check,
        message: "found".into(),
    }
}

#[test]
fn disabling_turns_nb_off_first_and_waits_for_sb_and_readable_reads() {
    let mut o = observed(&[]);
    let d = disabling_over(&["a", "b"], &mut o);
    o.daemon_set = Some(cleanup_ds());
    // NB still on: the one thing to do, whatever else is observed.
    assert_eq!(decide(&d, &o).unwrap(), Decision::SetNb(false));
    o.nb_ipsec = None;
    o.nb_global_uuid = None;
    assert!(hold_reason(decide(&d, &o).unwrap()).contains("NB_Global is not readable"));
    o.nb_ipsec = Some(false);
    o.nb_global_uuid = Some(NB_ROW);
    // NB off, SB still on (northd has not synced yet), or unreadable.
    let why = hold_reason(decide(&d, &o).unwrap());
    assert!(
        why.contains("SB_Global.ipsec") && why.contains("reads true"),
        "{why}"
    );
    o.sb_ipsec = None;
    o.sb_global_uuid = None;
    let why = hold_reason(decide(&d, &o).unwrap());
    assert!(why.contains("not readable"), "{why}");
    let st = node_status(&d, &d, &o);
    assert_eq!(st["a"], "release pending: the cohort is Disabling");
}

#[test]
fn cleanup_is_recorded_only_with_nb_and_sb_off_and_the_cleanup_shape() {
    let mut o = observed(&[]);
    let d = disabling_over(&["a", "b"], &mut o);
    o.nb_ipsec = Some(false);
    o.sb_ipsec = Some(false);
    // The DaemonSet still runs the agent: the operator is told what to do.
    let why = hold_reason(decide(&d, &o).unwrap());
    assert!(
        why.contains(
            "waiting for the kube-ovn-cni DaemonSet to run the ipsec-cleanup init container \
             instead of the ipsec container (disable IPsec in the chart)"
        ),
        "{why}"
    );
    o.daemon_set = None;
    let why = hold_reason(decide(&d, &o).unwrap());
    assert!(why.contains("does not exist"), "{why}");
    // The shape with a switch not yet confirmed off records nothing.
    o.daemon_set = Some(cleanup_ds());
    o.sb_ipsec = Some(true);
    assert!(matches!(decide(&d, &o).unwrap(), Decision::Hold { .. }));
    o.nb_ipsec = Some(true);
    assert_eq!(decide(&d, &o).unwrap(), Decision::SetNb(false));
    o.nb_ipsec = Some(false);
    o.sb_ipsec = Some(false);
    let (c, why) = written_why(decide(&d, &o).unwrap());
    assert_eq!(c.phase, CoordinationPhase::Cleanup);
    assert_eq!((c.generation, c.epoch), (d.generation, d.epoch + 1));
    assert_eq!(c.challenge, d.challenge, "the disable's challenge is kept");
    assert_eq!(
        (c.nb_global_uuid, c.sb_global_uuid),
        (Some(NB_ROW), Some(SB_ROW))
    );
    assert_eq!(c.daemon_set_uid, Some(uid("ds-uid-1")));
    assert_eq!(c.template_hash.as_deref(), Some("c1"));
    assert_eq!(c.targets, d.targets);
    assert!(why.contains("template c1"), "{why}");
}

#[test]
fn cleanup_keeps_targets_whose_node_exists_even_without_a_pod() {
    let mut o = observed(&[]);
    let d = disabling_over(&["a", "b", "c"], &mut o);
    o.nb_ipsec = Some(false);
    o.sb_ipsec = Some(false);
    o.daemon_set = Some(cleanup_ds());
    // b's Pod is being replaced by the rollout; c's Node is gone.
    o.scheduled = nodes(&["a"]);
    o.nodes = nodes(&["a", "b"]);
    let (c, why) = written_why(decide(&d, &o).unwrap());
    assert_eq!(c.targets, nodes(&["a", "b"]));
    assert!(why.contains("dropped c: the Node is gone"), "{why}");
}

#[test]
fn cleanup_goes_on_to_release_while_nothing_recorded_moved() {
    let mut o = observed(&[]);
    let c = cleanup_over(&["a", "b"], &mut o);
    let r = written(decide(&c, &o).unwrap());
    assert_eq!(r.phase, CoordinationPhase::Release);
    assert_eq!((r.generation, r.epoch), (c.generation, c.epoch + 1));
    assert_eq!(r.challenge, c.challenge);
    assert_eq!(r.targets, c.targets);
    let st = node_status(&c, &r, &o);
    assert_eq!(st["a"], "no release receipt yet", "{st:?}");
}

#[test]
fn a_switch_turned_on_or_a_moved_row_or_daemonset_sends_cleanup_and_release_back_to_disabling() {
    type Tweak = (fn(&mut Observation), &'static str);
    let tweaks: [Tweak; 8] = [
        (
            |o| o.nb_ipsec = Some(true),
            "NB_Global.ipsec reads true again",
        ),
        (
            |o| o.sb_ipsec = Some(true),
            "SB_Global.ipsec reads true again",
        ),
        (
            |o| o.nb_global_uuid = Some(Uuid::from_u128(9)),
            "the NB_Global row was replaced",
        ),
        (
            |o| o.sb_global_uuid = Some(Uuid::from_u128(9)),
            "the SB_Global row was replaced",
        ),
        (|o| o.daemon_set = None, "DaemonSet is gone"),
        (
            |o| {
                o.daemon_set = Some(LiveDaemonSet {
                    uid: uid("ds-uid-2"),
                    ..cleanup_ds()
                })
            },
            "re-created",
        ),
        (
            |o| {
                o.daemon_set = Some(LiveDaemonSet {
                    template_hash: "c2".into(),
                    ..cleanup_ds()
                })
            },
            "template changed to c2",
        ),
        (
            |o| {
                o.daemon_set = Some(LiveDaemonSet {
                    cleanup_shape: false,
                    ..cleanup_ds()
                })
            },
            "no longer runs the ipsec-cleanup init container",
        ),
    ];
    for release in [false, true] {
        for (tweak, want) in &tweaks {
            let mut o = observed(&[]);
            let stored = if release {
                release_over(&["a", "b"], &mut o)
            } else {
                cleanup_over(&["a", "b"], &mut o)
            };
            tweak(&mut o);
            let (r, why) = written_why(decide(&stored, &o).unwrap());
            assert_eq!(r.phase, CoordinationPhase::Disabling, "{want}");
            assert_eq!(r.challenge, Some(challenge(2)), "a new challenge");
            assert_ne!(r.challenge, stored.challenge);
            assert_eq!(
                (r.generation, r.epoch),
                (stored.generation, stored.epoch + 1)
            );
            assert!(why.contains(want), "{why}");
            assert_eq!(why.contains("must run again"), release, "{why}");
        }
    }
    // An unreadable switch is no reason to start over: hold.
    let mut o = observed(&[]);
    let r = release_over(&["a"], &mut o);
    o.sb_ipsec = None;
    o.sb_global_uuid = None;
    assert!(hold_reason(decide(&r, &o).unwrap()).contains("not readable"));
}

#[test]
fn release_is_a_barrier_on_every_release_receipt_then_disabled() {
    let mut o = observed(&[]);
    let r = release_over(&["a", "b", "c"], &mut o);
    o.releases = [
        ("a".to_owned(), Verdict::Satisfied),
        ("c".to_owned(), refused("ReleaseInitFailed")),
    ]
    .into();
    let d = decide(&r, &o).unwrap();
    assert!(
        hold_reason(d.clone()).starts_with("Release barrier"),
        "{d:?}"
    );
    let waiting = waiting_of(d);
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    assert_eq!(waiting["b"], "no release receipt yet");
    assert!(
        waiting["c"].starts_with("ReleaseInitFailed: "),
        "{waiting:?}"
    );
    let st = node_status(&r, &r, &o);
    assert_eq!(st["a"], "ok");
    assert_eq!(st["b"], waiting["b"]);
    assert_eq!(st["c"], waiting["c"]);
    // No trust: nothing can be verified, and the hold says so.
    o.trust = None;
    assert!(hold_reason(decide(&r, &o).unwrap()).contains("trust bundle"));
    o.trust = Some(trust(1));
    o.releases = ["a", "b", "c"]
        .map(|n| (n.to_owned(), Verdict::Satisfied))
        .into();
    let (done, why) = written_why(decide(&r, &o).unwrap());
    assert_eq!(done.phase, CoordinationPhase::Disabled);
    assert_eq!((done.generation, done.epoch), (r.generation, r.epoch + 1));
    assert!(why.contains("Disabled"), "{why}");
    assert!(node_status(&r, &done, &o).values().all(|s| s == "released"));
    o.releases.clear();
    assert_eq!(decide(&done, &o).unwrap(), Decision::Idle);
}

#[test]
fn release_drops_a_target_whose_node_is_gone_without_moving_the_epoch() {
    let mut o = observed(&[]);
    let r = release_over(&["a", "b", "c"], &mut o);
    o.releases = [("a".to_owned(), Verdict::Satisfied)].into();
    o.nodes.remove("c");
    o.scheduled.remove("c");
    let (next, why) = written_why(decide(&r, &o).unwrap());
    assert_eq!(next.phase, CoordinationPhase::Release);
    assert_eq!((next.generation, next.epoch), (r.generation, r.epoch));
    assert_eq!(next.challenge, r.challenge);
    assert_eq!(next.targets, nodes(&["a", "b"]));
    assert!(why.contains("dropped c"), "{why}");
    // The verdicts judged against the stored record still count.
    let st = node_status(&r, &next, &o);
    assert_eq!(st["a"], "ok");
    assert!(!st.contains_key("c"));
    o.releases.insert("b".into(), Verdict::Satisfied);
    assert_eq!(
        written(decide(&next, &o).unwrap()).phase,
        CoordinationPhase::Disabled
    );
}

#[test]
fn release_holds_a_target_the_daemonset_has_no_pod_on_and_says_how_to_retire_it() {
    let mut o = observed(&[]);
    let r = release_over(&["a", "b"], &mut o);
    o.releases = [("a".to_owned(), Verdict::Satisfied)].into();
    o.scheduled.remove("b");
    let waiting = waiting_of(decide(&r, &o).unwrap());
    assert!(
        waiting["b"].starts_with("no release receipt yet"),
        "{waiting:?}"
    );
    assert!(
        waiting["b"].contains("retire-node b --uid uid-b"),
        "{waiting:?}"
    );
}

#[test]
fn a_retirement_in_release_applies_without_moving_the_epoch_and_a_recreated_node_holds_until_then()
{
    let mut o = observed(&[]);
    let r = release_over(&["a", "b"], &mut o);
    o.releases = ["a", "b"]
        .map(|n| (n.to_owned(), Verdict::Satisfied))
        .into();
    o.nodes.insert("b".into(), uid("uid-b-2"));
    o.scheduled.insert("b".into(), uid("uid-b-2"));
    let waiting = waiting_of(decide(&r, &o).unwrap());
    assert!(waiting["b"].starts_with("NodeUIDChanged"), "{waiting:?}");
    assert!(node_status(&r, &r, &o)["b"].starts_with("NodeUIDChanged"));
    // A request naming the new UID is refused, and says so.
    o.retirements.insert("b".into(), uid("uid-b-2"));
    let waiting = waiting_of(decide(&r, &o).unwrap());
    assert!(waiting["b"].contains("RetireRefused"), "{waiting:?}");
    assert!(node_status(&r, &r, &o)["b"].contains("RetireRefused"));
    // Naming the frozen UID: out of the cohort, same epoch, consumed.
    o.retirements.insert("b".into(), uid("uid-b"));
    let (next, why) = written_why(decide(&r, &o).unwrap());
    assert_eq!(
        (next.phase, next.epoch),
        (CoordinationPhase::Release, r.epoch)
    );
    assert_eq!(next.targets, nodes(&["a"]));
    assert!(why.contains("retired b"), "{why}");
    assert_eq!(retirements_done(&r, &next, &o.retirements), vec!["b"]);
    o.retirements.clear();
    assert_eq!(
        written(decide(&next, &o).unwrap()).phase,
        CoordinationPhase::Disabled
    );
}

#[test]
fn re_enabling_from_each_disable_phase_writes_a_fresh_prepare_at_once() {
    let phases: [fn(&[&str], &mut Observation) -> CoordinationRecord; 3] =
        [disabling_over, cleanup_over, release_over];
    for at in phases {
        let mut o = observed(&[]);
        let stored = at(&["a", "b"], &mut o);
        // The operator reverted the chart and the flag.
        o.want_enabled = true;
        o.daemon_set = Some(ds("h2"));
        o.scheduled = nodes(&["a", "b", "c"]);
        o.nodes = nodes(&["a", "b", "c"]);
        if o.nb_ipsec != Some(false) {
            // Before NB read false, c (never armed) waits for Enabled.
            let (p, why) = written_why(decide(&stored, &o).unwrap());
            assert_eq!(p.targets, nodes(&["a", "b"]), "from {}", stored.phase);
            assert!(why.contains("no node joins before Enabled"), "{why}");
            o.nb_ipsec = Some(false);
        }
        let (p, why) = written_why(decide(&stored, &o).unwrap());
        assert_eq!(p.phase, CoordinationPhase::Prepare, "from {}", stored.phase);
        assert_eq!(
            (p.generation, p.epoch),
            (stored.generation + 1, stored.epoch + 1)
        );
        assert_eq!(p.challenge, None);
        assert_eq!((p.nb_global_uuid, p.sb_global_uuid), (None, None));
        assert_eq!(p.template_hash.as_deref(), Some("h2"));
        assert_eq!(p.targets, nodes(&["a", "b", "c"]));
        assert!(why.contains(stored.phase.as_str()), "{why}");
        // Without a DaemonSet it cannot freeze anything: hold.
        o.daemon_set = None;
        assert!(hold_reason(decide(&stored, &o).unwrap()).contains("DaemonSet"));
    }
}

#[test]
fn a_disable_takes_in_the_claimants_at_cleanup_not_before_nor_in_release() {
    // A joiner c armed for an admission that never came: not a target. It
    // may never have armed, so it is no target while NB may be on.
    let mut o = observed(&["a", "b"]);
    let en = enabled(&mut o);
    o.scheduled = nodes(&["a", "b", "c"]);
    o.nodes = nodes(&["a", "b", "c"]);
    o.claimants = nodes(&["c"]);
    o.want_enabled = false;
    o.fresh_challenge = challenge(1);
    let d = written(decide(&en, &o).unwrap());
    assert_eq!(d.phase, CoordinationPhase::Disabling);
    assert_eq!(d.targets, nodes(&["a", "b"]));

    // The status says so, and the Cleanup write takes it in.
    let mut o = observed(&[]);
    let d = disabling_over(&["a", "b"], &mut o);
    o.nodes = nodes(&["a", "b", "c"]);
    o.claimants = nodes(&["c"]);
    let st = node_status(&d, &d, &o);
    assert!(st["c"].contains("taken in at Cleanup"), "{st:?}");
    o.nb_ipsec = Some(false);
    o.sb_ipsec = Some(false);
    o.daemon_set = Some(cleanup_ds());
    let (c, why) = written_why(decide(&d, &o).unwrap());
    assert_eq!(c.phase, CoordinationPhase::Cleanup);
    assert_eq!(c.targets, nodes(&["a", "b", "c"]));
    assert!(why.contains("took in c"), "{why}");

    // In Release a claimant is not added: a retired one stays retired.
    let mut o = observed(&[]);
    let r = release_over(&["a", "b"], &mut o);
    o.nodes = nodes(&["a", "b", "c"]);
    o.claimants = nodes(&["c"]);
    let waiting = waiting_of(decide(&r, &o).unwrap());
    assert!(!waiting.contains_key("c"), "{waiting:?}");
}

#[test]
fn a_retirement_left_over_from_release_is_carried_out_by_the_reenable() {
    let mut o = observed(&[]);
    let r = release_over(&["a", "b"], &mut o);
    o.retirements.insert("b".into(), uid("uid-b"));
    o.want_enabled = true;
    o.daemon_set = Some(ds("h2"));
    let (p, why) = written_why(decide(&r, &o).unwrap());
    assert_eq!(p.phase, CoordinationPhase::Prepare);
    // b sits this write out, so the request counts as carried out ...
    assert_eq!(p.targets, nodes(&["a"]));
    assert!(why.contains("retired b"), "{why}");
    assert_eq!(retirements_done(&r, &p, &o.retirements), vec!["b"]);
    // ... and, the request removed, b rejoins on the next pass.
    o.retirements.clear();
    let (p2, why) = written_why(decide(&p, &o).unwrap());
    assert_eq!(p2.phase, CoordinationPhase::Prepare);
    assert_eq!(p2.targets, nodes(&["a", "b"]));
    assert!(why.contains("joined: b"), "{why}");
}
