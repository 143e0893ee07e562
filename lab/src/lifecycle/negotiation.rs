//! The negotiation step: one IKE_SA + CHILD_SA negotiation between node 0
//! and node 1, timed from taking the pair's IKE_SA down to the first reply
//! across it. It is the scale the enable windows are read against: a
//! window near this figure is one negotiation, not a stall.

use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::strongswan::{ConnDirection, MonitorConn};
use testbed::overlay;

use super::context::{Run, Step, fail};
use super::pod::pod_ip;
use super::readings::{lease_sas, lease_sas_want};
use super::world::World;
use harness::node::SimNode;

/// How often the negotiation step tries before it fails the lab.
const NEGOTIATION_TRIES: u32 = 3;

/// One IKE_SA + CHILD_SA negotiation: node 0's IKE_SA with node 1 taken
/// down, then both of the tunnel's connections brought up by name (`ipsec
/// up`, no trap or ACQUIRE in the way), timed to the first reply across
/// the pair. The scale the enable windows are read against.
pub(super) fn negotiation(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("negotiation");
    run.phase("negotiation");
    let tunnel = w.ovn.tunnel_name(&w.nodes[0], &w.nodes[1])?;
    let mut measured = None;
    // A renewal or a slow guest can leave the pair mid-change when the
    // step starts (the IKE_SA being replaced, or the connections of two
    // versions loaded at once): each try reads afresh what charon holds.
    for attempt in 1..=NEGOTIATION_TRIES {
        match negotiate_once(&w.nodes[0], &tunnel) {
            Ok(ms) => {
                measured = Some(ms);
                break;
            }
            Err(why) => run.line(
                "negotiation",
                "0<->1",
                format!("try {attempt}/{NEGOTIATION_TRIES}: {why}"),
            ),
        }
    }
    let Some(ms) = measured else {
        return fail(format!(
            "no IKE_SA + CHILD_SA negotiation of node 0 with node 1 measured in {NEGOTIATION_TRIES} tries"
        ));
    };
    run.summary.figures.negotiation_ms = Some(ms);
    run.line(
        "negotiation",
        "0<->1",
        format!(
            "IKE_SA taken down, both connections brought up by name: first reply {ms} ms later (IKE_SA + 2 CHILD_SAs)"
        ),
    );
    // Let the other direction settle before the renewal's phase starts.
    let want = lease_sas_want(w.nodes.len());
    let _ = testbed::netns::wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
        w.nodes.iter().all(|n| lease_sas(n) >= want).then_some(())
    });
    run.done("negotiation");
    Ok(())
}

/// One timed negotiation of `node` over `tunnel`: the ESTABLISHED IKE_SAs
/// charon holds for the tunnel taken down by unique id, then the newest
/// version's connections brought up by name; the time to the first reply.
/// Why a try measured nothing, as an error.
fn negotiate_once(node: &SimNode, tunnel: &str) -> Result<u64, String> {
    let prefix = format!("{tunnel}-");
    // The tunnel's IKE_SAs, those ESTABLISHED only or in any state.
    let held = |n: &SimNode, established: bool| -> Vec<(String, u32)> {
        n.node
            .ike_sas()
            .unwrap_or_default()
            .into_iter()
            .filter(|sa| {
                sa.conn.starts_with(&prefix) && (!established || sa.state == "ESTABLISHED")
            })
            .map(|sa| (sa.conn, sa.unique_id))
            .collect()
    };
    // By unique id, not by connection name: which of the tunnel's
    // connections names the IKE_SA depends on the order they were loaded
    // in, which a monitor restart or a renewal changes.
    let Some(ikes) =
        testbed::netns::wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
            let e = held(node, true);
            (!e.is_empty()).then_some(e)
        })
    else {
        return Err(format!("no ESTABLISHED IKE_SA for {tunnel} within 30 s"));
    };
    let routed = node.node.routed_conns().map_err(|e| e.to_string())?;
    let (Some(conn_in), Some(conn_out)) = (
        newest_conn(&routed, tunnel, ConnDirection::In),
        newest_conn(&routed, tunnel, ConnDirection::Out),
    ) else {
        return Err(format!("no routed connections for {tunnel}: {routed:?}"));
    };
    // Not blocking: a delete the peer does not answer (it may be deleting
    // the same IKE_SA) would hold a blocking `ipsec down` through every
    // retransmit. The wait below is what tells: the IKE_SAs gone in any
    // state, their CHILD_SAs with them.
    for (conn, id) in &ikes {
        node.node
            .ipsec(&["stroke", "down-nb", &format!("{conn}[{id}]")])
            .map_err(|e| format!("`ipsec stroke down-nb {conn}[{id}]`: {e}"))?;
    }
    let gone =
        testbed::netns::wait_for(Duration::from_secs(15), Duration::from_millis(100), || {
            let now = held(node, false);
            (!ikes.iter().any(|sa| now.contains(sa))).then_some(())
        });
    if gone.is_none() {
        return Err(format!(
            "IKE_SAs {ikes:?} still held 15 s after `ipsec down`"
        ));
    }
    let start = Instant::now();
    for conn in [&conn_out, &conn_in] {
        // `ipsec up` waits for the outcome; a CHILD_SA the trap set up
        // meanwhile makes it a no-op, not a failed try.
        let _ = node.node.ipsec(&["up", conn]);
    }
    let up = start.elapsed();
    let left = Duration::from_secs(60).saturating_sub(up);
    let Some(d) = overlay::first_reply(node.node.netns(), pod_ip(1), left) else {
        return Err(format!(
            "no reply from pod 1 within 60 s of `ipsec up {conn_out}`"
        ));
    };
    Ok(u64::try_from((up + d).as_millis()).unwrap_or(u64::MAX))
}

/// The routed connection of `tunnel` in direction `dir` (`in`, `out`)
/// with the highest version: during a renewal the monitor loads the new
/// version beside the old one.
fn newest_conn(routed: &[String], tunnel: &str, dir: ConnDirection) -> Option<String> {
    routed
        .iter()
        .filter_map(|c| {
            let parsed = MonitorConn::parse(c)?;
            (parsed.tunnel == tunnel && parsed.direction == dir).then_some((parsed.version, c))
        })
        .max_by_key(|(v, _)| *v)
        .map(|(_, c)| c.clone())
}

#[cfg(test)]
mod tests {
    use super::newest_conn;
    use kube_ovn_ipsec_api::strongswan::ConnDirection;

    #[test]
    fn the_newest_version_of_a_direction_is_brought_up() {
        let routed: Vec<String> = [
            "ovn-b-0-in-1",
            "ovn-b-0-out-1",
            "ovn-b-0-in-2",
            "ovn-b-0-out-2",
            "ovn-b-01-in-9",
            "ovn-b-0-in-x",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            newest_conn(&routed, "ovn-b-0", ConnDirection::In).as_deref(),
            Some("ovn-b-0-in-2")
        );
        assert_eq!(
            newest_conn(&routed, "ovn-b-0", ConnDirection::Out).as_deref(),
            Some("ovn-b-0-out-2")
        );
        assert_eq!(newest_conn(&routed, "ovn-c-0", ConnDirection::In), None);
    }
}
