//! The CA rotation step, as an operator runs it (docs/controller.md, "CA
//! rotation"), while the probe streams run:
//!
//! 1. `kube-ovn-ipsec-controller ca rotate`: the bundle holds the old and
//!    a new CA, the controller signs with the new one and announces it;
//!    every agent installs the two-CA bundle and renews onto the new CA
//!    within its rotation spread. Renewals keep the established SAs, so
//!    no echo may be lost (phase `CA rotation`).
//! 2. `ca retire --acknowledged-digest <the two-CA digest>`: the old CA
//!    leaves the bundle, so an IKE_SA authenticated with one of its leaves
//!    would outlive its trust; each agent rebuilds the tunnels it kept
//!    across renewals, make-before-break (docs/decisions.md). The rebuild
//!    is the one lifecycle event that must negotiate new CHILD_SAs: it is
//!    a window like the flips (phase `CA retirement`), measured per pair
//!    from the probe streams, and the phase after it (`CA retired`) must
//!    lose nothing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::status::Status;
use testbed::probe::unix_now;

use super::context::{Run, Step, fail};
use super::rows::{refresh_rows, update_row};
use super::world::World;
use harness::node::SimNode;

/// What the agent logs once it has rebuilt its kept tunnels under the
/// current trust (the monitor actor, after a CA left the bundle).
const REBUILT: &str = "rebuilt the tunnels kept across renewals";

/// How long the nodes may take, beyond the rotation spread (20 s in the
/// lab's agents), to renew onto the new CA or to rebuild.
const PATIENCE: Duration = Duration::from_secs(150);

/// Rotates the CA, waits for every node to run on the new one, retires
/// the old one and waits for every node to have rebuilt its tunnels.
pub(super) async fn ca_rotation(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("CA rotation");
    run.phase("CA rotation");
    let old = w.cp.trust().await?;
    let printed = w.cp.ca_command(&w.bins.controller, &["rotate"])?;
    let both = w.cp.trust().await?;
    let new = both
        .certificates()
        .iter()
        .find(|c| !old.contains(c.der()))
        .cloned();
    let Some(new) = new else {
        return fail(format!(
            "`ca rotate` printed {printed:?} but the bundle holds no new CA"
        ));
    };
    let both_digest = both.digest().to_hex();
    run.line(
        "CA rotation",
        "-",
        format!(
            "ca rotate: bundle of {} CAs, digest {}…; the nodes renew onto the new CA",
            both.certificates().len(),
            &both_digest[..12]
        ),
    );
    each_node(
        run,
        w,
        ("CA rotation", "CA renewal"),
        (
            "not every node renewed onto the new CA",
            "CA rotation: renewing onto the signing CA",
        ),
        |_, node, s| {
            let on_new = leaf_of(node).is_some_and(|l| l.verify_issued_by(&new).is_ok());
            (on_new
                && s.configuration_applied
                && s.trust_digest.map(|d| d.to_hex()) == Some(both_digest.clone()))
            .then(|| {
                format!(
                    "generation {} from the new CA active, two-CA trust acknowledged",
                    s.generation.unwrap_or_default()
                )
            })
        },
    )
    .await?;
    // Echoes sent just before the last renewal need a few seconds to be
    // judged before the window opens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.done("CA rotation");

    run.begin("CA retirement");
    run.phase("CA retirement");
    let rebuilt_before: Vec<usize> = w.nodes.iter().map(rebuilds).collect();
    // The SAs of every lease now: the rebuild is over once none is left.
    let before: Vec<BTreeSet<String>> = w.nodes.iter().map(lease_spis).collect();
    w.cp.ca_command(
        &w.bins.controller,
        &["retire", "--acknowledged-digest", &both_digest],
    )?;
    let retired = w.cp.trust().await?;
    if !only(&retired, &new) {
        return fail("`ca retire` left a bundle other than the new CA alone");
    }
    let retired_digest = retired.digest().to_hex();
    run.line(
        "CA retirement",
        "-",
        format!(
            "ca retire: the bundle is the new CA alone, digest {}…",
            &retired_digest[..12]
        ),
    );
    each_node(
        run,
        w,
        ("CA retirement", "CA retired"),
        (
            "not every node dropped the old CA and rebuilt its tunnels",
            REBUILT,
        ),
        |i, node, s| {
            (s.configuration_applied
                && s.trust_digest.map(|d| d.to_hex()) == Some(retired_digest.clone())
                && rebuilds(node) > rebuilt_before[i])
                .then(|| "old CA dropped, tunnels rebuilt make-before-break".to_string())
        },
    )
    .await?;
    let n = w.nodes.len();
    let deadline = Instant::now() + PATIENCE;
    // Each node deletes the SAs it replaced once the new ones are in; a
    // packet in flight on one of them when it goes is the rebuild's too.
    loop {
        let left: Vec<usize> = (0..n)
            .filter(|&i| !lease_spis(&w.nodes[i]).is_disjoint(&before[i]))
            .collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let names: Vec<&str> = left.iter().map(|&i| w.cp.nodes[i].name.as_str()).collect();
            return fail(format!(
                "an SA from before the retirement outlived the rebuild on {names:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.line(
        "CA retirement",
        "-",
        "every SA from before the retirement is gone",
    );
    // The rebuilds' last echoes are judged inside the window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.done("CA retirement");
    run.phase("CA retired");
    refresh_rows(run, w).await;
    Ok(())
}

/// Polls every node's `/status` until `done` (given the node's index, the
/// node and its status) names what it got to, recording that as an event
/// `kind` and a progress line of `step` for each node as it does; fails
/// after [`PATIENCE`] with `late` and the agent's log line to look for.
async fn each_node(
    run: &mut Run<'_>,
    w: &mut World,
    (step, kind): (&str, &str),
    (late, look_for): (&str, &str),
    mut done: impl FnMut(usize, &SimNode, &Status) -> Option<String>,
) -> Step {
    let deadline = Instant::now() + PATIENCE;
    let mut there = vec![false; w.nodes.len()];
    while there.contains(&false) {
        for (i, got) in there.iter_mut().enumerate() {
            if *got {
                continue;
            }
            let Some(s) = w.nodes[i].parsed_status().await else {
                continue;
            };
            update_row(&mut run.summary.nodes[i], &s);
            if let Some(detail) = done(i, &w.nodes[i], &s) {
                *got = true;
                w.event(kind, i, unix_now(), detail.clone());
                run.line(step, &w.cp.nodes[i].name.clone(), detail);
            }
        }
        if Instant::now() > deadline {
            return fail(format!(
                "{late} within {} s; see agent.log (\"{look_for}\")",
                PATIENCE.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// The leaf OVSDB points `n`'s monitor at, if it reads.
fn leaf_of(n: &SimNode) -> Option<Certificate> {
    let path = n
        .node
        .vsctl(&["get", "Open_vSwitch", ".", "other_config:certificate"])
        .ok()?;
    let pem = std::fs::read(path.trim().trim_matches('"')).ok()?;
    Certificate::from_pem(&pem).ok()
}

/// The SPIs of the ESP SAs of `n`'s lease in its kernel (none when the
/// lease or the kernel cannot be read).
fn lease_spis(n: &SimNode) -> BTreeSet<String> {
    n.lease()
        .and_then(|(_, reqid)| n.node.esp_spis(Some(reqid)).ok())
        .unwrap_or_default()
}

/// How often `n`'s agent has logged a rebuild so far.
fn rebuilds(n: &SimNode) -> usize {
    n.logs().matches(REBUILT).count()
}

/// Whether `bundle` holds `ca` and nothing else.
fn only(bundle: &TrustBundle, ca: &Certificate) -> bool {
    bundle.certificates().len() == 1 && bundle.contains(ca.der())
}
