//! `kube-ovn-ipsec cleanup` against the real parts (SPEC §8): the embedded
//! API server with RBAC on and the real controller signing, a node with
//! its own ovsdb-server, real strongSwan and the patched monitor run by a
//! real agent, kernel XFRM in the node's namespace.
//!
//! The agent arms (lease, guards, identity), a protected tunnel makes
//! charon install its policies under the lease, and the whole agent tree
//! is SIGKILLed — charon included, so its policies stay in the kernel as
//! crash orphans. Then, with the coordination record written by hand in
//! `Release` (the controller's side is tested in the controller crate):
//! cleanup refuses while a tunnel still carries IPsec options, while a
//! control socket answers, and while a foreign policy carries the lease's
//! mark — each time with the guards kept and nothing withdrawn — and then
//! removes exactly the node's own state: the XFRM policy dump is
//! byte-identical to the one taken before the agent ever ran (foreign
//! policies installed beforehand untouched), OVSDB keeps every unrelated
//! key, and the Node carries a release receipt that verifies with the
//! node's certificate and answers the record. A fresh node with no state
//! exits 0 at once and touches nothing. The kernel here has no ESP, so
//! SAs are the guest kernel's test; policies are asserted here.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;
use harness::ike_node;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use agent_node::{
    add_unrelated_keys, assert_only_unrelated_left, kill_tree, ovs_map, prerequisites, run_cleanup,
    start_node, write_record, xfrm_dump,
};
use apiserver::{ADMIN_TOKEN, ApiServer};
use harness::controller_cluster as cc;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_ovn_ipsec_api::coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, ReleaseReceipt,
};
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::{exit_code, k8s, ovs};
use kube_ovn_ipsec_api::signed;
use kube_ovn_ipsec_api::time::Timestamp;
use testbed::ipsec::{IpsecNode, Tunnel};
use testbed::netns::wait_for;

/// The cleanup Pod's template hash in the record.
const CLEANUP_HASH: &str = "5c1ea2b7f";

fn ip_xfrm(node: &IpsecNode, args: &str) {
    let args: Vec<&str> = std::iter::once("xfrm")
        .chain(args.split_whitespace())
        .collect();
    node.netns()
        .ip(&args)
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
}

/// Foreign policies installed before the agent runs: the guards' priority
/// and selector with marks that differ only under their mask, and a reqid
/// neighbour on a tunnel-like selector. Allocation avoids aliasing them;
/// cleanup must neither remove nor blame them.
fn install_foreign(node: &IpsecNode) {
    ip_xfrm(
        node,
        "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 0x10000 mask 0xffff0000",
    );
    ip_xfrm(
        node,
        "policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0x20 mask 0xf0",
    );
    ip_xfrm(
        node,
        "policy add dir out src 10.97.0.1/32 dst 10.97.0.2/32 proto udp dport 6081 priority 100 mark 0x5 mask 0xff tmpl src 10.97.0.1 dst 10.97.0.2 proto esp reqid 3 mode transport",
    );
}

/// The Release record that asks `fx` to release.
fn release_record(fx: &cc::NodeFx, ds_uid: &str) -> CoordinationRecord {
    let mut r = CoordinationRecord::initial();
    r.generation = 2;
    r.epoch = 11;
    r.phase = CoordinationPhase::Release;
    r.daemon_set_uid = Some(Uid::new(ds_uid.to_owned()).unwrap());
    r.template_hash = Some(CLEANUP_HASH.into());
    r.challenge = Some(Challenge::from_bytes([0x5a; 32]));
    r.nb_global_uuid = Some(uuid::Uuid::from_bytes([1; 16]));
    r.sb_global_uuid = Some(uuid::Uuid::from_bytes([2; 16]));
    r.targets
        .insert(fx.name.clone(), Uid::new(fx.uid.clone()).unwrap());
    r
}

/// Runs `kube-ovn-ipsec cleanup` as `fx`'s cleanup Pod on `node`.
fn cleanup(
    node: &IpsecNode,
    fx: &cc::NodeFx,
    key_dir: &Path,
    kubeconfig: &Path,
    wait_secs: u64,
) -> Output {
    run_cleanup(node, fx, key_dir, kubeconfig, CLEANUP_HASH, wait_secs)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused_with(o: &Output, needle: &str) {
    let log = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(exit_code::CLEANUP_NOT_SAFE),
        "expected a refusal naming {needle:?}:\n{log}"
    );
    assert!(log.contains(needle), "no {needle:?} in:\n{log}");
}

/// The guards of `mark` are both in the kernel.
fn guards_present(node: &IpsecNode, mark: u32) -> bool {
    let dump = node.netns().ip(["xfrm", "policy", "list"]).unwrap();
    dump.matches(&format!("mark {mark:#x}/0xffffffff")).count() >= 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_exactly_the_nodes_own_state_and_refuses_what_it_cannot_prove() {
    harness::use_agent_binary!();
    let script = prerequisites(&[]);
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = api.client(ADMIN_TOKEN).await.unwrap();
    let (fxs, ds_uid) = cc::populate(&api, &admin, 1).await;
    let fx = &fxs[0];
    // The controller signs; it coordinates nothing (no OVN addresses).
    let (controller, _) = harness::cluster::start_controller(&api, &admin, &[]).await;
    let mut mesh = IpsecNode::mesh("koi-cu", &[fx.chassis.as_str(), "chassis-peer"]).unwrap();
    let peer = mesh.nodes.pop().unwrap();
    let node = mesh.nodes.pop().unwrap();

    install_foreign(&node);
    let before = xfrm_dump(&node);
    let mut n = start_node(
        node,
        fx,
        &api,
        dir.path(),
        script,
        &["--sa-observe-period", "1"],
    );
    add_unrelated_keys(&n.node);
    n.wait("armed and active", Duration::from_secs(90), |_| true)
        .await;
    let (mark, reqid) = n.lease().expect("a published lease");
    println!("lease: mark {mark:#x} reqid {reqid}");

    // A protected tunnel, as the patched ovn-controller sets it: the
    // monitor routes the conns and charon installs policies under the
    // lease; the agent records the tunnel.
    n.node
        .add_tunnel(&Tunnel {
            mark,
            reqid,
            ..Tunnel::to(&peer, 0)
        })
        .unwrap();
    let observations = n
        .key_dir
        .join(kube_ovn_ipsec_runtime::sa::OBSERVATIONS_FILE);
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        let policies = n.node.netns().ip(["xfrm", "policy", "list"]).ok()?;
        let recorded = kube_ovn_ipsec_runtime::sa::load(&n.key_dir).ok()??;
        (policies.contains(&format!("reqid {reqid}")) && !recorded.tunnels.is_empty()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "no charon policy under the lease, or no tunnel recorded in {}:\n{}\n{}",
            observations.display(),
            n.logs(),
            n.node.diagnostics()
        )
    });
    let orphans = n
        .node
        .netns()
        .ip(["xfrm", "policy", "list"])
        .unwrap()
        .matches(&format!("reqid {reqid}"))
        .count();
    println!("charon installed {orphans} policies under the lease");

    // While the agent runs, a cleanup given another key directory, in a
    // mount namespace of its own (another container), is refused: the
    // node's claim lives in its network namespace, not in a directory.
    let elsewhere_keys = dir.path().join("other-container-keys");
    let cmd = agent_node::cleanup_command(
        &n.node,
        fx,
        &elsewhere_keys,
        &dir.path().join("no-kubeconfig"),
        CLEANUP_HASH,
        1,
    );
    let o = own_mount_namespace(cmd, None).output().unwrap();
    refused_with(&o, "already owned by the agent");
    assert!(!elsewhere_keys.exists());
    assert!(guards_present(&n.node, mark));

    // The crash: the agent and everything it started die at once.
    kill_tree(&mut n);
    assert!(
        n.node
            .netns()
            .ip(["xfrm", "policy", "list"])
            .unwrap()
            .contains(&format!("reqid {reqid}")),
        "charon's policies are the crash orphans this test needs"
    );
    let kubeconfig = dir.path().join(&fx.name).join("kubeconfig");

    // No record at all, yet the node holds a lease: not "never enabled"
    // (a wrong --coordination-namespace, or a deleted record). Refused with
    // its own reason, the lease and guards kept — never guards added and
    // then left behind with an exit 0.
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 2);
    refused_with(&o, "NoCoordinationRecord");
    assert!(!stderr(&o).contains("never enabled"), "{}", stderr(&o));
    assert!(guards_present(&n.node, mark));
    assert!(ovs_map(&n.node, "external_ids").contains_key(ovs::EXTERNAL_ID_PROTECTION_LEASE));

    // The wrong key directory (a changed OVN_IPSEC_KEY_DIR): it does not
    // exist, but OVSDB publishes the lease — refused, naming both, and the
    // directory is not created.
    let wrong = dir.path().join("var-lib-keys");
    let o = cleanup(&n.node, fx, &wrong, &kubeconfig, 1);
    refused_with(&o, "KeyDirectoryMissing");
    assert!(
        stderr(&o).contains(&wrong.display().to_string()),
        "{}",
        stderr(&o)
    );
    assert!(!wrong.exists());
    assert!(guards_present(&n.node, mark));

    // Enabled without this node (a joiner armed for an admission): it
    // holds state, so it waits for the disable instead of leaving it.
    let mut enabled = release_record(fx, &ds_uid);
    (enabled.phase, enabled.challenge) = (CoordinationPhase::Enabled, None);
    (enabled.nb_global_uuid, enabled.sb_global_uuid) = (None, None);
    enabled.targets.clear();
    enabled.trust_hash = Some(kube_ovn_ipsec_api::digest::Sha256Digest::from_bytes(
        [1; 32],
    ));
    write_record(&admin, &enabled).await;
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 1);
    refused_with(&o, "holds this project's state");
    assert!(guards_present(&n.node, mark));

    let record = release_record(fx, &ds_uid);
    write_record(&admin, &record).await;

    // The tunnel still carries IPsec intent: wait, then refuse.
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 1);
    refused_with(&o, "TunnelsNotConverged");
    assert!(guards_present(&n.node, mark));
    let tunnel = Tunnel::to(&peer, 0).name;
    n.node.unprotect_tunnel(&tunnel).unwrap();

    // A control socket answers: the IKE daemon is not gone.
    let ctl = n.node.run_path("charon.ctl");
    let _ = std::fs::remove_file(&ctl);
    let listener = std::os::unix::net::UnixListener::bind(&ctl).unwrap();
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 1);
    refused_with(&o, "IkeDaemonRunning");
    drop(listener);
    std::fs::remove_file(&ctl).unwrap();

    // A foreign policy carrying the lease's mark on a selector this node
    // never recorded: a foreign owner, named; nothing withdrawn.
    ip_xfrm(
        &n.node,
        &format!(
            "policy add dir out src 10.96.0.1/32 dst 10.96.0.9/32 priority 50 mark {mark:#x} mask 0xffffffff action block"
        ),
    );
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 1);
    refused_with(&o, "ForeignOwner");
    assert!(stderr(&o).contains("10.96.0.9"), "{}", stderr(&o));
    assert!(guards_present(&n.node, mark));
    assert!(ovs_map(&n.node, "external_ids").contains_key(ovs::EXTERNAL_ID_PROTECTION_LEASE));
    ip_xfrm(
        &n.node,
        &format!(
            "policy delete dir out src 10.96.0.1/32 dst 10.96.0.9/32 mark {mark:#x} mask 0xffffffff"
        ),
    );

    // A lease file that is a symbolic link is refused, never followed:
    // the file it points to keeps its mode and content.
    let lease_file = n.key_dir.join(kube_ovn_ipsec_runtime::lease::LEASE_FILE);
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::rename(&lease_file, &elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &lease_file).unwrap();
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 1);
    refused_with(&o, "symbolic link");
    assert_eq!(
        std::fs::metadata(&elsewhere).unwrap().permissions().mode() & 0o777,
        0o644,
        "the link was followed"
    );
    assert!(guards_present(&n.node, mark));
    std::fs::remove_file(&lease_file).unwrap();
    std::fs::rename(&elsewhere, &lease_file).unwrap();
    std::fs::set_permissions(&lease_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Everything holds: exactly the node's own state goes — here as a
    // node the Release does not list (the disable never saw its claim),
    // which releases on its own after the same checks (a target's path is
    // the coordination tests').
    let mut unasked = record.clone();
    unasked.targets.clear();
    write_record(&admin, &unasked).await;
    let leaf = n.leaf();
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 10);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let after = xfrm_dump(&n.node);
    assert_eq!(
        after, before,
        "the XFRM dump differs from the one before the agent ran"
    );
    assert_only_unrelated_left(&n.node);
    assert!(
        !n.key_dir
            .join(kube_ovn_ipsec_runtime::lease::LEASE_FILE)
            .exists()
    );

    // The release receipt: signed by the node's key, answering the record.
    let nodes: Api<Node> = Api::all(admin.clone());
    let annotation = nodes
        .get(&fx.name)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(k8s::ANNOTATION_RELEASE_RECEIPT)
        .expect("no release receipt on the Node");
    let receipt: ReleaseReceipt = signed::verify(&annotation, &leaf).unwrap();
    // It names the live Node and answers this Release: had the disable
    // listed the node, it would count.
    assert_eq!(receipt.node_uid.as_str(), fx.uid);
    receipt
        .check_against(
            &record,
            Timestamp::from_unix(receipt.observed.unix()).unwrap(),
        )
        .unwrap();
    assert_eq!(receipt.pod_uid.as_str(), fx.pod_uid);
    assert_eq!(receipt.template_hash, CLEANUP_HASH);
    assert!(receipt.status.complete());

    // Run again (the init container restarted): nothing left to withdraw,
    // nothing touched.
    let o = cleanup(&n.node, fx, &n.key_dir, &kubeconfig, 5);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(xfrm_dump(&n.node), before);

    // A node whose OVSDB is not up: whether it holds anything is OVSDB's
    // to say, so the cleanup waits for it, then refuses naming where it
    // looked — never an exit 0 on no evidence.
    let fresh = dir.path().join("fresh-keys");
    let o = cleanup(&peer, fx, &fresh, &kubeconfig, 1);
    refused_with(&o, "OvsdbUnavailable");
    assert!(
        stderr(&o).contains(&peer.run_path("openvswitch/db.sock").display().to_string()),
        "{}",
        stderr(&o)
    );
    let _peer_ovsdb = ike_node::start_ovsdb(
        &peer,
        &kube_ovn_ipsec_runtime::process::Launcher::nsenter(peer.netns().holder_pid()),
    );
    peer.vsctl(&["init"]).unwrap();

    // A fresh node: no key directory, no state — exit 0, nothing created.
    let o = cleanup(&peer, fx, &fresh, &kubeconfig, 1);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to release"), "{}", stderr(&o));
    assert!(!fresh.exists());

    // A read-only key directory with no state (an empty read-only mount):
    // nothing to release — exit 0, not a crash-looping init container.
    let read_only = dir.path().join("ro-keys");
    std::fs::create_dir(&read_only).unwrap();
    let cmd = agent_node::cleanup_command(&peer, fx, &read_only, &kubeconfig, CLEANUP_HASH, 1);
    let o = own_mount_namespace(cmd, Some(&read_only)).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));

    // An unusable state file alone: nothing to release, and a read-only
    // run changes nothing — the file is not moved aside.
    let corrupt = dir.path().join("corrupt-keys");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join("state.json"), b"{ not json").unwrap();
    let o = cleanup(&peer, fx, &corrupt, &kubeconfig, 1);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to release"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(corrupt.join("state.json")).unwrap(),
        b"{ not json"
    );
    let names: Vec<String> = std::fs::read_dir(&corrupt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("corrupt-")),
        "the state file was moved aside: {names:?}"
    );
    controller.abort();
}

/// `cmd` run in a mount namespace of its own (as another container runs),
/// where `read_only`, if given, is a read-only bind mount of itself (a
/// read-only hostPath); gone with the process.
fn own_mount_namespace(
    cmd: std::process::Command,
    read_only: Option<&Path>,
) -> std::process::Command {
    let mut wrapped = std::process::Command::new("unshare");
    wrapped.args(["-m", "--propagation", "private"]);
    if let Some(dir) = read_only {
        wrapped
            .args(["sh", "-c"])
            .arg(r#"mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@""#)
            .arg(dir);
    }
    wrapped.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    wrapped
}
