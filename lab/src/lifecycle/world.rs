//! Everything a run keeps alive from the nodes step to its end: the
//! control plane, the nodes with their daemons, the probe streams, and
//! what the later steps compare against (the XFRM state before any agent,
//! each agent's first certificate generation). Its field order is its drop
//! order, which is what tears the lab down in a safe sequence.

use std::path::PathBuf;

use testbed::overlay::VSwitchd;
use testbed::probe::ProbeStream;

use harness::control_plane::{Binaries, ControlPlane};
use harness::node::SimNode;
use harness::ovn_controller::{OvnController, RunningOvnController};
use harness::watch::TableWatch;

use super::evidence::Evidence;

/// Everything the run keeps alive until its end.
pub(super) struct World {
    // Field order is drop order: the probes, the ovn-controllers, then
    // ovs-vswitchd before its database, the nodes, the control plane.
    pub(super) probes: Vec<ProbeStream>,
    /// The XFRM counters' sampler, the underlay captures and the events,
    /// from the probes' start.
    pub(super) evidence: Option<Evidence>,
    /// Every change of `SB_Global.ipsec`, stamped by SB's own monitor:
    /// the flips the phases and windows are timed from.
    pub(super) sb_ipsec: TableWatch,
    /// ovn-controller on every node (the real one or the emulation):
    /// stopped before the switches and databases they drive.
    pub(super) _ovn_controllers: Vec<RunningOvnController>,
    pub(super) _vswitchds: Vec<VSwitchd>,
    pub(super) nodes: Vec<SimNode>,
    pub(super) cp: ControlPlane,
    /// Who builds the nodes' tunnels.
    pub(super) ovn: OvnController,
    pub(super) pairs: Vec<(usize, usize)>,
    pub(super) before: Vec<String>,
    pub(super) bins: Binaries,
    pub(super) monitor: PathBuf,
    pub(super) lifetime: u32,
    /// The agents' lifetimes and rekey timing.
    pub(super) rekeying: kube_ovn_ipsec_api::rekeying::Rekeying,
    /// Each agent's first generation (renewal is a later one).
    pub(super) issued_generation: Vec<u64>,
    pub(super) _mesh: testbed::ipsec::Mesh,
}

impl World {
    /// Records a lifecycle event on node `node` at `at` (Unix seconds).
    pub(super) fn event(&mut self, kind: &str, node: usize, at: f64, detail: impl Into<String>) {
        if let Some(e) = &mut self.evidence {
            e.event(kind, node, at, detail);
        }
    }

    /// When `SB_Global.ipsec` last turned `on` (seconds since the epoch,
    /// the probes' clock), as SB's monitor reported the commit.
    pub(super) fn sb_turned(&self, on: bool) -> Option<f64> {
        let mut last = None;
        let mut was = None;
        for c in self.sb_ipsec.changes() {
            let now = c.flag("ipsec");
            if now == Some(on) && was != Some(on) {
                last = Some(c.at);
            }
            was = now;
        }
        last
    }
}
