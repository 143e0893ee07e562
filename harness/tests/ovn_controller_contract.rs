//! The contract between the agent's lease and ovn-controller's tunnels
//! (docs/protection.md), run against both implementations: the emulation
//! always, and the patched ovn-controller when
//! `KUBE_OVN_IPSEC_OVN_CONTROLLER` names it (a stock binary named there
//! fails the run: `OvnController::real` refuses it). Two nodes with
//! their ovsdb-server and `br-int` on one underlay, OVN NB/SB with
//! ovn-northd; IPsec turned on and off through `NB_Global.ipsec` as the
//! controller does; the lease written into each node's OVSDB as the agent
//! writes it. A monitor on each node's `Interface` table sees every
//! committed state of every tunnel.
//!
//! - Intent and marks arrive in one transaction, follow a lease change, and
//!   leave together when IPsec turns off: no committed state ever has some
//!   of the four intent options without the others.
//! - While IPsec is on, a node without a usable lease (none, a
//!   non-numeric mark, a reqid of 0, a mark in kube-proxy's bits, a mark
//!   without its reqid) has no tunnel at all, and its log names why.
//! - Restarted while IPsec is on, after its tunnels were removed and its
//!   lease changed, it never builds a tunnel with intent and another mark.
//!
//! The capability gate on the real binary (both probes) is here too; the
//! stock Debian binary's refusal is `runtime/tests/capability.rs`.

// Tests fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::time::Duration;

use harness::node::SimNode;
use harness::ovn_controller::{OvnController, RunningOvnController};
use harness::watch::{Change, TableWatch};
use kube_ovn_ipsec_api::lease::PublishedLease;
use kube_ovn_ipsec_api::names::ovs;
use testbed::ipsec::{IpsecNode, Mesh};
use testbed::netns::wait_for;
use testbed::ovs::OvnCentral;

/// Who plays ovn-controller in these runs.
fn players() -> Vec<OvnController> {
    let mut v = vec![OvnController::Emulated];
    match OvnController::from_env().unwrap() {
        OvnController::Emulated => println!(
            "no patched ovn-controller named ({}): the emulation only",
            harness::ovn_controller::ENV_OVN_CONTROLLER
        ),
        real => v.push(real),
    }
    v
}

fn prerequisites() {
    for p in [
        "ovsdb-server",
        "ovs-vsctl",
        "ovn-northd",
        "ovn-nbctl",
        "ovn-sbctl",
        "nsenter",
    ] {
        testbed::require_program(p).unwrap();
    }
}

/// Two nodes, OVN central, ovn-controller on both.
struct Bench {
    // Field order is drop order.
    players: Vec<Option<RunningOvnController>>,
    observers: Vec<Observer>,
    nodes: Vec<SimNode>,
    central: OvnCentral,
    ovn: OvnController,
    _mesh: Mesh,
    _dir: tempfile::TempDir,
}

impl Bench {
    fn start(ovn: &OvnController, prefix: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let central = OvnCentral::start(dir.path()).unwrap();
        let chassis = [format!("{prefix}-a"), format!("{prefix}-b")];
        let names: Vec<&str> = chassis.iter().map(String::as_str).collect();
        let mut mesh = IpsecNode::mesh(prefix, &names).unwrap();
        let nodes: Vec<SimNode> = std::mem::take(&mut mesh.nodes)
            .into_iter()
            .map(|n| SimNode::prepare(n, dir.path()).unwrap())
            .collect();
        let observers = nodes.iter().map(Observer::start).collect();
        let mut bench = Bench {
            players: Vec::new(),
            observers,
            nodes,
            central,
            ovn: ovn.clone(),
            _mesh: mesh,
            _dir: dir,
        };
        for i in 0..bench.nodes.len() {
            bench.players.push(Some(bench.attach(i)));
        }
        bench.ovn.plain_mesh(&bench.nodes).unwrap();
        bench
    }

    fn attach(&self, i: usize) -> RunningOvnController {
        self.ovn
            .attach(&self.nodes[i], &self.central, None)
            .unwrap()
    }

    fn what(&self) -> &'static str {
        self.ovn.name()
    }

    /// IPsec on or off as the controller turns it.
    fn ipsec(&self, on: bool) {
        self.central.set_ipsec(on).unwrap();
    }

    fn a(&self) -> &SimNode {
        &self.nodes[0]
    }

    fn b(&self) -> &SimNode {
        &self.nodes[1]
    }

    /// Whether `a`'s tunnel to `b` exists.
    fn has_tunnel(&self, a: &SimNode, b: &SimNode) -> bool {
        self.ovn.tunnel_name(a, b).is_ok()
    }

    /// Waits until node `i` has no tunnel to the other; panics with its
    /// log otherwise.
    fn wait_no_tunnel(&self, i: usize, why: &str) {
        let (a, b) = (&self.nodes[i], &self.nodes[1 - i]);
        wait_for(Duration::from_secs(60), Duration::from_millis(100), || {
            (!self.has_tunnel(a, b)).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{}: {} still has a tunnel with {why}: {}\n{}",
                self.what(),
                a.node.chassis(),
                self.ovn.tunnel_options(a, b).unwrap_or_default(),
                self.log(i)
            )
        });
    }

    fn log(&self, i: usize) -> String {
        self.players[i]
            .as_ref()
            .map(|p| std::fs::read_to_string(p.log()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// Waits until node `i`'s log has `text`.
    fn wait_logged(&self, i: usize, text: &str) {
        wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
            self.log(i).contains(text).then_some(())
        })
        .unwrap_or_else(|| panic!("{}: no log line {text:?}:\n{}", self.what(), self.log(i)));
    }

    /// Panics on any committed tunnel state either node's monitor saw with
    /// part of the intent, or with intent and a mark that is not `mark`
    /// after position `since` (for the node `i` only, when given).
    fn assert_states(&self, marks_since: Option<(usize, usize, u32)>) {
        for (i, o) in self.observers.iter().enumerate() {
            let seen = o.seen();
            assert!(
                seen.partial.is_empty(),
                "{}: {} committed tunnels with part of the intent: {:?}",
                self.what(),
                self.nodes[i].node.chassis(),
                seen.partial
            );
            if let Some((node, since, mark)) = marks_since
                && node == i
            {
                let other: Vec<_> = seen.intent[since..]
                    .iter()
                    .filter(|(_, m)| *m != mark)
                    .collect();
                assert!(
                    other.is_empty(),
                    "{}: tunnels with intent and another mark than {mark}: {other:?}",
                    self.what()
                );
            }
        }
    }
}

/// Writes the four lease keys into `n`'s OVSDB in one transaction, as the
/// agent publishes them; `reqid` `None` writes the other three only.
fn publish(n: &SimNode, mark: &str, reqid: Option<&str>) {
    let mut args = vec!["set".to_string(), "Open_vSwitch".into(), ".".into()];
    args.push(format!(
        "external_ids:{}=uid-{}",
        ovs::EXTERNAL_ID_PROTECTION_NODE_UID,
        n.node.chassis()
    ));
    args.push(format!(
        "external_ids:{}=lease-{mark}",
        ovs::EXTERNAL_ID_PROTECTION_LEASE
    ));
    args.push(format!(
        "external_ids:{}=\"{mark}\"",
        ovs::EXTERNAL_ID_PROTECTION_MARK
    ));
    let mut remove = Vec::new();
    match reqid {
        Some(r) => args.push(format!(
            "external_ids:{}=\"{r}\"",
            ovs::EXTERNAL_ID_PROTECTION_REQID
        )),
        None => {
            remove = vec![
                "--".to_string(),
                "remove".into(),
                "Open_vSwitch".into(),
                ".".into(),
                "external_ids".into(),
                ovs::EXTERNAL_ID_PROTECTION_REQID.into(),
            ]
        }
    }
    args.extend(remove);
    n.node
        .vsctl(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .unwrap();
}

/// The reason the lease `n` publishes is not usable, as the patch words
/// it (the contract's reader on this side).
fn problem(n: &SimNode) -> String {
    let ids = n.external_ids().unwrap();
    PublishedLease::read(&ids).unwrap_err().to_string()
}

/// Every committed state of a node's geneve tunnels, as an OVSDB monitor
/// on its `Interface` table reports them (one update per commit).
struct Observer {
    watch: TableWatch,
}

#[derive(Default)]
struct Seen {
    /// Tunnel name and its options, for every state with some but not all
    /// four intent options (or a mark that disagrees with itself).
    partial: Vec<(String, BTreeMap<String, String>)>,
    /// Tunnel name and its mark, for every state with the whole intent.
    intent: Vec<(String, u32)>,
}

impl Observer {
    fn start(n: &SimNode) -> Self {
        let address = format!("unix:{}", n.node.run_path("openvswitch/db.sock").display());
        let watch = TableWatch::start(
            &address,
            "Open_vSwitch",
            "Interface",
            &["name", "type", "options"],
        )
        .unwrap();
        Observer { watch }
    }

    /// Every committed tunnel state so far, judged.
    fn seen(&self) -> Seen {
        let mut seen = Seen::default();
        for c in self.watch.changes() {
            judge(&c, &mut seen);
        }
        seen
    }

    fn intent_seen(&self) -> usize {
        self.seen().intent.len()
    }
}

/// Records one committed state of a tunnel.
fn judge(c: &Change, seen: &mut Seen) {
    if c.text("type") != Some("geneve") {
        return;
    }
    let name = c.text("name").unwrap_or_default().to_owned();
    let options = c.map("options");
    let present = ovs::TUNNEL_PROTECTION_OPTIONS
        .iter()
        .filter(|k| options.contains_key(**k))
        .count();
    match present {
        0 => {}
        4 => {
            let mark = options[ovs::OPTION_EGRESS_PKT_MARK].parse::<u32>().ok();
            let mark_out = &options[ovs::OPTION_IPSEC_MARK_OUT];
            match mark {
                Some(m) if *mark_out == format!("{m}/0xffffffff") => seen.intent.push((name, m)),
                _ => seen.partial.push((name, options)),
            }
        }
        _ => seen.partial.push((name, options)),
    }
}

// The nodes' ovsdb-servers are supervised on the runtime; the test
// blocks one worker while they run on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intent_and_marks_arrive_follow_the_lease_and_leave_together() {
    prerequisites();
    for ovn in players() {
        let bench = Bench::start(&ovn, "occ-marks");
        let what = bench.what();
        // Plain while IPsec is off, even with a lease published.
        publish(bench.a(), "65537", Some("11"));
        publish(bench.b(), "0x10002", Some("12"));
        for (a, b) in [(bench.a(), bench.b()), (bench.b(), bench.a())] {
            let opts = bench.ovn.tunnel_options(a, b).unwrap();
            assert!(!opts.contains(ovs::OPTION_REMOTE_NAME), "{what}: {opts}");
        }

        bench.ipsec(true);
        for n in &bench.nodes {
            assert!(bench.ovn.give_intent(&bench.nodes, n).unwrap(), "{what}");
        }
        let opts = bench.ovn.tunnel_options(bench.b(), bench.a()).unwrap();
        for want in [
            format!("{}=\"65538\"", ovs::OPTION_EGRESS_PKT_MARK),
            format!("{}=\"12\"", ovs::OPTION_IPSEC_REQID),
            format!("{}={}", ovs::OPTION_REMOTE_NAME, bench.a().node.chassis()),
        ] {
            assert!(opts.contains(&want), "{what}: {want} not in {opts}");
        }

        // A new lease: the marks follow.
        let since = bench.observers[0].intent_seen();
        publish(bench.a(), "131073", Some("21"));
        assert!(bench.ovn.give_intent(&bench.nodes, bench.a()).unwrap());
        let opts = bench.ovn.tunnel_options(bench.a(), bench.b()).unwrap();
        assert!(
            opts.contains(&format!("{}=\"21\"", ovs::OPTION_IPSEC_REQID)),
            "{what}: {opts}"
        );
        assert!(
            bench.observers[0].intent_seen() > since,
            "{what}: the monitor saw the change"
        );

        bench.ipsec(false);
        for n in &bench.nodes {
            bench.ovn.take_intent(&bench.nodes, n).unwrap();
        }
        bench.assert_states(None);
        println!("{what}: intent, a lease change and its removal, each in one transaction");
    }
}

// The nodes' ovsdb-servers are supervised on the runtime; the test
// blocks one worker while they run on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usable_lease_there_is_no_tunnel_and_the_log_says_why() {
    prerequisites();
    for ovn in players() {
        let bench = Bench::start(&ovn, "occ-bad");
        let what = bench.what();
        publish(bench.b(), "65538", Some("12"));
        bench.ipsec(true);
        // A never published: no tunnel at all; B, whose lease is good,
        // has its tunnel to A with intent.
        assert!(bench.ovn.give_intent(&bench.nodes, bench.b()).unwrap());
        bench.wait_no_tunnel(0, "no lease published");
        bench.wait_logged(0, &problem(bench.a()));

        let bad: [(&str, Option<&str>, &str); 4] = [
            ("abc", Some("1"), "a non-numeric mark"),
            ("65537", Some("0"), "a reqid of 0"),
            ("0x14001", Some("1"), "a mark in kube-proxy's bits"),
            ("65537", None, "a mark without its reqid"),
        ];
        for (mark, reqid, why) in bad {
            publish(bench.a(), "65537", Some("11"));
            assert!(
                bench.ovn.give_intent(&bench.nodes, bench.a()).unwrap(),
                "{what}"
            );
            publish(bench.a(), mark, reqid);
            bench.wait_no_tunnel(0, why);
            bench.wait_logged(0, &problem(bench.a()));
            println!("{what}: {why}: no tunnel; logged {:?}", problem(bench.a()));
        }
        bench.assert_states(None);
    }
}

// The nodes' ovsdb-servers are supervised on the runtime; the test
// blocks one worker while they run on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_while_ipsec_is_on_it_never_builds_a_tunnel_with_another_mark() {
    prerequisites();
    for ovn in players() {
        let mut bench = Bench::start(&ovn, "occ-restart");
        let what = bench.what();
        publish(bench.a(), "65537", Some("11"));
        publish(bench.b(), "65538", Some("12"));
        bench.ipsec(true);
        for n in &bench.nodes {
            assert!(bench.ovn.give_intent(&bench.nodes, n).unwrap());
        }

        // Stopped; its tunnels removed and its lease changed while it is
        // down; started again.
        bench.players[0] = None;
        let name = bench.ovn.tunnel_name(bench.a(), bench.b()).unwrap();
        bench.a().node.remove_tunnel(&name).unwrap();
        let since = bench.observers[0].intent_seen();
        publish(bench.a(), "196609", Some("31"));
        bench.players[0] = Some(bench.attach(0));
        assert!(bench.ovn.give_intent(&bench.nodes, bench.a()).unwrap());
        bench.assert_states(Some((0, since, 196_609)));
        println!("{what}: restarted with IPsec on, rebuilt its tunnel with the new lease only");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_passes_the_patched_ovn_controller_on_both_probes() {
    use kube_ovn_ipsec_runtime::capability::{self, CapabilityConfig};
    use kube_ovn_ipsec_runtime::process::Launcher;
    prerequisites();
    let ovn = OvnController::from_env().unwrap();
    let OvnController::Real { binary, .. } = &ovn else {
        println!(
            "no patched ovn-controller named ({}): nothing to check here; the stock binary's refusal is runtime/tests/capability.rs",
            harness::ovn_controller::ENV_OVN_CONTROLLER
        );
        return;
    };
    let bench = Bench::start(&ovn, "occ-gate");
    // The agent's flags with this ovn-controller: the image probe runs the
    // binary, the running probe asks the daemon in the node.
    let flags = ovn.agent_flags();
    let flag = |name: &str| {
        let i = flags.iter().position(|f| f == name).unwrap();
        flags[i + 1].clone()
    };
    let cfg = CapabilityConfig {
        ovn_controller: binary.clone().into_os_string(),
        appctl: flag("--ovs-appctl").into(),
        running_ctl: flag("--ovn-controller-ctl").into(),
    };
    let launcher = Launcher::nsenter(bench.a().node.netns().holder_pid());
    capability::check(&cfg, &launcher).await.unwrap();
    println!("the gate passes {} on both probes", binary.display());
}
