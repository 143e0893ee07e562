//! The cleanup init container SIGKILLed at each step of a release
//! (`runtime::cleanup::Point`), on the real parts: the embedded API server
//! with RBAC on and the real controller signing, a node with its own
//! ovsdb-server, the agent with real strongSwan and the patched monitor,
//! kernel XFRM in the node's namespace (docs/chaos.md).
//!
//! Each round arms the node (lease, guards, identity), gives a tunnel
//! IPsec intent so charon installs its policies under the lease, crashes
//! the whole agent tree (charon's policies stay: the crash orphans a
//! release must remove), writes the `Release` record that asks this node,
//! and runs `kube-ovn-ipsec cleanup` — the chaos build, which stops itself
//! at the round's point (`chaos::inject::StopFile`) — and SIGKILLs it there. Then, at the kill:
//! while OVSDB still publishes the lease both guards are armed (2); the
//! foreign policies are untouched (5); a release receipt on the Node means
//! nothing of the node's state is left (6); no half-written file (3), no
//! key material in the log (7). The kubelet's restart of the init container
//! is a plain run, which must exit 0 (4), after which the XFRM dump is the
//! one taken before the agent first ran, OVSDB keeps only what is not
//! this project's, and the Node carries a fresh receipt that verifies with
//! the node's certificate and answers the record (5, 6). The last point
//! runs twice: once restarted under `Release`, once after the record went
//! on to `Disabled`.
//!
//! The kernel here has no ESP: charon's SAs are the guest kernel's test;
//! its policies are asserted here. Ignored by the workspace run:
//! scripts/test.sh runs it in the chaos section.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;
mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use agent_node::{
    AgentNode, add_unrelated_keys, cleanup_command, kill_tree, ovs_map, prerequisites, run_cleanup,
    start_node, write_record, xfrm_dump,
};
use apiserver::{ADMIN_TOKEN, ApiServer};
use chaos::check;
use chaos::inject::{STOPPED, StopFile};
use chaos::report::{Row, print_run};
use common::until_stopped;
use harness::controller_cluster as cc;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_ovn_ipsec_api::coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, ReleaseReceipt,
};
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::{k8s, ovs};
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_api::signed;
use kube_ovn_ipsec_api::time::Timestamp;
use kube_ovn_ipsec_runtime::cleanup::Point;
use testbed::ipsec::{IpsecNode, Tunnel};
use testbed::netns::wait_for;

/// The cleanup Pod's template hash in the record.
const CLEANUP_HASH: &str = "5c1ea2b7f";
/// How long a stopped cleanup may take to reach its point.
const REACH: Duration = Duration::from_secs(60);

/// Policies of another IPsec user of the host, installed before the agent
/// first runs: the guards' priority and selector under other marks, and a
/// tunnel-like selector with a reqid neighbour. Every dump must keep them.
const FOREIGN: [&str; 3] = [
    "xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 0x4b4f0000 mask 0xffff0000",
    "xfrm policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0x4b4f0001 mask 0xffff0000",
    "xfrm policy add dir out src 10.97.0.1/32 dst 10.97.0.2/32 proto udp dport 6081 priority 100 mark 0x5 mask 0xff tmpl src 10.97.0.1 dst 10.97.0.2 proto esp reqid 3 mode transport",
];

/// The foreign policies' blocks in an `ip xfrm` dump (a block starts at
/// an unindented line), sorted: the kernel lists them in its own order.
fn foreign_blocks(dump: &str) -> String {
    let mut blocks: Vec<String> = Vec::new();
    for line in dump.lines() {
        match blocks.last_mut() {
            Some(b) if line.starts_with(char::is_whitespace) => {
                b.push('\n');
                b.push_str(line);
            }
            _ => blocks.push(line.to_owned()),
        }
    }
    let mut foreign: Vec<String> = blocks
        .into_iter()
        .filter(|b| b.contains("mark 0x4b4f000") || b.contains("src 10.97.0.1/32 dst 10.97.0.2/32"))
        .collect();
    foreign.sort();
    foreign.join("\n")
}

/// One round: where the cleanup is killed, in order (a kill, the
/// kubelet's restart of the init container killed again, …), and the phase
/// the record is in when it is restarted for good.
#[derive(Debug, Clone)]
struct Round {
    kills: Vec<Point>,
    restarted_under: CoordinationPhase,
}

/// Every point once; every ordered pair of points (a restart killed
/// again); and the last point once more with the record gone on to
/// `Disabled` before the restart.
fn rounds() -> Vec<Round> {
    let release = |kills: Vec<Point>| Round {
        kills,
        restarted_under: CoordinationPhase::Release,
    };
    let mut v: Vec<Round> = Point::ALL.iter().map(|&p| release(vec![p])).collect();
    for a in Point::ALL {
        v.extend(Point::ALL.iter().map(|&b| release(vec![a, b])));
    }
    v.push(Round {
        kills: vec![Point::ReceiptPublished],
        restarted_under: CoordinationPhase::Disabled,
    });
    v
}

/// The `Release` record of round `i`, asking `fx`: its own epoch and
/// challenge, so a receipt from an earlier round never answers it.
fn release_record(fx: &cc::NodeFx, ds_uid: &str, i: usize) -> CoordinationRecord {
    let mut r = CoordinationRecord::initial();
    r.generation = 2 + i as u64;
    r.epoch = 100 + i as u64;
    r.phase = CoordinationPhase::Release;
    r.daemon_set_uid = Some(Uid::new(ds_uid.to_owned()).unwrap());
    r.template_hash = Some(CLEANUP_HASH.into());
    r.challenge = Some(Challenge::from_bytes([0x40 + i as u8; 32]));
    r.nb_global_uuid = Some(uuid::Uuid::from_bytes([1; 16]));
    r.sb_global_uuid = Some(uuid::Uuid::from_bytes([2; 16]));
    r.targets
        .insert(fx.name.clone(), Uid::new(fx.uid.clone()).unwrap());
    r
}

/// Both guards of `mark` are in the dump.
fn guards_in(dump: &str, mark: u32) -> bool {
    dump.matches(&format!("mark {mark:#x}/0xffffffff")).count() >= 2
}

/// What of this project's state the node still holds, named; empty when
/// none (the lease's keys, the identity paths, any policy or state with
/// the lease's mark or reqid).
fn own_state_left(node: &IpsecNode, dump: &str, mark: u32, reqid: u32) -> Vec<String> {
    let mut left = Vec::new();
    let ext = ovs_map(node, "external_ids");
    left.extend(
        ovs::PROTECTION_KEYS
            .iter()
            .filter(|k| ext.contains_key(**k))
            .map(|k| format!("external_ids:{k}")),
    );
    let other = ovs_map(node, "other_config");
    left.extend(
        ovs::IDENTITY_KEYS
            .iter()
            .filter(|k| other.contains_key(**k))
            .map(|k| format!("other_config:{k}")),
    );
    if dump.contains(&format!("mark {mark:#x}/")) {
        left.push(format!("XFRM entries with mark {mark:#x}"));
    }
    if dump.contains(&format!("reqid {reqid} ")) {
        left.push(format!("XFRM entries with reqid {reqid}"));
    }
    left
}

/// The release receipt on the Node, if any.
async fn release_receipt(admin: &kube::Client, node: &str) -> Option<String> {
    Api::<Node>::all(admin.clone())
        .get(node)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(k8s::ANNOTATION_RELEASE_RECEIPT)
}

struct Fixture {
    admin: kube::Client,
    api: apiserver::ApiServerHandle,
    fx: cc::NodeFx,
    ds_uid: String,
    script: &'static Path,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    /// The node's XFRM dump before the agent first ran.
    before: String,
    peer: IpsecNode,
}

impl Fixture {
    /// Arms the node (starting its agent, or again after a release),
    /// gives its tunnel IPsec intent until charon's policies carry the
    /// lease and the agent recorded the tunnel, then crashes the agent
    /// tree. The lease: (mark, reqid).
    async fn arm_and_crash(&self, n: &mut AgentNode, first: bool) -> (u32, u32) {
        if !first {
            n.respawn(
                harness::binaries::agent(),
                &self.fx,
                &self.api,
                self.script,
                &["--sa-observe-period", "1"],
            )
            .unwrap();
        }
        n.wait("armed and active", Duration::from_secs(90), |s| {
            s["protectionArmed"] == true
        })
        .await;
        let (mark, reqid) = n.lease().expect("a published lease");
        let tunnel = Tunnel {
            mark,
            reqid,
            ..Tunnel::to(&self.peer, 0)
        };
        if first {
            n.node.add_tunnel(&tunnel).unwrap();
        } else {
            n.node.protect_tunnel(&tunnel).unwrap();
        }
        wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
            let policies = n.node.netns().ip(["xfrm", "policy", "list"]).ok()?;
            let recorded = kube_ovn_ipsec_runtime::sa::load(&n.key_dir).ok()??;
            (policies.contains(&format!("reqid {reqid}")) && !recorded.tunnels.is_empty())
                .then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "no charon policy under the lease, or the tunnel not recorded:\n{}\n{}",
                n.logs(),
                n.node.diagnostics()
            )
        });
        kill_tree(n);
        n.node.unprotect_tunnel(&tunnel.name).unwrap();
        (mark, reqid)
    }
}

/// The invariants at a kill: while OVSDB publishes the lease both guards
/// are armed (2); the foreign policies are untouched (5); no half-written
/// file (3); a receipt answering this round means nothing of the node's
/// state is left (6); the killed run logged no key material (7).
async fn at_kill(
    f: &Fixture,
    n: &AgentNode,
    record: &CoordinationRecord,
    leaf: &Certificate,
    (mark, reqid): (u32, u32),
    log: &str,
    violations: &mut Vec<String>,
) {
    let dump = xfrm_dump(&n.node);
    let published =
        ovs_map(&n.node, "external_ids").contains_key(ovs::EXTERNAL_ID_PROTECTION_LEASE);
    if published && !guards_in(&dump, mark) {
        violations.push(format!(
            "2: OVSDB publishes the lease (mark {mark:#x}) without both guards armed:\n{dump}"
        ));
    }
    if let Err(e) = check::foreign_unchanged(&foreign_blocks(&f.before), &foreign_blocks(&dump)) {
        violations.push(format!("5: {e}"));
    }
    if let Err(e) = check::no_half_written(&n.key_dir) {
        violations.push(format!("3: {e}"));
    }
    if let Some(receipt) = release_receipt(&f.admin, &f.fx.name).await
        && let Ok(r) = signed::verify::<ReleaseReceipt>(&receipt, leaf)
        && r.epoch == record.epoch
    {
        let left = own_state_left(&n.node, &dump, mark, reqid);
        if !left.is_empty() {
            violations.push(format!(
                "6: the release receipt is on the Node while the node holds {left:?}"
            ));
        }
    }
    if let Some(what) = check::key_material(log) {
        violations.push(format!("7: the killed cleanup logged {what}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn cleanup_killed_at_every_release_step_repeats_cleanly_and_leaves_nothing() {
    harness::use_agent_binary!();
    let script = prerequisites(&[]);
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = api.client(ADMIN_TOKEN).await.unwrap();
    let (mut fxs, ds_uid) = cc::populate(&api, &admin, 1).await;
    let fx = fxs.remove(0);
    // The controller signs; it coordinates nothing (no OVN addresses): the
    // record is written here, as the controller's disable would.
    let (controller, _) = harness::cluster::start_controller(&api, &admin, &[]).await;
    let mut mesh = IpsecNode::mesh("koi-ck", &[fx.chassis.as_str(), "chassis-peer"]).unwrap();
    let peer = mesh.nodes.pop().unwrap();
    let node = mesh.nodes.pop().unwrap();
    for f in FOREIGN {
        let args: Vec<&str> = f.split_whitespace().collect();
        node.netns().ip(&args).unwrap();
    }
    let before = xfrm_dump(&node);
    let kubeconfig = dir.path().join(&fx.name).join("kubeconfig");
    let t0 = Instant::now();
    let mut n = start_node(
        node,
        &fx,
        &api,
        dir.path(),
        script,
        &["--sa-observe-period", "1"],
    );
    add_unrelated_keys(&n.node);
    let f = Fixture {
        admin,
        api,
        fx,
        ds_uid,
        script,
        dir,
        kubeconfig,
        before,
        peer,
    };
    let mut rows = Vec::new();
    for (i, round) in rounds().into_iter().enumerate() {
        let (mark, reqid) = f.arm_and_crash(&mut n, i == 0).await;
        let leaf = n.leaf();
        let record = release_record(&f.fx, &f.ds_uid, i);
        write_record(&f.admin, &record).await;
        let started = SystemTime::now();
        let mut violations = Vec::new();

        for (k, point) in round.kills.iter().enumerate() {
            // The cleanup, stopped at the point, SIGKILLed there.
            let log = f.dir.path().join(format!("cleanup-{i}-{k}.log"));
            let stop = StopFile(f.dir.path().join("stop-at"));
            stop.arm(point.name()).unwrap();
            let mut child =
                cleanup_command(&n.node, &f.fx, &n.key_dir, &f.kubeconfig, CLEANUP_HASH, 30)
                    .env("CHAOS_STOP_FILE", &stop.0)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap();
            let hit = until_stopped(child.id(), REACH).await;
            let _ = child.kill();
            let status = child.wait().unwrap();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if hit != Some(true) || !text.contains(&format!("{STOPPED}{}", point.name())) {
                violations.push(format!(
                    "0: the cleanup did not stop at {:?} ({status}):\n{text}",
                    point.name()
                ));
            }
            at_kill(
                &f,
                &n,
                &record,
                &leaf,
                (mark, reqid),
                &text,
                &mut violations,
            )
            .await;
        }

        let names = round
            .kills
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(" → ");
        // The kubelet restarts the init container: a plain run.
        if round.restarted_under == CoordinationPhase::Disabled {
            let mut disabled = record.clone();
            disabled.phase = CoordinationPhase::Disabled;
            write_record(&f.admin, &disabled).await;
        }
        let rerun_at = Instant::now();
        let out = run_cleanup(&n.node, &f.fx, &n.key_dir, &f.kubeconfig, CLEANUP_HASH, 30);
        let rerun = String::from_utf8_lossy(&out.stderr).into_owned();
        let recovery = (out.status.code() == Some(0)).then(|| rerun_at.elapsed());
        if recovery.is_none() {
            violations.push(format!(
                "4: the restarted cleanup exited {:?}:\n{rerun}",
                out.status.code()
            ));
        }
        let after = xfrm_dump(&n.node);
        if after != f.before {
            violations.push(format!(
                "5: the XFRM dump differs from the one before the agent ran:\n{after}"
            ));
        }
        let left = own_state_left(&n.node, &after, mark, reqid);
        if !left.is_empty() {
            violations.push(format!("5: left after the release: {left:?}"));
        }
        if ovs_map(&n.node, "external_ids")
            .get("unrelated")
            .map(String::as_str)
            != Some("keep-me")
            || ovs_map(&n.node, "other_config")
                .get("unrelated")
                .map(String::as_str)
                != Some("keep-me-too")
        {
            violations.push("5: an unrelated OVSDB key is gone".into());
        }
        if n.key_dir
            .join(kube_ovn_ipsec_runtime::lease::LEASE_FILE)
            .exists()
        {
            violations.push("5: the lease file is left".into());
        }
        match release_receipt(&f.admin, &f.fx.name).await {
            None => violations.push("6: no release receipt on the Node".into()),
            Some(a) => match signed::verify::<ReleaseReceipt>(&a, &leaf) {
                Err(e) => violations.push(format!("6: the receipt does not verify: {e}")),
                Ok(r) => {
                    let fresh = Timestamp::from_unix(r.observed.unix()).unwrap();
                    if r.observed.unix()
                        < started
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .unwrap()
                            .as_secs() as i64
                    {
                        violations.push("6: the receipt on the Node is an earlier round's".into());
                    } else if round.restarted_under == CoordinationPhase::Release
                        && let Err(e) = r.check_against(&record, fresh)
                    {
                        violations.push(format!("6: the receipt does not answer the record: {e}"));
                    } else if r.epoch != record.epoch || Some(r.challenge) != record.challenge {
                        violations.push("6: the receipt names another epoch or challenge".into());
                    }
                    if !r.status.complete() {
                        violations.push(format!("6: the receipt is incomplete: {:?}", r.status));
                    }
                }
            },
        }
        if let Some(what) = check::key_material(&rerun) {
            violations.push(format!("7: the restarted cleanup logged {what}"));
        }
        let row = Row {
            index: i,
            point: names,
            victim: if round.restarted_under == CoordinationPhase::Disabled {
                "cleanup (→Disabled)".into()
            } else {
                "cleanup".into()
            },
            seed: 0,
            node: 0,
            recovery,
            violations,
        };
        eprintln!("{}", row.progress());
        rows.push(row);
    }
    let (report, failed) = print_run(0, &rows, "rounds", t0.elapsed());
    drop(n);
    controller.abort();
    assert_eq!(
        failed,
        0,
        "{failed} of {} rounds violated an invariant:\n{report}",
        rows.len()
    );
}
