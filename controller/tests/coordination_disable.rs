//! Cluster disable with the controller's coordinator against the embedded
//! API server (RBAC on) and real OVN NB/SB with ovn-northd, after a real
//! enable (`common::coordination`: in-test nodes holding certificates the
//! controller issued through their Pod-bound tokens). No DaemonSet
//! controller or kubelet runs here, so the test plays their part: it rolls
//! the DaemonSet to the cleanup shape (template, ControllerRevision, new
//! Pods), reports each `ipsec-cleanup` init container's exit in the Pod's
//! status, and publishes each node's signed release receipt as the
//! cleanup does last — signed with the node's last identity, whose CSR
//! its old agent Pod requested, with the new Pod's token.
//!
//! - `--enable-ipsec=false`: `Disabling` (new generation, a challenge), NB
//!   and SB turned off and confirmed while the record holds for the
//!   cleanup shape with the operator's instruction; `Cleanup` records the
//!   live `NB_Global`/`SB_Global` row UUIDs, DaemonSet and template;
//!   `Release`; `Disabled` once every receipt is verified; then enabled
//!   again (the chart reverted): `Prepare`, `Arm`, `Enabled` as a new
//!   cycle;
//! - release receipts for an old epoch, with another challenge, naming
//!   another node's Pod, or from a Pod whose init container exited 1 each
//!   hold `Release` with their own reason, in the status and as an Event
//!   on the Node; the successful re-run lets it finish;
//! - NB turned on behind the controller's back during `Release`: back to
//!   `Disabling` with a new challenge, NB off again, a new `Release` that
//!   old receipts do not satisfy, and `Disabled` once the cleanup ran
//!   again.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::time::{Duration, Instant};

use common::coordination::*;
use common::*;
use kube_ovn_ipsec_api::coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, ReleaseReceipt,
};
use kube_ovn_ipsec_api::ident::Uid;
use testbed::ovs::OvnCentral;

use CoordinationPhase::{Arm, Cleanup, Disabled, Disabling, Enabled, Prepare, Release};

/// The controller binary, for the operator's `status`.
const CONTROLLER: &str = env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller");

/// The template hash of the chart's DaemonSet with IPsec disabled.
const CLEANUP_HASH: &str = "7c1e4a9f2";

/// How long one step of the coordinator may take (a 1 s period).
const STEP: Duration = Duration::from_secs(15);

/// The `_uuid`s of the `NB_Global` and `SB_Global` rows.
async fn rows(central: &OvnCentral) -> (uuid::Uuid, uuid::Uuid) {
    let nb = ovsdb::Client::connect_str(&central.nb.address())
        .await
        .unwrap();
    let sb = ovsdb::Client::connect_str(&central.sb.address())
        .await
        .unwrap();
    let (nb_row, _) = nb
        .select_single(ovsdb::OVN_NORTHBOUND, "NB_Global", &[])
        .await
        .unwrap();
    let (sb_row, _) = sb
        .select_single(ovsdb::OVN_SOUTHBOUND, "SB_Global", &[])
        .await
        .unwrap();
    nb.close();
    sb.close();
    (nb_row, sb_row)
}

/// Enabled over three nodes, then the controller restarted with
/// `--enable-ipsec=false`: returns the `Enabled` record and the
/// `Disabling` one once NB and SB read false and the record holds for the
/// cleanup shape.
async fn enabled_then_disabling(s: &mut Setup) -> (CoordinationRecord, CoordinationRecord) {
    until_enabled(s, Duration::from_secs(30)).await;
    let enabled = record(&s.c.admin).await.unwrap();
    s.restart_controller(false).await;
    let disabling = until_record(s, "Disabling", STEP, |r| r.phase == Disabling).await;
    assert_eq!(disabling.generation, enabled.generation + 1, "a new cycle");
    assert!(disabling.challenge.is_some());
    let st = until_reason(s, |r| {
        r.contains(
            "waiting for the kube-ovn-cni DaemonSet to run the ipsec-cleanup init container \
             instead of the ipsec container (disable IPsec in the chart)",
        )
    })
    .await;
    assert_eq!(
        nb_sb(&s.central).await,
        (false, false),
        "NB and SB off before anything is cleaned up"
    );
    assert_eq!(
        st["nodes"]["node-0"],
        "release pending: the cohort is Disabling"
    );
    assert_eq!(
        record(&s.c.admin).await.unwrap(),
        disabling,
        "nothing recorded without the cleanup shape"
    );
    (enabled, disabling)
}

/// The chart disables IPsec: the DaemonSet rolls to the cleanup shape and
/// each node's init container ends with `exits[n]`.
async fn roll_to_cleanup(s: &mut Setup, exits: [i32; 3]) {
    s.c.roll_daemon_set(Shape::Cleanup, CLEANUP_HASH).await;
    for (n, code) in exits.into_iter().enumerate() {
        s.c.set_cleanup_init(n, Some(code)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_walks_disabling_cleanup_release_to_disabled_then_enables_again() {
    let (mut s, ids) = setup(3, None, None).await;
    let t0 = Instant::now();
    let (enabled, disabling) = enabled_then_disabling(&mut s).await;
    println!("Disabling, NB and SB off after {:?}", t0.elapsed());
    let (ok, out) = controller_cli(CONTROLLER, &s, &["status"]);
    println!("{out}");
    assert!(ok, "{out}");
    assert!(out.contains("phase Disabling"), "{out}");
    assert!(
        out.contains("disable: turning NB_Global.ipsec off"),
        "{out}"
    );

    roll_to_cleanup(&mut s, [0, 0, 0]).await;
    let cleanup = until_record(&s, "Cleanup", STEP, |r| r.phase != Disabling).await;
    assert_eq!(nb_sb(&s.central).await, (false, false));
    assert_eq!(cleanup.phase, Cleanup, "{cleanup:?}");
    let (nb_row, sb_row) = rows(&s.central).await;
    assert_eq!(cleanup.nb_global_uuid, Some(nb_row));
    assert_eq!(cleanup.sb_global_uuid, Some(sb_row));
    assert_eq!(
        cleanup.daemon_set_uid.as_ref().unwrap().as_str(),
        s.c.ds_uid
    );
    assert_eq!(cleanup.template_hash.as_deref(), Some(CLEANUP_HASH));
    assert_eq!(cleanup.challenge, disabling.challenge);
    assert_eq!(cleanup.targets, enabled.targets);

    let release = until_record(&s, "Release", STEP, |r| r.phase == Release).await;
    assert_eq!(release.epoch, cleanup.epoch + 1);
    until_node_status(&s, "node-0", |v| v == "no release receipt yet").await;
    for (n, id) in ids.iter().enumerate() {
        publish_release(&s.c, n, id, |_| {}).await;
    }
    let disabled = until_record(&s, "Disabled", STEP, |r| r.phase == Disabled).await;
    println!("Disabled after {:?}", t0.elapsed());
    assert_eq!(disabled.epoch, release.epoch + 1);
    assert_eq!(disabled.generation, disabling.generation);
    assert_eq!(nb_sb(&s.central).await, (false, false));
    let st = until_node_status(&s, "node-2", |v| v == "released").await;
    println!("{st}");
    let (ok, out) = controller_cli(CONTROLLER, &s, &["status"]);
    println!("{out}");
    assert!(ok && out.contains("phase Disabled"), "{out}");

    // The chart enables IPsec again: the agent's template is back (its old
    // hash, the newest revision), new agent Pods obtain new identities.
    for h in s.responders.drain(..) {
        h.abort();
    }
    s.c.roll_daemon_set(Shape::Ipsec, HASH).await;
    for n in 0..3 {
        let name = format!("ovn-ipsec-{}-again", s.c.nodes[n].name);
        let id = identity_as(&s.c, n, &name).await;
        s.responders.push(responder(&s.c, n, &id));
    }
    let t1 = Instant::now();
    s.restart_controller(true).await;
    let (seen, nb_first_true_in) = until_enabled(&s, Duration::from_secs(30)).await;
    println!("Enabled again {:?} after the restart", t1.elapsed());
    assert_eq!(seen, [Disabled, Prepare, Arm, Enabled]);
    assert!(matches!(nb_first_true_in, Some(Arm | Enabled)));
    let again = record(&s.c.admin).await.unwrap();
    assert_eq!(again.generation, disabled.generation + 1);
    assert_eq!(again.targets.len(), 3);
    assert_eq!(again.template_hash.as_deref(), Some(HASH));
    s.stop().await;
}

/// A joiner that signed its `Prepare` receipt (so its agent may have
/// armed) but was never admitted is taken into the disable at `Cleanup`
/// (the status says so while `Disabling`), and `Disabled` waits for its
/// release receipt too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_never_admitted_is_asked_for_its_release() {
    let (mut s, mut ids) = setup_with(3, None, None, true).await;
    until_enabled(&s, Duration::from_secs(30)).await;
    let enabled = record(&s.c.admin).await.unwrap();
    assert_eq!(enabled.targets.len(), 2);
    let id = schedule_late(&mut s, 2).await;
    s.responders.push(tokio::spawn(respond(
        s.c.admin.clone(),
        s.c.nodes[2].clone(),
        id.clone(),
        id.key.clone(),
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )));
    until_node_status(&s, "node-2", |v| v.contains("ReceiptNotReady")).await;
    ids.push(id);

    s.restart_controller(false).await;
    // Not while NB may be on (it may never have armed): at Cleanup.
    let disabling = until_record(&s, "Disabling", STEP, |r| r.phase == Disabling).await;
    assert_eq!(disabling.targets, enabled.targets);
    until_node_status(&s, "node-2", |v| v.contains("taken in at Cleanup")).await;
    roll_to_cleanup(&mut s, [0, 0, 0]).await;
    let release = until_record(&s, "Release", STEP, |r| r.phase == Release).await;
    assert!(release.targets.contains_key("node-2"), "{release:?}");
    assert_eq!(release.targets.len(), 3);
    for (n, id) in ids.iter().enumerate().take(2) {
        publish_release(&s.c, n, id, |_| {}).await;
    }
    until_node_status(&s, "node-2", |v| v == "no release receipt yet").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(record(&s.c.admin).await.unwrap().phase, Release);
    publish_release(&s.c, 2, &ids[2], |_| {}).await;
    until_record(&s, "Disabled", STEP, |r| r.phase == Disabled).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_refuses_an_old_epoch_another_challenge_another_pod_and_a_failed_init() {
    let (mut s, ids) = setup(3, None, None).await;
    enabled_then_disabling(&mut s).await;
    roll_to_cleanup(&mut s, [0, 0, 0]).await;
    let release = until_record(&s, "Release", STEP, |r| r.phase == Release).await;
    publish_release(&s.c, 0, &ids[0], |_| {}).await;
    publish_release(&s.c, 1, &ids[1], |_| {}).await;
    until_node_status(&s, "node-1", |v| v == "ok").await;

    let other_pod = s.c.nodes[1].pod_uid.clone();
    type Tweak = Box<dyn FnOnce(&mut ReleaseReceipt)>;
    let refusals: [(&str, Tweak); 4] = [
        ("ReleaseReceiptEpochMismatch", Box::new(|r| r.epoch -= 1)),
        (
            "ReleaseReceiptChallengeMismatch",
            Box::new(|r| r.challenge = Challenge::from_bytes([0xee; 32])),
        ),
        (
            "ReleaseReceiptPodNotLive",
            Box::new(move |r| r.pod_uid = Uid::new(other_pod).unwrap()),
        ),
        // Valid in every field, but the init container's run that wrote
        // it then failed (a foreign owner): it exited 1.
        ("ReleaseInitFailed", Box::new(|_| {})),
    ];
    for (reason, tweak) in refusals {
        if reason == "ReleaseInitFailed" {
            s.c.set_cleanup_init(2, Some(1)).await;
        }
        publish_release(&s.c, 2, &ids[2], tweak).await;
        let why = until_node_status(&s, "node-2", |v| v.starts_with(reason)).await;
        println!("node-2: {why}");
        eventually(&format!("an Event on node-2 names {reason}"), || {
            node_event(&s.c.admin, "node-2", reason)
        })
        .await;
    }
    let st = status(&s.c.admin).await;
    assert!(
        st["nodes"]["node-2"]
            .as_str()
            .unwrap()
            .contains("ipsec-cleanup exited with code 1: Error: a foreign owner"),
        "{st}"
    );
    assert_eq!(
        st["reason"],
        "Release barrier: waiting for release receipts"
    );
    assert_eq!(st["nodes"]["node-0"], "ok");
    assert_eq!(record(&s.c.admin).await.unwrap(), release, "held");
    let (ok, out) = controller_cli(CONTROLLER, &s, &["status"]);
    println!("{out}");
    assert!(ok && out.contains("node-2: ReleaseInitFailed"), "{out}");

    // The kubelet re-ran it and it succeeded: the same receipt now counts.
    s.c.set_cleanup_init(2, Some(0)).await;
    let disabled = until_record(&s, "Disabled", STEP, |r| r.phase == Disabled).await;
    assert_eq!(disabled.epoch, release.epoch + 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nb_turned_on_during_release_restarts_the_disable_with_a_new_challenge() {
    let (mut s, ids) = setup(3, None, None).await;
    enabled_then_disabling(&mut s).await;
    roll_to_cleanup(&mut s, [0, 0, 0]).await;
    let release = until_record(&s, "Release", STEP, |r| r.phase == Release).await;
    publish_release(&s.c, 0, &ids[0], |_| {}).await;
    until_node_status(&s, "node-0", |v| v == "ok").await;

    // Someone turns the switch on again.
    let nb = ovsdb::Client::connect_str(&s.central.nb.address())
        .await
        .unwrap();
    nb.set_nb_ipsec(true).await.unwrap();
    nb.close();
    let back = until_record(&s, "back to Disabling", STEP, |r| r.phase == Disabling).await;
    assert_eq!(back.generation, release.generation, "the same cycle");
    assert!(back.epoch > release.epoch);
    assert!(back.challenge.is_some());
    assert_ne!(back.challenge, release.challenge, "a new challenge");
    // NB off again; the DaemonSet still has the cleanup shape.
    let again = until_record(&s, "Release again", STEP, |r| {
        r.phase == Release && r.epoch > back.epoch
    })
    .await;
    assert_eq!(again.challenge, back.challenge);
    assert_eq!(nb_sb(&s.central).await, (false, false));
    // node-0's receipt answered the old Release.
    until_node_status(&s, "node-0", |v| {
        v.starts_with("ReleaseReceiptEpochMismatch")
    })
    .await;
    assert_eq!(record(&s.c.admin).await.unwrap().phase, Release);

    // The operator deletes the cleanup Pods; each runs its init container
    // again and answers the new challenge.
    for (n, id) in ids.iter().enumerate() {
        s.c.replace_pod(n, Shape::Cleanup, CLEANUP_HASH).await;
        s.c.set_cleanup_init(n, Some(0)).await;
        let sent = publish_release(&s.c, n, id, |_| {}).await;
        assert_eq!(Some(sent.challenge), again.challenge);
    }
    let disabled = until_record(&s, "Disabled", STEP, |r| r.phase == Disabled).await;
    assert_eq!(disabled.epoch, again.epoch + 1);
    assert_eq!(nb_sb(&s.central).await, (false, false));
    s.stop().await;
}
