//! Cluster disable with the real agents and the real cleanup (SPEC §7, §8,
//! §10 "No one-way door"): the embedded API server with RBAC on, real OVN
//! NB/SB and ovn-northd, the real controller's coordinator, and three
//! simulated nodes on one underlay segment, each with its own
//! ovsdb-server, real strongSwan and the patched ovs-monitor-ipsec run by
//! an agent process, then `kube-ovn-ipsec cleanup` as the `ipsec-cleanup`
//! init container of its next Pod.
//!
//! No DaemonSet controller, kubelet or patched ovn-controller runs here, so
//! the test plays their parts: it rolls the DaemonSet (template, revision,
//! each node's Pod in turn), stops the old agent and runs the cleanup as
//! the kubelet would (reporting the init container's exit in the Pod's
//! status, restarting it on a non-zero exit), and gives tunnels IPsec
//! intent while `SB_Global.ipsec` is true and takes it away once false.
//!
//! Asserted: foreign policies installed before anything ran survive; the
//! cluster walks `Enabled → Disabling → Cleanup → Release → Disabled` with
//! NB and SB false before any node withdraws anything; afterwards each
//! node's XFRM policy and state dump is byte-identical to the one taken
//! before its agent first ran, OVSDB holds no lease or identity key and
//! every unrelated one; re-enabled (the chart reverted, new Pods, the same
//! key directories) the cluster reaches `Enabled` again with no manual step
//! and IKE comes up between every pair. The kernel here has no ESP, so
//! only IKE_SAs are asserted (the ESP datapath through a disable is the
//! guest kernel's, `overlay`).

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;

use std::time::{Duration, Instant};

use agent_node::{
    AGENT_FLAGS, AgentNode, Env, add_unrelated_keys, assert_only_unrelated_left,
    both_ways_establish, connect, env, no_auth_failures, reconnect, restart_controller,
    roll_to_cleanup, roll_to_ipsec, start_node, xfrm_dump,
};
use harness::controller_cluster as cc;
use harness::controller_cluster::coordination::{nb_sb, record, status};
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::names::k8s;
use testbed::ipsec::{IpsecNode, Tunnel};

use CoordinationPhase::{Cleanup, Disabled, Disabling, Enabled, Release};

/// The cleanup shape's template hash.
const CLEANUP_HASH: &str = "4c1ea9b70";
/// The template hash after the chart is reverted to IPsec on.
const REENABLED_HASH: &str = "8e4ab1c52";

/// Polls the record until `pred` holds; the phases seen on the way are
/// appended to `seen`.
async fn until(
    e: &Env,
    what: &str,
    limit: Duration,
    seen: &mut Vec<CoordinationPhase>,
    pred: impl Fn(&CoordinationRecord) -> bool,
) -> CoordinationRecord {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(r) = record(&e.admin).await {
            if seen.last() != Some(&r.phase) {
                seen.push(r.phase);
            }
            if pred(&r) {
                return r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} not within {limit:?}: {}",
            status(&e.admin).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The foreign policies of one node: the guards' priority and selector
/// with marks that differ only under their masks, and an ESP policy with
/// a tunnel-like selector. Allocation avoids aliasing them; nothing may
/// touch them.
fn install_foreign(node: &IpsecNode) {
    for args in [
        "xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 0x10000 mask 0xffff0000",
        "xfrm policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0x20 mask 0xf0",
        "xfrm policy add dir out src 10.97.0.1/32 dst 10.97.0.2/32 proto udp dport 6081 priority 100 mark 0x5 mask 0xff tmpl src 10.97.0.1 dst 10.97.0.2 proto esp reqid 3 mode transport",
    ] {
        let args: Vec<&str> = args.split_whitespace().collect();
        node.netns().ip(&args).unwrap();
    }
}

/// Every tunnel of every node (the node's index, the tunnel's name), as
/// the patched ovn-controller names them.
fn tunnels(nodes: &[AgentNode]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..nodes.len() {
        for (j, peer) in nodes.iter().enumerate() {
            if i != j {
                out.push((i, Tunnel::to(&peer.node, 0).name));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_disable_to_nothing_of_ours_and_enable_again() {
    harness::use_agent_binary!();
    let t0 = Instant::now();
    let mut e = env(3).await;
    let chassis: Vec<String> = e.fxs.iter().map(|f| f.chassis.clone()).collect();
    let chassis: Vec<&str> = chassis.iter().map(String::as_str).collect();
    let mut mesh = IpsecNode::mesh("koi-di", &chassis).unwrap();
    let free = std::mem::take(&mut mesh.nodes);
    let mut before = Vec::new();
    for n in &free {
        install_foreign(n);
        before.push(xfrm_dump(n));
    }
    let mut nodes: Vec<AgentNode> = free
        .into_iter()
        .zip(&e.fxs)
        .map(|(n, fx)| start_node(n, fx, &e.api, e.dir.path(), e.script, &AGENT_FLAGS))
        .collect();
    for n in &nodes {
        add_unrelated_keys(&n.node);
    }
    let mut seen = Vec::new();
    until(&e, "Enabled", Duration::from_secs(120), &mut seen, |r| {
        r.phase == Enabled
    })
    .await;
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            connect(&nodes[i], &nodes[j]);
        }
    }
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            both_ways_establish(&nodes[i], &nodes[j], "enabled");
        }
    }
    println!("Enabled, every pair established after {:?}", t0.elapsed());

    // The operator disables IPsec: the controller first.
    let t1 = Instant::now();
    seen.clear();
    restart_controller(&mut e, false).await;
    let disabling = until(&e, "Disabling", Duration::from_secs(30), &mut seen, |r| {
        r.phase == Disabling
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while nb_sb(&e.central).await != (false, false) {
        assert!(Instant::now() < deadline, "NB and SB not off");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("NB and SB off {:?} after the disable", t1.elapsed());
    // ovn-controller follows SB: every tunnel loses its intent and marks.
    for (i, name) in tunnels(&nodes) {
        nodes[i].node.unprotect_tunnel(&name).unwrap();
    }
    // The chart: the cleanup shape, rolled one node at a time.
    cc::set_template(&e.admin, &e.ds_uid, cc::Shape::Cleanup, CLEANUP_HASH).await;
    for (i, n) in nodes.iter_mut().enumerate() {
        roll_to_cleanup(&mut e, n, i, CLEANUP_HASH).await.unwrap();
        // Nothing is withdrawn before Release, which needs NB and SB off.
        let r = record(&e.admin).await.unwrap();
        assert!(
            matches!(r.phase, Release | Disabled),
            "{}: released in {:?}",
            n.node.chassis(),
            r.phase
        );
    }
    let disabled = until(&e, "Disabled", Duration::from_secs(30), &mut seen, |r| {
        r.phase == Disabled
    })
    .await;
    println!(
        "Disabled {:?} after the disable; phases {seen:?}",
        t1.elapsed()
    );
    // Cleanup lasts one coordinator pass and may fall between two polls;
    // the epochs show it was recorded: Disabling, Cleanup, Release,
    // Disabled are four consecutive epochs.
    seen.retain(|p| *p != Enabled);
    assert!(
        seen == vec![Disabling, Cleanup, Release, Disabled]
            || seen == vec![Disabling, Release, Disabled],
        "out of order: {seen:?}"
    );
    assert_eq!(disabled.epoch, disabling.epoch + 3, "a phase was skipped");
    assert_eq!(disabled.generation, disabling.generation);
    assert_eq!(nb_sb(&e.central).await, (false, false));
    for (i, n) in nodes.iter().enumerate() {
        let who = n.node.chassis();
        assert_eq!(
            xfrm_dump(&n.node),
            before[i],
            "{who}: XFRM differs from before the agent first ran"
        );
        assert_only_unrelated_left(&n.node);
    }
    let nodes_api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(e.admin.clone());
    for fx in &e.fxs {
        let ann = nodes_api
            .get(&fx.name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default();
        assert!(
            ann.contains_key(k8s::ANNOTATION_RELEASE_RECEIPT),
            "{}",
            fx.name
        );
    }

    // Enabled again: the chart reverted, new Pods, the same key
    // directories; no manual step.
    let t2 = Instant::now();
    seen.clear();
    restart_controller(&mut e, true).await;
    cc::set_template(&e.admin, &e.ds_uid, cc::Shape::Ipsec, REENABLED_HASH).await;
    for (i, n) in nodes.iter_mut().enumerate() {
        roll_to_ipsec(&mut e, n, i, REENABLED_HASH).await;
    }
    let enabled = until(
        &e,
        "Enabled again",
        Duration::from_secs(120),
        &mut seen,
        |r| r.phase == Enabled,
    )
    .await;
    println!("Enabled again {:?} after the re-enable", t2.elapsed());
    assert_eq!(enabled.generation, disabled.generation + 1, "a new cycle");
    for n in &nodes {
        n.wait("ready at Enabled", Duration::from_secs(30), |s| {
            s["protectionArmed"] == true && s["configurationApplied"] == true
        })
        .await;
    }
    // ovn-controller follows SB again: intent and the new leases' marks.
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            reconnect(&nodes[i], &nodes[j]);
        }
    }
    for i in 0..nodes.len() {
        for j in i + 1..nodes.len() {
            both_ways_establish(&nodes[i], &nodes[j], "re-enabled");
        }
    }
    no_auth_failures(&nodes.iter().collect::<Vec<_>>());
    println!("whole cycle {:?}", t0.elapsed());
}
