//! Cluster enable with the controller's coordinator against the embedded
//! API server (RBAC on) and real OVN NB/SB with ovn-northd. The nodes are
//! in-test responders standing in for agents (the agent's coordinator is
//! built separately): each holds a key whose certificate the controller
//! issued through its Pod-bound token, follows the record and publishes a
//! real signed receipt on its Node with that token (`common::coordination`,
//! shared with the restart tests).
//!
//! - Prepare → Arm → NB → Enabled, NB never true before the record is `Arm`
//!   with every receipt in, SB read true before `Enabled`;
//! - a receipt signed with another node's key holds `Prepare` with the
//!   check's name, in the status and as an Event on the Node, and NB stays
//!   false;
//! - a replica takes over a killed leader mid-barrier and resumes it;
//! - a node the DaemonSet schedules to after `Enabled` is admitted through
//!   its own `Prepare`/`Arm` receipts in a new epoch, NB on throughout;
//! - a re-created Node holds as `NodeUIDChanged` until `retire-node` names
//!   the UID the cohort froze; then it is admitted like any joiner.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::coordination::*;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube_ovn_ipsec_api::coordination::CoordinationPhase;
use testbed::ovs::OvnCentral;

/// The controller binary, for the operator's commands.
const CONTROLLER: &str = env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_walks_prepare_arm_nb_enabled_on_signed_receipts() {
    let (s, _) = setup(3, None, None).await;
    let t0 = Instant::now();
    let (seen, nb_first_true_in) = until_enabled(&s, Duration::from_secs(60)).await;
    use CoordinationPhase::*;
    assert_eq!(
        seen,
        vec![Prepare, Arm, Enabled],
        "phases in order, none skipped"
    );
    assert!(
        matches!(nb_first_true_in, Some(Arm) | Some(Enabled)),
        "NB turned true while the record was {nb_first_true_in:?}"
    );
    let r = record(&s.c.admin).await.unwrap();
    assert_eq!(r.targets.len(), 3);
    assert_eq!((r.generation, r.epoch), (1, 3));
    println!("Enabled after {:?}", t0.elapsed());
    let st = status(&s.c.admin).await;
    assert_eq!(st["leader"], "controller-0", "{st}");

    // The operator's read-only view, from the binary.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    s.c.server
        .write_kubeconfig(&kubeconfig, apiserver::ADMIN_TOKEN)
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"))
        .args(["--namespace", NS, "status"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("phase Enabled  generation 1  epoch 3  targets 3"),
        "{text}"
    );
    assert!(text.contains("leader controller-0"), "{text}");
    for h in s.responders {
        h.abort();
    }
    s.c.stop().await;
}

/// The leader killed mid-barrier (no clean stop): a second replica waits
/// for the Lease to expire, takes over and resumes the same barrier — the
/// epochs go on from the stored record, no phase is skipped, NB is set once
/// the last receipt is in.
/// OVN's databases as Kube-OVN's `ENABLE_SSL` serves them: NB and SB
/// over SSL only (ovs-pki's certificates, ovn-northd over SSL too); the
/// controller, given the key, certificate and CA files, walks the same
/// barriers to `Enabled` and the switch reaches SB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_over_ssl_reaches_enabled_with_nb_and_sb_on() {
    let (s, _) = setup_over_ssl(2).await;
    let t0 = Instant::now();
    let (seen, _) = until_enabled(&s, Duration::from_secs(60)).await;
    assert_eq!(seen.last(), Some(&CoordinationPhase::Enabled), "{seen:?}");
    assert_eq!(nb_sb(&s.central).await, (true, true));
    println!("Enabled over SSL after {:?}", t0.elapsed());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_takes_over_a_killed_leader_mid_barrier_and_resumes() {
    let (mut s, ids) = setup(3, None, Some(2)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&s.c.admin).await;
        if st["nodes"]["node-0"] == "ok" && st["nodes"]["node-1"] == "ok" {
            assert_eq!(st["nodes"]["node-2"], "no receipt yet", "{st}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prepare barrier not half done: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = record(&s.c.admin).await.unwrap();
    assert_eq!(before.phase, CoordinationPhase::Prepare);
    s.c.kill_controller();
    let (nb, sb) = (s.central.nb.address(), s.central.sb.address());
    let config = s.c.config_with(&flags(&nb, &sb, "controller-1"));
    s.c.start_controller(config).await;
    let killed = Instant::now();
    // The last node reports only now.
    s.responders.push(responder(&s.c, 2, &ids[2]));
    let (seen, nb_first_true_in) = until_enabled(&s, Duration::from_secs(60)).await;
    println!("Enabled {:?} after the kill", killed.elapsed());
    use CoordinationPhase::*;
    assert_eq!(seen, vec![Prepare, Arm, Enabled]);
    assert!(matches!(nb_first_true_in, Some(Arm) | Some(Enabled)));
    let after = record(&s.c.admin).await.unwrap();
    assert_eq!(
        (after.generation, after.epoch),
        (1, before.epoch + 2),
        "resumed, not restarted"
    );
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(s.c.admin.clone(), NS)
        .get("ovn-ipsec-controller")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("controller-1"));
    assert_eq!(lease.lease_transitions, Some(1));
    assert_eq!(status(&s.c.admin).await["leader"], "controller-1");
    for h in s.responders {
        h.abort();
    }
    s.c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_signed_with_another_nodes_key_holds_prepare_with_the_reason() {
    let (s, _) = setup(3, Some(2), None).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(&s.c.admin).await;
        let r = record(&s.c.admin).await;
        let held = st["nodes"]["node-2"]
            .as_str()
            .is_some_and(|v| v.starts_with("ReceiptSignatureInvalid"));
        if held {
            assert_eq!(
                r.as_ref().map(|r| r.phase),
                Some(CoordinationPhase::Prepare)
            );
            assert_eq!(st["nodes"]["node-0"], "ok", "{st}");
            break;
        }
        assert!(Instant::now() < deadline, "no refusal in 30 s: {st} {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held, not moving, and the switch stays off.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        record(&s.c.admin).await.map(|r| r.phase),
        Some(CoordinationPhase::Prepare)
    );
    assert_eq!(nb_sb(&s.central).await, (false, false));
    eventually("an Event on node-2 names the check", || async {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(s.c.admin.clone(), "default");
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ReceiptSignatureInvalid")
                    && e.involved_object.name.as_deref() == Some("node-2")
            })
    })
    .await;
    for h in s.responders {
        h.abort();
    }
    s.c.stop().await;
}

/// Reads `NB_Global.ipsec` every 100 ms until aborted; the flag is set if
/// it ever read false.
fn watch_nb_stays_on(central: &OvnCentral) -> (Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
    let went_off = Arc::new(AtomicBool::new(false));
    let flag = went_off.clone();
    let address = central.nb.address();
    let task = tokio::spawn(async move {
        let nb = ovsdb::Client::connect_str(&address).await.unwrap();
        loop {
            if !nb.read_nb_ipsec().await.unwrap() {
                flag.store(true, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (went_off, task)
}

/// A node the DaemonSet starts scheduling to after `Enabled` is admitted
/// through its own receipts: while only its `Prepare` receipt is in, the
/// status says why it waits, an Event on its Node names the check, and the
/// cohort does not move; its `Arm` receipt for the record's epoch makes it
/// a target in a new epoch of `Enabled`. NB reads true the whole time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_scheduled_after_enabled_is_admitted_on_its_receipts_with_nb_on() {
    let (mut s, _) = setup_with(3, None, None, true).await;
    let (seen, _) = until_enabled(&s, Duration::from_secs(60)).await;
    assert_eq!(seen.last(), Some(&CoordinationPhase::Enabled));
    let before = record(&s.c.admin).await.unwrap();
    assert_eq!(
        before.targets.keys().collect::<Vec<_>>(),
        ["node-0", "node-1"]
    );
    let (nb_went_off, nb_watch) = watch_nb_stays_on(&s.central);

    // The DaemonSet schedules to node-2 now: its Pod, a token bound to it,
    // an identity issued through that token.
    let id = schedule_late(&mut s, 2).await;
    let may_arm = Arc::new(AtomicBool::new(false));
    s.responders.push(tokio::spawn(respond(
        s.c.admin.clone(),
        s.c.nodes[2].clone(),
        id.clone(),
        id.key.clone(),
        may_arm.clone(),
    )));

    // Prepared, not armed: reported, not admitted.
    let why = until_node_status(&s, "node-2", |v| v.contains("ReceiptNotReady")).await;
    assert!(why.starts_with("admission: "), "{why}");
    let waiting = record(&s.c.admin).await.unwrap();
    assert_eq!(waiting.phase, CoordinationPhase::Enabled);
    assert_eq!(waiting.targets, before.targets, "not admitted on Prepare");
    eventually("an Event on node-2 names the check", || async {
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(s.c.admin.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ReceiptNotReady")
                    && e.involved_object.name.as_deref() == Some("node-2")
            })
    })
    .await;

    // Armed: admitted, in a new epoch of the same cycle.
    let t0 = Instant::now();
    may_arm.store(true, Ordering::SeqCst);
    let after = until_record(&s, "node-2 admitted", Duration::from_secs(30), |r| {
        r.targets.contains_key("node-2")
    })
    .await;
    println!("node-2 admitted {:?} after arming", t0.elapsed());
    assert_eq!(after.phase, CoordinationPhase::Enabled);
    assert_eq!(after.generation, before.generation);
    assert!(after.epoch > before.epoch, "{after:?}");
    assert_eq!(after.targets["node-2"].as_str(), s.c.nodes[2].uid);
    assert_eq!(after.targets.len(), 3);
    until_node_status(&s, "node-2", |v| v == "ok").await;
    nb_watch.abort();
    assert!(
        !nb_went_off.load(Ordering::SeqCst),
        "NB_Global.ipsec read false while a node was admitted"
    );
    assert_eq!(nb_sb(&s.central).await, (true, true));
    for h in s.responders {
        h.abort();
    }
    s.c.stop().await;
}

/// A target whose Node is deleted and re-created under the same name holds
/// as NodeUIDChanged (reported, never dropped); `retire-node` naming
/// another UID is refused with the reason in the status; naming the frozen
/// UID removes the target in a new epoch, consumes the request, and the new
/// Node is admitted through its own receipts. NB stays on throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_node_removes_a_recreated_target_which_is_then_admitted() {
    let (s, _) = setup(3, None, None).await;
    until_enabled(&s, Duration::from_secs(60)).await;
    let before = record(&s.c.admin).await.unwrap();
    let old_uid = before.targets["node-2"].clone();
    let (nb_went_off, nb_watch) = watch_nb_stays_on(&s.central);

    let nodes: Api<Node> = Api::all(s.c.admin.clone());
    nodes.delete("node-2", &Default::default()).await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-2",
                     "annotations": {"ovn.kubernetes.io/chassis": s.c.nodes[2].chassis}}
    }))
    .unwrap();
    let new_uid = nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let why = until_node_status(&s, "node-2", |v| v.starts_with("NodeUIDChanged")).await;
    assert!(why.contains(old_uid.as_str()), "{why}");
    assert_eq!(
        record(&s.c.admin).await.unwrap(),
        before,
        "held, not dropped"
    );

    let (ok, out) = controller_cli(
        CONTROLLER,
        &s,
        &["retire-node", "node-2", "--uid", &new_uid],
    );
    assert!(ok, "{out}");
    assert!(out.contains("will refuse"), "{out}");
    until_node_status(&s, "node-2", |v| v.contains("RetireRefused")).await;
    assert_eq!(record(&s.c.admin).await.unwrap(), before);
    let (ok, out) = controller_cli(CONTROLLER, &s, &["status"]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("retirement requested: node-2 (UID {new_uid})")),
        "{out}"
    );

    let (ok, out) = controller_cli(
        CONTROLLER,
        &s,
        &["retire-node", "node-2", "--uid", old_uid.as_str()],
    );
    assert!(ok, "{out}");
    let after = until_record(&s, "node-2 re-admitted", Duration::from_secs(30), |r| {
        r.targets
            .get("node-2")
            .is_some_and(|u| u.as_str() == new_uid)
    })
    .await;
    assert_eq!(after.phase, CoordinationPhase::Enabled);
    assert_eq!(after.generation, before.generation);
    assert!(
        after.epoch >= before.epoch + 2,
        "retired, then admitted: {after:?}"
    );
    let cm = Api::<ConfigMap>::namespaced(s.c.admin.clone(), NS)
        .get("ovn-ipsec-coordination")
        .await
        .unwrap();
    assert!(
        !cm.annotations().contains_key("kube-ovn.io/ipsec-retire"),
        "the request is consumed: {:?}",
        cm.annotations()
    );
    nb_watch.abort();
    assert!(!nb_went_off.load(Ordering::SeqCst));
    for h in s.responders {
        h.abort();
    }
    s.c.stop().await;
}
