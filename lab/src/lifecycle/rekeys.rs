//! The rekeys step: the run goes on until every pair's IKE_SA has been
//! rekeyed at least once (CHILD_SAs, on a shorter lifetime, are rekeyed
//! many times by then), so the periodic event that replaces
//! reauthentication is always among the run's events, however early the
//! renewals fell. Bounded by one IKE_SA lifetime and its margin.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use testbed::probe::unix_now;

use super::context::{Run, Step, fail};
use super::evidence::rekeys_in_log;
use super::world::World;

/// Waits until charon logged an IKE_SA rekey for every pair.
pub(super) async fn rekeys(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("rekeys");
    run.phase("rekeys");
    let ends = |a: usize, b: usize| {
        let mut e = [
            w.nodes[a].node.ip().to_string(),
            w.nodes[b].node.ip().to_string(),
        ];
        e.sort();
        e.join(" <-> ")
    };
    let pairs: Vec<String> = w.pairs.iter().map(|&(a, b)| ends(a, b)).collect();
    let limit = w.rekeying.ike_lifetime() + Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    let t0 = unix_now();
    loop {
        let seen: BTreeSet<String> = w
            .nodes
            .iter()
            .flat_map(|n| rekeys_in_log(&n.node.charon_log()))
            .filter(|(_, kind, _)| *kind == "IKE_SA rekey")
            .map(|(_, _, what)| what)
            .collect();
        let missing: Vec<&String> = pairs.iter().filter(|p| !seen.contains(*p)).collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "no IKE_SA rekey within {} s for {missing:?}; see charon.log",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    run.line(
        "rekeys",
        "-",
        format!(
            "every pair's IKE_SA rekeyed at least once ({:.0} s waited)",
            unix_now() - t0
        ),
    );
    run.done("rekeys");
    Ok(())
}
