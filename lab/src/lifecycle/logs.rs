//! Where the operator finds a run's logs: the hint printed for them, and
//! the nodes' daemon logs copied out of their temporary directories beside
//! each node's agent log, where the hint points, before the nodes go.

use std::path::Path;

use super::world::World;

/// The lab's files: where the run keeps its logs.
pub fn logs_hint(dir: &Path) -> String {
    format!(
        "controller: {}/controller.log; per node: {}/<chassis>/agent.log",
        dir.display(),
        dir.display()
    )
}

/// Copies each node's daemon logs (strongSwan, ovs-monitor-ipsec,
/// ovs-vswitchd) beside its agent's, best effort.
pub(super) fn collect(w: &World) {
    // The nodes' daemon logs live in their own (temporary) directories:
    // copied beside the agent's, where the operator is pointed.
    for n in &w.nodes {
        for log in [
            "run/charon.log",
            "starter.out",
            "run/ovs-monitor-ipsec.log",
            "ovs-monitor-ipsec.out",
            "ovs-vswitchd.log",
        ] {
            let name = log.rsplit('/').next().unwrap_or(log);
            let _ = std::fs::copy(n.node.dir().join(log), n.dir().join(name));
        }
    }
}
