//! The wire check: every node's pod pings every other while its underlay
//! is captured, and the capture says what carried the echoes. One check for
//! both directions of the lifecycle, so "encrypted" (ESP only) and
//! "plaintext again" (Geneve only) are judged by the same rule.

use std::time::Duration;

use testbed::overlay::{self, Capture, CaptureSummary};

use super::context::{Run, Step, fail};
use super::pod::pod_ip;
use super::world::World;
use harness::node::SimNode;

/// Every node's pod pings every other while its underlay is captured
/// (into `<step>.pcap`): every echo answered but the last in flight, and
/// only ESP (`esp`) or only plaintext Geneve on the wire.
pub(super) fn wire_check(run: &mut Run<'_>, w: &World, step: &str, esp: bool) -> Step {
    let (want, other) = if esp {
        ("ESP", "plaintext Geneve")
    } else {
        ("plaintext Geneve", "ESP")
    };
    for i in 0..w.nodes.len() {
        let pcap = format!("{}.pcap", step.replace(' ', "-"));
        let (answered, sent, wire) = ping_peers_captured(&w.nodes, i, &pcap)?;
        let (wanted, unwanted) = if esp {
            (wire.esp, wire.geneve)
        } else {
            (wire.geneve, wire.esp)
        };
        run.line(
            step,
            &w.cp.nodes[i].name,
            format!("{answered}/{sent} answered; underlay: {wanted} {want}, {unwanted} {other}"),
        );
        if unwanted > 0 || wanted == 0 || answered + 1 < sent {
            return fail(format!(
                "{}: {answered}/{sent} answered, underlay {wire:?} (want {want} only)",
                w.cp.nodes[i].name
            ));
        }
    }
    Ok(())
}

/// Node `i`'s pod pings every other node's pod 3 times while its underlay
/// is captured (into `pcap` in its directory): answered, sent, the wire.
fn ping_peers_captured(
    nodes: &[SimNode],
    i: usize,
    pcap: &str,
) -> Step<(u32, u32, CaptureSummary)> {
    let a = &nodes[i].node;
    let cap = Capture::start(a.netns(), "eth0", &nodes[i].dir().join(pcap))?;
    let (mut answered, mut sent) = (0, 0);
    for j in (0..nodes.len()).filter(|j| *j != i) {
        let s = overlay::ping(a.netns(), pod_ip(j), 3, Duration::from_millis(200))?;
        answered += s.received;
        sent += s.transmitted;
    }
    Ok((answered, sent, cap.stop()?))
}
