//! The lab's parts together on this machine's kernel: the control plane
//! (`harness::control_plane`) and two simulated nodes (`harness::node`), each running the
//! agent binary with the real strongSwan and the patched monitor. The
//! controller's enable reaches `Enabled` on the agents' signed receipts,
//! with both nodes armed (their leases published) and NB and SB true.

// Real processes in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use harness::control_plane::{Binaries, ControlPlane};
use harness::node::{AgentOptions, SimNode};
use kube_ovn_ipsec_api::coordination::CoordinationPhase;
use kube_ovn_ipsec_api::names::ovs;
use lab::state::NETNS_PREFIX;
use testbed::ipsec::IpsecNode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_simulated_nodes_reach_enabled_with_the_real_agent_and_controller() {
    for p in [
        "ipsec",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ovs-appctl",
        "nsenter",
    ] {
        testbed::require_program(p).unwrap();
    }
    let script =
        testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let bins = Binaries::beside_current_exe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let mut cp = ControlPlane::start(dir.path(), 2).await.unwrap();
    let (a, b) = IpsecNode::pair(NETNS_PREFIX, "chassis-0", "chassis-1").unwrap();
    let mut nodes = vec![
        SimNode::prepare(a, dir.path()).unwrap(),
        SimNode::prepare(b, dir.path()).unwrap(),
    ];
    for (n, cni) in nodes.iter_mut().zip(&cp.nodes) {
        n.start_agent(&bins.agent, cni, &cp.api, script, &AgentOptions::lab(3600))
            .unwrap();
    }
    cp.start_controller(&bins.controller, true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = cp.record().await.unwrap();
        if r.as_ref().map(|r| r.phase) == Some(CoordinationPhase::Enabled) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Enabled in 120 s: {r:?}\n{}",
            nodes
                .iter()
                .map(SimNode::logs)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("Enabled {:?} after the start", t0.elapsed());
    for n in &nodes {
        let lease = n
            .node
            .vsctl(&["get", "Open_vSwitch", ".", "external_ids"])
            .unwrap();
        assert!(
            lease.contains(ovs::EXTERNAL_ID_PROTECTION_LEASE),
            "{}: {lease}",
            n.node.chassis()
        );
    }
    let nb = ovsdb::Client::connect_str(&cp.central.nb.address())
        .await
        .unwrap();
    assert!(nb.read_nb_ipsec().await.unwrap());
    nb.close();
}
