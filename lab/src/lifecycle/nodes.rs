//! The nodes step: one network namespace per node on a shared underlay,
//! each with its own ovsdb-server and ovs-vswitchd (kernel datapath) and a
//! pod, and foreign XFRM state installed and recorded first — the state
//! the leftovers step later proves untouched. What it builds becomes the
//! run's [`World`], kept alive to the end of the run.

use testbed::ipsec::IpsecNode;
use testbed::overlay::{self, VSwitchd};

use super::context::{Run, Step};
use super::options::Options;
use super::pod::pod_ip;
use super::world::World;
use crate::state::NETNS_PREFIX;
use crate::summary::{NodeRow, PairRow};
use harness::control_plane::{Binaries, ControlPlane};
use harness::node::POD_PORT;
use harness::node::SimNode;
use harness::ovn_controller::OvnController;
use harness::watch::TableWatch;

/// Brings up a node per chassis of `cp` and stores the run's world in
/// `world` (so the run's end can report on it even if a later step
/// fails).
pub(super) fn bring_up<'w>(
    run: &mut Run<'_>,
    opts: &Options,
    bins: &Binaries,
    cp: ControlPlane,
    world: &'w mut Option<World>,
) -> Step<&'w mut World> {
    run.begin("nodes");
    let ovn = match &opts.ovn_controller {
        Some(binary) => OvnController::real(binary.clone())?,
        None => OvnController::Emulated,
    };
    run.summary.ovn_controller = ovn.describe();
    run.line("ovn-controller", "-", ovn.describe());
    let chassis: Vec<&str> = cp.nodes.iter().map(|c| c.chassis.as_str()).collect();
    let mut mesh = IpsecNode::mesh(NETNS_PREFIX, &chassis)?;
    let monitor = testbed::ipsec::patched_monitor_script(&opts.dir)?.to_path_buf();
    let mut nodes = Vec::new();
    let mut before = Vec::new();
    let mut vswitchds = Vec::new();
    let mut ovn_controllers = Vec::new();
    for (i, node) in std::mem::take(&mut mesh.nodes).into_iter().enumerate() {
        node.install_foreign_xfrm()?;
        before.push(node.xfrm_dump()?);
        let sim = SimNode::prepare(node, &opts.dir)?;
        vswitchds.push(VSwitchd::start(&sim.node)?);
        overlay::add_pod(&sim.node, POD_PORT, &format!("{}/24", pod_ip(i)))?;
        ovn_controllers.push(ovn.attach(&sim, &cp.central, Some(pod_ip(i)))?);
        run.line(
            "nodes",
            &cp.nodes[i].name,
            format!(
                "netns {}, underlay {}, ovsdb-server + ovs-vswitchd (kernel datapath), pod {}; foreign XFRM installed",
                sim.node.netns().name(),
                sim.node.ip(),
                pod_ip(i)
            ),
        );
        nodes.push(sim);
    }
    let n = nodes.len();
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    run.summary.nodes = cp
        .nodes
        .iter()
        .map(|c| NodeRow {
            name: c.name.clone(),
            chassis: c.chassis.clone(),
            phase: "-".into(),
            ..NodeRow::default()
        })
        .collect();
    run.summary.pairs = pairs
        .iter()
        .map(|&(a, b)| PairRow {
            a,
            b,
            ..PairRow::default()
        })
        .collect();
    let sb_ipsec = TableWatch::start(
        &cp.central.sb.address(),
        "OVN_Southbound",
        "SB_Global",
        &["ipsec"],
    )
    .map_err(|e| format!("watching SB_Global.ipsec: {e}"))?;
    let w = world.insert(World {
        sb_ipsec,
        cp,
        ovn,
        _ovn_controllers: ovn_controllers,
        nodes,
        _vswitchds: vswitchds,
        probes: Vec::new(),
        evidence: None,
        pairs,
        before,
        bins: bins.clone(),
        monitor,
        lifetime: opts.certificate_lifetime,
        rekeying: opts.rekeying,
        issued_generation: vec![0; n],
        _mesh: mesh,
    });
    run.done("nodes");
    Ok(w)
}
