//! The overlay before any IPsec: plain Geneve tunnels between every pair
//! of nodes, every pod pair answering, then a probe stream per pair
//! started. The streams run from here to after `Disabled`, so every later
//! phase's lost echoes are measured against a working plaintext baseline.

use std::time::Duration;

use testbed::probe::ProbeStream;

use super::context::{Run, Step, fail};
use super::evidence::Evidence;
use super::pod::pod_ip;
use super::windows::first_replies;
use super::world::World;

/// The overlay before any IPsec: plain tunnels, every pair answering, the
/// probe streams started.
pub(super) fn plaintext_overlay(run: &mut Run<'_>, w: &mut World, interval: Duration) -> Step {
    run.begin("plaintext overlay");
    w.ovn.plain_mesh(&w.nodes)?;
    let windows = first_replies(&w.nodes, &w.pairs, Duration::from_secs(90));
    for (win, &(a, b)) in windows.iter().zip(&w.pairs) {
        match win {
            Some(d) => run.line(
                "plaintext overlay",
                &format!("{a}<->{b}"),
                format!("first reply after {} ms", d.as_millis()),
            ),
            None => return fail(format!("pod {a} gets no reply from pod {b} in 90 s")),
        }
    }
    for &(a, b) in &w.pairs {
        w.probes.push(ProbeStream::start(
            w.nodes[a].node.netns(),
            pod_ip(b),
            interval,
        )?);
    }
    w.evidence = Some(Evidence::start(&w.nodes)?);
    run.phase("before enable");
    run.line(
        "probes",
        "-",
        format!(
            "a ping stream per pod pair every {} ms, from now to after Disabled",
            interval.as_millis()
        ),
    );
    run.done("plaintext overlay");
    Ok(())
}
