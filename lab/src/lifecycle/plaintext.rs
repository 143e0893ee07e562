//! The overlay before any IPsec: plain Geneve tunnels between every pair
//! of nodes, every pod pair answering, then a probe stream per pair
//! started. The streams run from here to after `Disabled`, so every later
//! phase's lost echoes are measured against a working plaintext baseline.

use std::time::{Duration, Instant};

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
    settle(run, w)?;
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

/// How long every node's OpenFlow table must stay unchanged, with every
/// pair answering, for the overlay to count as settled.
const STEADY: Duration = Duration::from_secs(2);

/// Waits until the overlay has settled: no node's OpenFlow table changed
/// for [`STEADY`] and every pair answers. A first reply can come before
/// ovn-controller (or its emulation) has written a node's forwarding —
/// OVS's default flow carries it meanwhile — and replacing those flows
/// under TCG cost the probes' first seconds on that node's pairs
/// (19 echoes each, in the plaintext baseline). The baseline starts once
/// the overlay is the one the rest of the run uses.
fn settle(run: &mut Run<'_>, w: &World) -> Step {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    let flows = |w: &World| -> Step<Vec<String>> {
        w.nodes
            .iter()
            .map(|n| {
                let out = n
                    .node
                    .netns()
                    .run("ovs-ofctl", ["dump-flows", "br-int", "--no-stats"])?;
                if !out.status.success() {
                    return fail(format!(
                        "{}: ovs-ofctl dump-flows: {}",
                        n.node.chassis(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(str::to_owned)
                    .collect();
                lines.sort();
                Ok(lines.join("\n"))
            })
            .collect()
    };
    loop {
        let before = flows(w)?;
        std::thread::sleep(STEADY);
        let answering = first_replies(&w.nodes, &w.pairs, Duration::from_secs(2))
            .iter()
            .all(Option::is_some);
        if answering && flows(w)? == before {
            break;
        }
        if Instant::now() > deadline {
            return fail(
                "the plaintext overlay did not settle in 60 s: a node's OpenFlow table kept \
                 changing or a pair stopped answering; see ovn-controller's log",
            );
        }
    }
    run.line(
        "plaintext overlay",
        "-",
        format!(
            "settled: every node's flows unchanged for {} s, every pair answering ({:.1} s)",
            STEADY.as_secs(),
            t0.elapsed().as_secs_f64()
        ),
    );
    Ok(())
}
