//! The SAs step: each pair's enable window (the SB flip to the first
//! encrypted reply), then every node holding the ESP SAs of its lease for every peer
//! with its IKE_SAs established, then the coordination record `Enabled`.
//! The figures it records (time to SAs, to `Enabled`) are the lab's
//! enable-side measurements.

use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::coordination::CoordinationPhase;

use super::context::{Run, Step, fail};
use super::readings::{lease_sas, lease_sas_want};
use super::rows::refresh_rows;
use super::windows::pair_windows;
use super::world::World;

/// The enable windows, the SAs, `Enabled` (`flipped`: SB's commit of the
/// flip).
pub(super) async fn sas(run: &mut Run<'_>, w: &mut World, flipped: Instant) -> Step {
    run.begin("SAs");
    let n = w.nodes.len();
    let windows = pair_windows(
        run,
        w,
        "enable window",
        Duration::from_secs(300),
        "encrypted",
        ("the SB flip", flipped),
    )?;
    for (k, &ms) in windows.iter().enumerate() {
        let (a, b) = w.pairs[k];
        run.summary.pairs[k].enable_window_ms = Some(ms);
        for x in [a, b] {
            let row = &mut run.summary.nodes[x];
            row.enable_window_ms = Some(row.enable_window_ms.map_or(ms, |m| m.max(ms)));
        }
    }
    let want = lease_sas_want(n);
    // Under emulation a pair may negotiate twice (both ends ACQUIRE) and
    // settle later: wait for every node at once.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counts: Vec<u32> = w.nodes.iter().map(lease_sas).collect();
        if counts.iter().all(|&c| c >= want) {
            for (i, c) in counts.iter().enumerate() {
                run.summary.nodes[i].sas = Some(*c);
                let ike = w.nodes[i]
                    .node
                    .ike_sas()
                    .map(|v| v.iter().filter(|s| s.state == "ESTABLISHED").count())
                    .unwrap_or(0);
                run.line(
                    "SAs",
                    &w.cp.nodes[i].name.clone(),
                    format!("{ike} IKE_SAs established, {c} ESP SAs of its lease in the kernel"),
                );
            }
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "ESP SAs of the leases per node {counts:?}, want {want} each (one in, one out per peer)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.summary.figures.up_to_sas_s = Some(run.secs());
    let deadline = Instant::now() + Duration::from_secs(120);
    while w.cp.record().await?.map(|r| r.phase) != Some(CoordinationPhase::Enabled) {
        if Instant::now() > deadline {
            return fail("the coordination record did not reach Enabled within 120 s of the SAs");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    run.phase("Enabled");
    run.summary.figures.up_to_enabled_s = Some(run.secs());
    run.line(
        "Enabled",
        "-",
        format!(
            "coordination Enabled; {:.1} s from the flip",
            flipped.elapsed().as_secs_f64()
        ),
    );
    refresh_rows(run, w).await;
    run.done("SAs");
    Ok(())
}
