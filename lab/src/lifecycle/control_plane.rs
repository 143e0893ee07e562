//! The first step: the control plane every later step talks to — the
//! embedded API server with RBAC, the Kube-OVN DaemonSet, one Node and CNI
//! Pod per simulated node, OVN NB/SB with ovn-northd. Nothing else can
//! start before the cluster the agents and the controller run against.

use apiserver::kube_ovn;

use super::context::{Run, Step};
use super::options::Options;
use harness::control_plane::ControlPlane;

/// Starts the control plane for `opts.nodes` nodes.
pub(super) async fn start(run: &mut Run<'_>, opts: &Options) -> Step<ControlPlane> {
    run.begin("control plane");
    let cp = ControlPlane::start(&opts.dir, opts.nodes).await?;
    run.line(
        "control plane",
        "-",
        format!(
            "API server {} with RBAC, DaemonSet {}, {} Nodes and CNI Pods; OVN NB/SB and ovn-northd",
            cp.api.addr(),
            kube_ovn::DAEMON_SET,
            cp.nodes.len()
        ),
    );
    run.done("control plane");
    Ok(cp)
}
