//! A simulated node running the agent as a process, for the tests that
//! need real IKE between agents (rotation, enable): its namespaces, its
//! ovsdb-server, the agent with its Pod-bound token and the real runtime
//! (strongSwan, the patched monitor), and the helpers that tie two such
//! nodes together on request, as the patched ovn-controller would, for the
//! tests without OVN central.
//!
//! The agent binary is the calling test crate's
//! ([`crate::use_agent_binary!`]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::controller_cluster as cc;
use crate::controller_cluster::coordination::flags;
use crate::ike_node::{Outcome, initiate, tear_down};
use crate::node::{AgentOptions, SimNode, cleanup_process};
use crate::ovn_controller::{OvnController, RunningOvnController};
use apiserver::{ADMIN_TOKEN, ApiServer};
use kube_ovn_ipsec_api::names::ovs;
use testbed::ipsec::{DEBIAN_MONITOR_SCRIPT, IpsecNode, Tunnel};
use testbed::netns::wait_for;
use testbed::overlay::{self, VSwitchd};
use testbed::ovs::OvnCentral;

/// Lines charon writes when a peer's authentication fails.
pub const AUTH_FAILURES: [&str; 4] = [
    "AUTHENTICATION_FAILED",
    "no trusted",
    "constraint check failed",
    "signature validation failed",
];

/// One node running the agent as a process: the harness's one simulated
/// node, as the tests start it ([`start_node`]).
pub type AgentNode = crate::node::SimNode;

/// Requires, by name, the programs every agent node runs (strongSwan,
/// ovsdb-server and its tools, nsenter, and patch for the monitor) and
/// `more`; returns the patched ovs-monitor-ipsec script the nodes run.
pub fn prerequisites(more: &[&str]) -> &'static Path {
    let base = [
        "ipsec",
        "ovsdb-server",
        "ovs-vsctl",
        "ovs-appctl",
        "nsenter",
        "patch",
    ];
    for p in base.iter().chain(more) {
        testbed::require_program(p).unwrap();
    }
    assert!(Path::new(DEBIAN_MONITOR_SCRIPT).exists());
    testbed::ipsec::patched_monitor_script(&std::env::temp_dir()).unwrap()
}

/// Starts node `node`'s ovsdb-server and its agent as `fx`'s Pod.
pub fn start_node(
    node: IpsecNode,
    fx: &cc::NodeFx,
    api: &apiserver::ApiServerHandle,
    dir: &Path,
    script: &Path,
    extra: &[&str],
) -> AgentNode {
    start_node_with(node, fx, api, dir, script, extra, Vec::new())
}

/// [`start_node`], with `env` added to the agent's environment (the chaos
/// suite's stop file): the node's files under `dir/<node>`, the agent
/// started with [`AgentOptions::test`] and this test crate's binary.
pub fn start_node_with(
    node: IpsecNode,
    fx: &cc::NodeFx,
    api: &apiserver::ApiServerHandle,
    dir: &Path,
    script: &Path,
    extra: &[&str],
    env: Vec<(String, String)>,
) -> AgentNode {
    let mut n = prepare_node(node, fx, dir);
    start_agent_with(&mut n, fx, api, script, extra, env);
    n
}

/// Node `node`'s ovsdb-server and `br-int`, its files under
/// `dir/<fx's name>`, no agent yet: for a test that starts something the
/// agent needs first (a real ovn-controller, whose running daemon the
/// agent's capability gate asks).
pub fn prepare_node(node: IpsecNode, fx: &cc::NodeFx, dir: &Path) -> AgentNode {
    SimNode::prepare_in(node, dir.join(&fx.name)).unwrap()
}

/// Starts the agent on a [`prepare_node`]d node as `fx`'s Pod, with
/// [`AgentOptions::test`] and this test crate's binary.
pub fn start_agent_with(
    n: &mut AgentNode,
    fx: &cc::NodeFx,
    api: &apiserver::ApiServerHandle,
    script: &Path,
    extra: &[&str],
    env: Vec<(String, String)>,
) {
    n.start_agent(
        crate::binaries::agent(),
        fx,
        api,
        script,
        &AgentOptions::test(extra, env),
    )
    .unwrap();
}

/// The overlay of prepared nodes ([`prepare_node`]): ovs-vswitchd on the
/// kernel datapath and pod `pod0` (address `pods[i]`) on each, then
/// ovn-controller on each (from `central`), before the agents start (a
/// real one's daemon is what their capability gate asks). Drop the
/// ovn-controllers before the switches and databases they drive.
pub fn attach_overlay(
    ovn: &OvnController,
    central: &OvnCentral,
    nodes: &[&AgentNode],
    pods: &[std::net::Ipv4Addr],
) -> (Vec<VSwitchd>, Vec<RunningOvnController>) {
    let mut vswitchds = Vec::new();
    for (n, pod) in nodes.iter().zip(pods) {
        vswitchds.push(VSwitchd::start(&n.node).unwrap());
        overlay::add_pod(&n.node, "pod0", &format!("{pod}/24")).unwrap();
    }
    let players = nodes
        .iter()
        .zip(pods)
        .map(|(n, pod)| ovn.attach(*n, central, Some(*pod)).unwrap())
        .collect();
    (vswitchds, players)
}

/// IPsec on through NB for agents that arm at start (no cluster
/// coordination), as an operator turns it; returns once ovn-controller gave
/// every node's tunnels their intent with its lease.
pub fn ipsec_on(ovn: &OvnController, central: &OvnCentral, nodes: &[&AgentNode]) {
    central.set_ipsec(true).unwrap();
    for n in nodes {
        assert!(
            ovn.give_intent(nodes, n).unwrap(),
            "{}: no lease published",
            n.node.chassis()
        );
    }
}

/// Adds each node's tunnel to the other, with its lease, as the patched
/// ovn-controller would ([`OvnController::connect`]), and waits until the
/// monitor routed the conns.
pub fn connect(a: &AgentNode, b: &AgentNode) {
    OvnController::Emulated.connect(a, b).unwrap();
    wait_routed(a, b);
}

/// Gives each node's existing tunnel to the other IPsec intent again, with
/// its (new) lease, as the patched ovn-controller does when
/// `SB_Global.ipsec` turns true ([`OvnController::reconnect`]), and waits
/// until the conns are routed.
pub fn reconnect(a: &AgentNode, b: &AgentNode) {
    OvnController::Emulated.reconnect(a, b).unwrap();
    wait_routed(a, b);
}

/// Waits until each node's monitor routed its conns to the other.
fn wait_routed(a: &AgentNode, b: &AgentNode) {
    for (n, peer) in [(a, b), (b, a)] {
        let name = Tunnel::to(&peer.node, 0).name;
        wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
            let routed = n.node.routed_conns().ok()?;
            (routed.iter().filter(|c| c.starts_with(&name)).count() >= 2).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "conns of {name} not routed:\n{}\n{}",
                n.logs(),
                n.node.diagnostics()
            )
        });
    }
}

/// An IKE_SA initiated from each side in turn comes up; torn down after.
pub fn both_ways_establish(a: &AgentNode, b: &AgentNode, when: &str) {
    for (from, to, who) in [(a, b, "A→B"), (b, a, "B→A")] {
        let (outcome, waited) = initiate(
            &from.node,
            from.lease().expect("a published lease").0,
            &to.node,
        );
        let Some(Outcome::Established(sa)) = outcome else {
            panic!(
                "{when}, {who}: {outcome:?}\n{}\n{}",
                from.node.diagnostics(),
                to.node.diagnostics()
            )
        };
        println!(
            "{when}, {who}: IKE_SA {} ESTABLISHED after {waited:?}",
            sa.conn
        );
        tear_down(&from.node, &to.node);
    }
}

/// Asserts that no node's charon logged an authentication failure
/// ([`AUTH_FAILURES`]).
pub fn no_auth_failures(nodes: &[&AgentNode]) {
    for n in nodes {
        let log = n.node.charon_log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| AUTH_FAILURES.iter().any(|p| l.contains(p)))
            .collect();
        assert!(
            bad.is_empty(),
            "{}: authentication failures in charon's log:\n{}",
            n.node.chassis(),
            bad.join("\n")
        );
    }
}

/// Whether `n` has its lease published in OVSDB.
pub fn lease_published(n: &AgentNode) -> bool {
    n.node
        .vsctl(&[
            "get",
            "Open_vSwitch",
            ".",
            &format!("external_ids:{}", ovs::EXTERNAL_ID_PROTECTION_LEASE),
        ])
        .is_ok()
}

/// The agents' coordination flags.
pub const AGENT_FLAGS: [&str; 4] = ["--coordination", "cluster", "--pod-template-hash", cc::HASH];

/// Everything but the nodes: API server (RBAC on) with `nodes` populated,
/// OVN central, the real controller.
pub struct Env {
    // Field order is drop order: the controller before what it talks to.
    /// The in-process controller (aborted on drop).
    pub controller: tokio::task::JoinHandle<()>,
    /// The cluster admin's client.
    pub admin: kube::Client,
    /// The embedded API server (RBAC on).
    pub api: apiserver::ApiServerHandle,
    /// OVN NB and SB with ovn-northd.
    pub central: OvnCentral,
    /// The cluster's nodes, each with its CNI Pod and token.
    pub fxs: Vec<cc::NodeFx>,
    /// The kube-ovn-cni DaemonSet's UID.
    pub ds_uid: String,
    /// The patched ovs-monitor-ipsec the nodes run.
    pub script: &'static Path,
    /// Where each node's files live (`<dir>/<node>/`).
    pub dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        // A dropped JoinHandle detaches; the controller must stop first.
        self.controller.abort();
    }
}

/// [`env_with`] without extra controller flags.
pub async fn env(nodes: usize) -> Env {
    env_with(nodes, &[]).await
}

/// [`env`], the controller started with `controller_flags` added (the
/// overlay kills' `--ca-reload`, so a CA rotation is picked up at once).
pub async fn env_with(nodes: usize, controller_flags: &[&str]) -> Env {
    let script = prerequisites(&["ovn-northd"]);
    let dir = tempfile::tempdir().unwrap();
    let central = OvnCentral::start(dir.path()).unwrap();
    let api = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = api.client(ADMIN_TOKEN).await.unwrap();
    let (fxs, ds_uid) = cc::populate(&api, &admin, nodes).await;
    let (nb, sb) = (central.nb.address(), central.sb.address());
    let mut controller_args = flags(&nb, &sb, "controller-0");
    controller_args.extend_from_slice(controller_flags);
    let (controller, _) = crate::cluster::start_controller(&api, &admin, &controller_args).await;
    Env {
        controller,
        admin,
        api,
        central,
        fxs,
        ds_uid,
        script,
        dir,
    }
}

/// Restarts the in-process controller as the same replica wanting
/// `enable` (the operator changed `--enable-ipsec`, or the replica crashed:
/// an aborted task makes no last write).
pub async fn restart_controller(e: &mut Env, enable: bool) {
    e.controller.abort();
    let (nb, sb) = (e.central.nb.address(), e.central.sb.address());
    let (controller, _) = crate::cluster::start_controller(
        &e.api,
        &e.admin,
        &crate::controller_cluster::coordination::flags_wanting(enable, &nb, &sb, "controller-0"),
    )
    .await;
    e.controller = controller;
}

/// What rolling a node's Pod touches besides the node: the API server,
/// its admin client, the DaemonSet's UID and the directory under which
/// each node's kubeconfig is written (`<dir>/<node>/kubeconfig`).
pub struct Rollout<'a> {
    /// The API server.
    pub api: &'a apiserver::ApiServerHandle,
    /// Its admin client.
    pub admin: &'a kube::Client,
    /// The DaemonSet's UID (the new Pod's owner).
    pub ds_uid: &'a str,
    /// Where the nodes' kubeconfigs are written.
    pub dir: &'a Path,
}

impl Rollout<'_> {
    /// Node `i` (`n`, Pod fixture `fx`) rolled to the cleanup shape of
    /// template `hash`, as the DaemonSet controller and the kubelet do it
    /// (the template itself is the caller's, `cc::set_template`): the agent
    /// stopped (SIGTERM), the Pod replaced, its `ipsec-cleanup` init
    /// container run (each run waiting at most `wait_secs` for what the
    /// rollout still changes) until it exits 0, each exit reported in the
    /// Pod's status. Returns the runs it took; fails, with the last run's
    /// log, after `attempts`.
    pub async fn to_cleanup(
        &self,
        n: &mut AgentNode,
        fx: &mut cc::NodeFx,
        i: usize,
        hash: &str,
        wait_secs: u64,
        attempts: usize,
    ) -> Result<usize, String> {
        n.stop_agent();
        cc::replace_pod(
            self.api,
            self.admin,
            self.ds_uid,
            fx,
            i,
            cc::Shape::Cleanup,
            hash,
        )
        .await;
        let kubeconfig = self.dir.join(&fx.name).join("kubeconfig");
        self.api.write_kubeconfig(&kubeconfig, &fx.token).unwrap();
        cc::set_cleanup_init_of(self.admin, &fx.pod_name, None).await;
        let mut runs = 0;
        loop {
            runs += 1;
            // Blocks for as long as the cleanup waits: off the runtime's
            // workers, which the in-process controller needs meanwhile.
            let out = tokio::task::block_in_place(|| {
                run_cleanup(&n.node, fx, &n.key_dir, &kubeconfig, hash, wait_secs)
            });
            let code = out.status.code().unwrap_or(1);
            cc::set_cleanup_init_of(self.admin, &fx.pod_name, Some(code)).await;
            if code == 0 {
                return Ok(runs);
            }
            if runs >= attempts {
                return Err(format!(
                    "{}: cleanup failed {runs} time(s); the last run's log:\n{}",
                    n.node.chassis(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
}

/// Node `i` of `e` rolled to the cleanup shape of template `hash`
/// ([`Rollout::to_cleanup`], 60 s a run, at most three runs).
pub async fn roll_to_cleanup(
    e: &mut Env,
    n: &mut AgentNode,
    i: usize,
    hash: &str,
) -> Result<usize, String> {
    let Env {
        api,
        admin,
        ds_uid,
        dir,
        fxs,
        ..
    } = e;
    let rollout = Rollout {
        api,
        admin,
        ds_uid,
        dir: dir.path(),
    };
    rollout.to_cleanup(n, &mut fxs[i], i, hash, 60, 3).await
}

/// Node `i` rolled back to the IPsec shape of template `hash`: a new Pod,
/// and the agent started again as it on the same key directory (the
/// template itself is the caller's, `cc::set_template`).
pub async fn roll_to_ipsec(e: &mut Env, n: &mut AgentNode, i: usize, hash: &str) {
    let fx = &mut e.fxs[i];
    cc::replace_pod(&e.api, &e.admin, &e.ds_uid, fx, i, cc::Shape::Ipsec, hash).await;
    let flags = ["--coordination", "cluster", "--pod-template-hash", hash];
    n.respawn(crate::binaries::agent(), fx, &e.api, e.script, &flags)
        .unwrap();
}

/// Runs the chart's `ipsec-cleanup` init container on `node` as `fx`'s
/// (cleanup) Pod of template `hash`, with its kubeconfig `kubeconfig`,
/// waiting at most
/// `wait_secs` for what the rollout still changes.
pub fn run_cleanup(
    node: &IpsecNode,
    fx: &cc::NodeFx,
    key_dir: &Path,
    kubeconfig: &Path,
    hash: &str,
    wait_secs: u64,
) -> std::process::Output {
    let t = Instant::now();
    let out = cleanup_command(node, fx, key_dir, kubeconfig, hash, wait_secs)
        .output()
        .unwrap();
    println!(
        "{}: cleanup exited {:?} after {:?}",
        node.chassis(),
        out.status.code(),
        t.elapsed()
    );
    out
}

/// The command [`run_cleanup`] runs (logging at info to stderr).
pub fn cleanup_command(
    node: &IpsecNode,
    fx: &cc::NodeFx,
    key_dir: &Path,
    kubeconfig: &Path,
    hash: &str,
    wait_secs: u64,
) -> std::process::Command {
    let cleanup = cleanup_process(node, fx, key_dir, kubeconfig, Some(hash), wait_secs).unwrap();
    let mut cmd = cleanup.command(crate::binaries::agent());
    cmd.env("RUST_LOG", "info");
    cmd
}

/// `ip xfrm policy list` and `ip xfrm state list` of `node`, verbatim.
pub fn xfrm_dump(node: &IpsecNode) -> String {
    node.xfrm_dump().unwrap()
}

/// `Open_vSwitch .` map `column` of `node` (`external_ids`, `other_config`).
pub fn ovs_map(node: &IpsecNode, column: &str) -> std::collections::BTreeMap<String, String> {
    let raw = node
        .vsctl(&["get", "Open_vSwitch", ".", column])
        .unwrap_or_default();
    crate::cluster::parse_ovs_map(raw.trim())
}

/// One key in each of `external_ids` and `other_config` that nothing of
/// this project owns: a disable must leave them ([`assert_only_unrelated_left`]).
pub fn add_unrelated_keys(node: &IpsecNode) {
    node.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        "external_ids:unrelated=keep-me",
        "other_config:unrelated=keep-me-too",
    ])
    .unwrap();
}

/// After a disable: no lease key in `external_ids`, no identity path in
/// `other_config`, the chassis and [`add_unrelated_keys`]' keys kept.
pub fn assert_only_unrelated_left(node: &IpsecNode) {
    if let Err(e) = only_unrelated_left(node) {
        panic!("{}: {e}", node.chassis());
    }
}

/// [`assert_only_unrelated_left`]'s check: what differs, if anything.
pub fn only_unrelated_left(node: &IpsecNode) -> Result<(), String> {
    let who = node.chassis();
    let ext = ovs_map(node, "external_ids");
    let other = ovs_map(node, "other_config");
    let mut wrong = Vec::new();
    wrong.extend(
        ovs::PROTECTION_KEYS
            .iter()
            .filter(|k| ext.contains_key(**k))
            .map(|k| format!("{k} left in external_ids")),
    );
    wrong.extend(
        ovs::IDENTITY_KEYS
            .iter()
            .filter(|k| other.contains_key(**k))
            .map(|k| format!("{k} left in other_config")),
    );
    if ext.get("unrelated").map(String::as_str) != Some("keep-me") {
        wrong.push("external_ids:unrelated lost".into());
    }
    if ext.get(ovs::EXTERNAL_ID_SYSTEM_ID).map(String::as_str) != Some(who) {
        wrong.push("external_ids:system-id lost".into());
    }
    if other.get("unrelated").map(String::as_str) != Some("keep-me-too") {
        wrong.push("other_config:unrelated lost".into());
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {ext:?} {other:?}", wrong.join(", ")))
    }
}

/// PIDs of `root` and all its descendants.
pub fn process_tree(root: u32) -> Vec<i32> {
    let mut out = vec![i32::try_from(root).unwrap()];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(parent) && !out.contains(&pid) {
                out.push(pid);
            }
        }
        i += 1;
    }
    out
}

/// SIGKILLs the agent and everything it started (starter, charon, the
/// monitor): what a node crash or an OOM kill of the container does.
pub fn kill_tree(n: &mut AgentNode) {
    if let Some(agent) = n.agent_mut() {
        kill_tree_of(agent);
    }
}

/// SIGKILLs `agent` and all its descendants and waits until they are gone.
pub fn kill_tree_of(agent: &mut Child) {
    let pids = process_tree(agent.id());
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = agent.wait();
    wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        pids.iter()
            .all(|p| kube_ovn_ipsec_runtime::pidfile::proc_comm(*p).is_none())
            .then_some(())
    })
    .expect("the agent's processes did not die");
}

/// Writes the coordination record `r` (creating or replacing it), as the
/// controller would.
pub async fn write_record(
    admin: &kube::Client,
    r: &kube_ovn_ipsec_api::coordination::CoordinationRecord,
) {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(admin.clone(), cc::NS);
    let cm = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(kube_ovn_ipsec_api::names::k8s::COORDINATION_CONFIGMAP.into()),
            ..Default::default()
        },
        data: Some(std::collections::BTreeMap::from([(
            kube_ovn_ipsec_api::names::k8s::COORDINATION_CONFIGMAP_KEY.to_owned(),
            r.encode().unwrap(),
        )])),
        ..Default::default()
    };
    match api
        .get_opt(kube_ovn_ipsec_api::names::k8s::COORDINATION_CONFIGMAP)
        .await
        .unwrap()
    {
        None => {
            api.create(&kube::api::PostParams::default(), &cm)
                .await
                .unwrap();
        }
        Some(old) => {
            let mut cm = cm;
            cm.metadata.resource_version = old.metadata.resource_version;
            api.replace(
                kube_ovn_ipsec_api::names::k8s::COORDINATION_CONFIGMAP,
                &kube::api::PostParams::default(),
                &cm,
            )
            .await
            .unwrap();
        }
    }
}
