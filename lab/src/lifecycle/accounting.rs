//! The accounting step, last: the probe streams, the underlay captures,
//! the XFRM counters and the events tallied once more, and the run failed
//! on what the design promises never happens — plaintext on the underlay
//! while intent is on, an XFRM error counter growing outside the two flips
//! and the lab's own negotiation, an echo lost around an event outside
//! them (`Summary::faults`).

use super::context::{Run, Step, fail};
use super::tally::tally;
use super::world::World;

/// Tallies everything and fails the run on any fault.
pub(super) fn accounting(run: &mut Run<'_>, w: &World) -> Step {
    run.begin("accounting");
    tally(run, w);
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
