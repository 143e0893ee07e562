//! The renewal step: every agent renews its certificate (a new
//! generation, its configuration applied) while the probe streams run, and
//! the echoes lost across it are counted. Renewal is the one lifecycle
//! event that recurs for as long as IPsec is on, so its cost in lost
//! traffic is reported on its own.

use std::time::{Duration, Instant};

use testbed::probe::unix_now;

use super::context::{Run, Step, fail};
use super::rows::{refresh_rows, update_row};
use super::world::World;

/// Waits for every agent to renew its certificate (a new generation)
/// while the probes run.
pub(super) async fn renewal(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("renewal");
    run.phase("renewal");
    let started = unix_now();
    let n = w.nodes.len();
    let mut renewed = vec![false; n];
    let mut renewed_before = vec![false; n];
    let mut early = Vec::new();
    for (i, (r, before)) in renewed
        .iter_mut()
        .zip(renewed_before.iter_mut())
        .enumerate()
    {
        // A renewal that fell before this step (it is timed from the
        // certificate, not from the lab) still counts; its echoes are in
        // the phase it fell in.
        if let Some(g) = w.nodes[i].parsed_status().await.and_then(|s| s.generation)
            && g > w.issued_generation[i]
        {
            *r = true;
            *before = true;
            // When is not known: the lab did not watch for it.
            early.push((i, g));
            run.line(
                "renewal",
                &w.cp.nodes[i].name.clone(),
                format!("already renewed before this step (generation {g})"),
            );
        }
    }
    // The renewal point is 40–60 % of the whole validity, which starts
    // LEAF_BACKDATE before the signing.
    let backdate = kube_ovn_ipsec_api::pki::LEAF_BACKDATE.as_secs();
    let latest = (u64::from(w.lifetime) + backdate) * 6 / 10 - backdate;
    let deadline = Instant::now() + Duration::from_secs(latest + 120);
    let mut seen = Vec::new();
    run.line(
        "renewal",
        "-",
        format!(
            "waiting for every agent's renewal (at 40–60 % of its {} s certificate)",
            w.lifetime
        ),
    );
    while renewed.iter().any(|r| !r) {
        for (i, done) in renewed.iter_mut().enumerate() {
            if *done {
                continue;
            }
            if let Some(s) = w.nodes[i].parsed_status().await {
                if s.generation.is_some_and(|g| g > w.issued_generation[i])
                    && s.configuration_applied
                {
                    *done = true;
                    seen.push((i, s.generation.unwrap_or_default(), unix_now()));
                    run.line(
                        "renewal",
                        &w.cp.nodes[i].name.clone(),
                        format!(
                            "generation {} active, expires {}",
                            s.generation.unwrap_or_default(),
                            s.expires.map(|e| e.to_string()).unwrap_or_default()
                        ),
                    );
                }
                update_row(&mut run.summary.nodes[i], &s);
            }
        }
        if Instant::now() > deadline {
            return fail("not every agent renewed its certificate in time; see agent.log");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (i, g, at) in seen {
        w.event("renewal", i, at, format!("generation {g} active"));
    }
    for (i, g) in early {
        let at = started;
        w.event(
            "renewal",
            i,
            at,
            format!("generation {g}, before the step (its time unknown)"),
        );
    }
    // Echoes sent just before the last renewal need a few seconds to be judged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ended = unix_now();
    let lost: u32 = w
        .probes
        .iter()
        .map(|p| p.log().tally(started, ended).lost)
        .sum();
    run.summary.figures.renewal_lost = Some(lost);
    let early = renewed_before.iter().filter(|b| **b).count();
    run.summary.figures.renewed_before_step = u32::try_from(early).unwrap_or(u32::MAX);
    run.line(
        "renewal",
        "-",
        if early == 0 {
            format!("every agent renewed; {lost} echoes lost across it")
        } else {
            format!(
                "every agent renewed; {lost} echoes lost in this step; {early} renewal(s) fell \
                 before it, their losses are in the phases they fell in"
            )
        },
    );
    refresh_rows(run, w).await;
    run.done("renewal");
    Ok(())
}
