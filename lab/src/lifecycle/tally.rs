//! The probe streams' losses, per phase and per pair, into the summary.
//! Run after the steps that change the data path and once more at the
//! end, so the figures always cover every echo sent so far.

use std::collections::BTreeSet;

use testbed::probe::{ProbeLog, ProbeStream};

use super::context::Run;
use super::evidence::{Evidence, Sample, rekeys_in_log};
use super::world::World;
use crate::summary::{CounterGrowth, EVENT_SPAN_S, EventLoss, PhaseLoss, is_window};

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
        let (enable, disable) = (
            phase_window(log, &phases, "enable flip"),
            phase_window(log, &phases, "disable flip"),
        );
        let retirement = phase_window(log, &phases, "CA retirement");
        let pair = &mut run.summary.pairs[k];
        pair.enable_window_ms = enable.or(pair.enable_window_ms);
        pair.disable_window_ms = disable.or(pair.disable_window_ms);
        pair.retirement_window_ms = retirement.or(pair.retirement_window_ms);
    }
    for (i, row) in run.summary.nodes.iter_mut().enumerate() {
        row.enable_window_ms = run
            .summary
            .pairs
            .iter()
            .filter(|p| p.a == i || p.b == i)
            .filter_map(|p| p.enable_window_ms)
            .max();
    }
    if let Some(ev) = &w.evidence {
        let names: Vec<&str> = w.cp.nodes.iter().map(|n| n.name.as_str()).collect();
        plaintext_per_phase(&mut per_phase, &phases, ev);
        xfrm_per_phase(&mut per_phase, &phases, &ev.samples(), &names);
        run.summary.events = events(run, w, ev, &logs, &phases);
    }
    run.summary.phases = per_phase;
}

/// A window phase's length on one pair's stream, in ms (a flip's, or the
/// CA retirement's): from the phase's start (SB's commit, `ca retire`) to the first echo answered after the last one the phase
/// lost. `None` while the phase has not started or nothing was answered
/// after its loss yet. Read from the stream that ran through the flip,
/// so it does not depend on when the lab got round to looking.
fn phase_window(log: &ProbeLog, phases: &[(&str, f64)], flip: &str) -> Option<u64> {
    let k = phases.iter().position(|(name, _)| *name == flip)?;
    let from = phases[k].1;
    let to = phases.get(k + 1).map_or(f64::INFINITY, |p| p.1);
    let again = log.answered_again(from, to)?;
    Some(((again - from).max(0.0) * 1000.0).round() as u64)
}

/// The phase `at` falls in (each runs until the next one starts).
fn phase_of<'a>(phases: &[(&'a str, f64)], at: f64) -> &'a str {
    phases
        .iter()
        .rev()
        .find(|(_, from)| *from <= at)
        .map_or("-", |(name, _)| *name)
}

/// Plaintext Geneve packets on every underlay, per phase.
fn plaintext_per_phase(per_phase: &mut [PhaseLoss], phases: &[(&str, f64)], ev: &Evidence) {
    let times: Vec<f64> = ev.plaintext_times().into_iter().flatten().collect();
    for (k, slot) in per_phase.iter_mut().enumerate() {
        let from = phases[k].1;
        let to = phases.get(k + 1).map_or(f64::INFINITY, |p| p.1);
        let n = times.iter().filter(|t| **t >= from && **t < to).count();
        slot.plaintext = Some(u32::try_from(n).unwrap_or(u32::MAX));
    }
}

/// The reading nearest before `at` of node `i`.
fn reading_at(samples: &[Sample], i: usize, at: f64) -> Option<&xfrm::stat::XfrmStats> {
    samples
        .iter()
        .rev()
        .filter(|(t, _)| *t <= at)
        .find_map(|(_, r)| r.get(i).and_then(Option::as_ref))
}

/// Every XFRM counter that grew on a node within a phase: from the last
/// reading before the phase began to the last one before it ended.
fn xfrm_per_phase(
    per_phase: &mut [PhaseLoss],
    phases: &[(&str, f64)],
    samples: &[Sample],
    names: &[&str],
) {
    let first = samples.first().map_or(f64::INFINITY, |(t, _)| *t);
    for (k, slot) in per_phase.iter_mut().enumerate() {
        let from = phases[k].1.max(first);
        let to = phases.get(k + 1).map_or(f64::INFINITY, |p| p.1);
        slot.xfrm =
            names
                .iter()
                .enumerate()
                .filter_map(|(i, name)| {
                    let before = reading_at(samples, i, from).or_else(|| {
                        samples
                            .first()
                            .and_then(|(_, r)| r.get(i).and_then(Option::as_ref))
                    })?;
                    let after = reading_at(samples, i, to)?;
                    Some(after.growth_since(before).into_iter().map(|(counter, by)| {
                        CounterGrowth {
                            node: (*name).to_string(),
                            counter,
                            by,
                        }
                    }))
                })
                .flatten()
                .collect();
    }
}

/// The events the steps recorded and the rekeys in charon's logs, each
/// with the echoes lost around it on its node's pairs outside the windows.
/// A rekey both ends log is listed once per node (each node's line names
/// its own connection).
fn events(
    run: &Run<'_>,
    w: &World,
    ev: &Evidence,
    logs: &[ProbeLog],
    phases: &[(&str, f64)],
) -> Vec<EventLoss> {
    let mut all: Vec<(f64, String, usize, String)> = ev
        .events
        .iter()
        .map(|e| (e.at, e.kind.clone(), e.node, e.detail.clone()))
        .collect();
    // Both ends log an IKE_SA rekey, and both may log a CHILD_SA's: keep
    // the first line of a pair's IKE_SA rekey within two seconds, and of an
    // SA's SPI (it names the SA on both ends).
    let mut ike: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut child: BTreeSet<String> = BTreeSet::new();
    let mut lines: Vec<(f64, &'static str, usize, String)> = Vec::new();
    for (i, n) in w.nodes.iter().enumerate() {
        for (at, kind, what) in rekeys_in_log(&n.node.charon_log()) {
            lines.push((at, kind, i, what));
        }
    }
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, kind, i, what) in lines {
        if kind == "IKE_SA rekey" {
            let slot = (at / 2.0).floor() as i64;
            if (slot - 1..=slot + 1).any(|s| ike.contains(&(what.clone(), s))) {
                continue;
            }
            ike.insert((what.clone(), slot));
        } else {
            let spi = what.split(' ').nth(1).unwrap_or_default().to_string();
            if !child.insert(spi) {
                continue;
            }
        }
        all.push((at, kind.to_string(), i, what));
    }
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let start = run.t0_unix();
    all.into_iter()
        .map(|(at, kind, node, detail)| {
            let lost = w
                .pairs
                .iter()
                .zip(logs)
                .filter(|((a, b), _)| *a == node || *b == node)
                .map(|(_, log)| lost_outside_windows(log, phases, at))
                .sum();
            EventLoss {
                kind,
                node: w.cp.nodes[node].name.clone(),
                detail,
                at_s: ((at - start) * 10.0).round() / 10.0,
                phase: phase_of(phases, at).to_string(),
                lost,
            }
        })
        .collect()
}

/// Echoes lost within [`EVENT_SPAN_S`] of `at`, outside the window phases.
fn lost_outside_windows(log: &ProbeLog, phases: &[(&str, f64)], at: f64) -> u32 {
    let (from, to) = (at - EVENT_SPAN_S, at + EVENT_SPAN_S);
    phases
        .iter()
        .enumerate()
        .filter(|(_, (name, _))| !is_window(name))
        .map(|(k, (_, start))| {
            let end = phases.get(k + 1).map_or(f64::INFINITY, |p| p.1);
            let (a, b) = (from.max(*start), to.min(end));
            if a < b { log.tally(a, b).lost } else { 0 }
        })
        .sum()
}
