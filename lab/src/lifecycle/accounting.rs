//! The accounting step, last: the probe streams, the underlay captures,
//! the XFRM counters and the events tallied once more, and the run failed
//! on what the design promises never happens — plaintext on the underlay
//! while intent is on, an XFRM error counter growing outside the two flips
//! and the lab's own negotiation, an echo lost around an event outside
//! them (`Summary::faults`).

use super::context::{Run, Step, fail};
use super::tally::tally;
use super::world::World;
use crate::summary::is_window;

/// Tallies everything and fails the run on any fault.
pub(super) fn accounting(run: &mut Run<'_>, w: &World) -> Step {
    run.begin("accounting");
    tally(run, w);
    where_lost(run, w);
    let events = run.summary.events.len();
    let faults = run.summary.faults();
    if !faults.is_empty() {
        return fail(faults.join("; "));
    }
    run.line(
        "accounting",
        "-",
        format!(
            "{events} events, none with an echo lost; no plaintext while intent was on; no XFRM \
             error counter grew outside the windows"
        ),
    );
    run.done("accounting");
    Ok(())
}

/// For each phase that allows no loss but had some: when, per pair, as
/// runs of consecutive lost echoes in the run's time (the progress
/// lines' clock), so a failed run says where to look in the logs.
fn where_lost(run: &mut Run<'_>, w: &World) {
    let t0 = run.t0_unix();
    let phases = run.phases.clone();
    for (k, (name, from)) in phases.iter().enumerate() {
        if is_window(name) {
            continue;
        }
        let to = phases.get(k + 1).map_or(f64::INFINITY, |p| p.1);
        for (p, &(a, b)) in w.probes.iter().zip(&w.pairs) {
            let spans = p.log().lost_spans(*from, to);
            if spans.is_empty() {
                continue;
            }
            let at: Vec<String> = spans
                .iter()
                .map(|(f, l, n)| format!("{n} at {:.1}–{:.1} s", f - t0, l - t0))
                .collect();
            run.line(
                "accounting",
                &format!("{a}<->{b}"),
                format!("lost in {name}: {}", at.join(", ")),
            );
        }
    }
}
