//! The disable step: the operator turns IPsec off — the controller
//! restarted with enable-ipsec=false turns NB and SB off, ovn-controller
//! (real or emulated) removes every tunnel's intent and marks together, and
//! each pair's disable window (NB and SB off seen to the first plaintext
//! reply) is measured. Traffic must come back in plaintext before any node is
//! cleaned up.

use std::time::{Duration, Instant};

use super::context::{Run, Step, fail, instant_of};
use super::readings::nb_sb;
use super::windows::pair_windows;
use super::world::World;
use testbed::probe::unix_now;

/// The operator turns IPsec off: NB/SB off, intent removed, the disable
/// window; returns when the operator's intent was given (the step's
/// start), which the cleanup rollout times `Disabled` from.
pub(super) async fn disable(run: &mut Run<'_>, w: &mut World) -> Step<Instant> {
    run.begin("disable");
    let t = Instant::now();
    w.cp.start_controller(&w.bins.controller, false)?;
    run.line(
        "disable",
        "-",
        "controller restarted with enable-ipsec=false",
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last_phase = None;
    loop {
        if let Some(r) = w.cp.record().await?
            && last_phase != Some(r.phase)
        {
            run.line("record", "-", r.phase);
            last_phase = Some(r.phase);
        }
        if nb_sb(&w.cp) == (false, false) {
            break;
        }
        if Instant::now() > deadline {
            return fail("NB and SB ipsec not off within 180 s of the intent");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The window opens with SB's commit, not with the poll that saw it.
    let off_at = w.sb_turned(false).unwrap_or_else(unix_now);
    let off = instant_of(off_at);
    run.phase_at("disable flip", off_at);
    run.line(
        "NB and SB off",
        "-",
        "the controller turned NB_Global.ipsec off",
    );
    for i in 0..w.nodes.len() {
        w.ovn.take_intent(&w.nodes, &w.nodes[i])?;
    }
    run.line(
        "tunnels",
        "-",
        format!("{} removed intent and marks together", w.ovn.name()),
    );
    let windows = pair_windows(
        run,
        w,
        "disable window",
        Duration::from_secs(120),
        "plaintext",
        ("the SB flip to off", off),
    )?;
    for (k, ms) in windows.into_iter().enumerate() {
        run.summary.pairs[k].disable_window_ms = Some(ms);
    }
    run.done("disable");
    Ok(t)
}
