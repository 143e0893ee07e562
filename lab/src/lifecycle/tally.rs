//! The probe streams' losses, per phase and per pair, into the summary.
//! Run after the steps that change the data path and once more at the
//! end, so the figures always cover every echo sent so far.

use testbed::probe::ProbeStream;

use super::context::Run;
use super::world::World;
use crate::summary::{PhaseLoss, is_window};

/// Losses per phase and per pair from the probe streams, into the summary.
pub(super) fn tally(run: &mut Run<'_>, w: &World) {
    let phases: Vec<(&str, f64)> = run.phases.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    if phases.is_empty() || w.probes.is_empty() {
        return;
    }
    let logs: Vec<_> = w.probes.iter().map(ProbeStream::log).collect();
    let mut per_phase: Vec<PhaseLoss> = phases
        .iter()
        .map(|(name, _)| PhaseLoss {
            phase: (*name).to_string(),
            window: is_window(name),
            ..PhaseLoss::default()
        })
        .collect();
    for row in &mut run.summary.nodes {
        row.lost = 0;
    }
    for (k, log) in logs.iter().enumerate() {
        for (slot, (_, t)) in per_phase.iter_mut().zip(log.losses(&phases)) {
            slot.sent += t.sent;
            slot.lost += t.lost;
        }
        let total = log.total();
        let (a, b) = w.pairs[k];
        run.summary.pairs[k].sent = total.sent;
        run.summary.pairs[k].lost = total.lost;
        run.summary.nodes[a].lost += total.lost;
        run.summary.nodes[b].lost += total.lost;
    }
    run.summary.phases = per_phase;
}
