//! The lab's control plane on the real parts: the embedded API server with
//! RBAC, OVN NB/SB with ovn-northd, and the controller binary with its
//! ServiceAccount's token. With two nodes scheduled and no agent running,
//! the controller publishes the trust bundle and freezes both nodes in
//! `Prepare`; restarted with the intent off, it starts the disable.

// Real processes in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use harness::control_plane::{Binaries, ControlPlane};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};

async fn until(
    cp: &ControlPlane,
    what: &str,
    f: impl Fn(&CoordinationRecord) -> bool,
) -> CoordinationRecord {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(r) = cp.record().await.unwrap()
            && f(&r)
        {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: {:?}", cp.record().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_runs_the_real_controller() {
    let bins = Binaries::beside_current_exe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let mut cp = ControlPlane::start(dir.path(), 2).await.unwrap();
    println!("API server, cluster and OVN in {:?}", t0.elapsed());
    assert_eq!(cp.nodes.len(), 2);

    cp.start_controller(&bins.controller, true).unwrap();
    let prepare = until(&cp, "Prepare", |r| r.phase == CoordinationPhase::Prepare).await;
    println!("Prepare {:?} after the controller started", t0.elapsed());
    let names: Vec<&str> = prepare.targets.keys().map(String::as_str).collect();
    assert_eq!(names, ["node-0", "node-1"]);
    for n in &cp.nodes {
        assert_eq!(prepare.targets[&n.name].as_str(), n.uid);
    }
    let trust = Api::<ConfigMap>::namespaced(cp.admin.clone(), "kube-system")
        .get_opt("ovn-ipsec-trust")
        .await
        .unwrap();
    assert!(trust.is_some(), "no trust bundle published");

    // The operator turns IPsec off: a new controller process.
    cp.start_controller(&bins.controller, false).unwrap();
    let disabling = until(&cp, "Disabling", |r| {
        r.phase == CoordinationPhase::Disabling
    })
    .await;
    assert_eq!(disabling.generation, prepare.generation + 1);
    println!("Disabling {:?} after the start", t0.elapsed());
}
