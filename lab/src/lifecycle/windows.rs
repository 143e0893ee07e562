//! Reply windows: how long each pod pair takes to answer again after a
//! change (the tunnels first built, the intent given, the intent removed).
//! The enable and disable windows in the summary are these figures, so
//! they are measured one way, concurrently across pairs.

use std::time::{Duration, Instant};

use testbed::overlay;

use super::context::{Run, Step, fail};
use super::pod::pod_ip;
use super::world::World;
use harness::node::SimNode;

/// Each pair's window in ms, printed as `step`: from `opened` (`since`:
/// SB's commit of the flip either way) to pod `b`'s first (`kind`:
/// encrypted or plaintext) reply to pod `a`, whoever plays ovn-controller
/// and however long the lab took to see it; a pair with none within
/// `limit` fails the step.
pub(super) fn pair_windows(
    run: &mut Run<'_>,
    w: &World,
    step: &str,
    limit: Duration,
    kind: &str,
    (since, opened): (&str, Instant),
) -> Step<Vec<u64>> {
    let mut out = Vec::new();
    let before = opened.elapsed();
    let windows: Vec<Option<Duration>> = first_replies(&w.nodes, &w.pairs, limit)
        .into_iter()
        .map(|d| d.map(|d| before + d))
        .collect();
    for (win, &(a, b)) in windows.iter().zip(&w.pairs) {
        let Some(d) = win else {
            return fail(format!(
                "pod {a} gets no {kind} reply from pod {b} within {} s of {since}",
                limit.as_secs()
            ));
        };
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        run.line(
            step,
            &format!("{a}<->{b}"),
            format!("first {kind} reply {ms} ms after {since}"),
        );
        out.push(ms);
    }
    Ok(out)
}

/// Per pair `(a, b)`, concurrently: how long until pod `b` first answers
/// pod `a` (`None`: not within `limit`).
pub(super) fn first_replies(
    nodes: &[SimNode],
    pairs: &[(usize, usize)],
    limit: Duration,
) -> Vec<Option<Duration>> {
    let probes: Vec<_> = pairs
        .iter()
        .map(|&(a, b)| (nodes[a].node.netns(), pod_ip(b)))
        .collect();
    overlay::first_replies(&probes, limit)
}
