//! The actor-kill step: one agent's ovs-monitor-ipsec (the process behind
//! its monitor actor) killed with SIGKILL, and the agent must restart it
//! and report healthy with its configuration applied again. It shows a
//! crashed daemon under the agent is recovered without an operator, and
//! how long that takes.

use std::time::{Duration, Instant};

use super::context::{Run, Step, fail};
use super::rows::refresh_rows;
use super::world::World;

/// Kills one agent's ovs-monitor-ipsec (the monitor actor's process) and
/// waits for the agent to restart it and be healthy again.
pub(super) async fn actor_kill(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("actor kill");
    run.phase("actor kill");
    let i = w.nodes.len() - 1;
    let name = w.cp.nodes[i].name.clone();
    let Some(pid) = w.nodes[i].monitor_pid() else {
        return fail(format!("{name}: no ovs-monitor-ipsec under its agent"));
    };
    let t = Instant::now();
    let raw = i32::try_from(pid).unwrap_or(0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    w.event(
        "monitor killed",
        i,
        testbed::probe::unix_now(),
        format!("SIGKILL to PID {pid}"),
    );
    run.line(
        "actor kill",
        &name,
        format!("SIGKILL to ovs-monitor-ipsec (PID {pid}), the monitor actor's process"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen_unhealthy = false;
    loop {
        let s = w.nodes[i].parsed_status().await;
        let healthy = s
            .as_ref()
            .is_some_and(|s| s.runtime_healthy && s.configuration_applied);
        seen_unhealthy |= !healthy;
        let restarted = w.nodes[i].monitor_pid().is_some_and(|p| p != pid);
        if restarted && healthy {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "{name}: the agent did not restart ovs-monitor-ipsec and report healthy in 120 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let secs = (t.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    run.summary.figures.actor_recovery_s = Some(secs);
    run.line(
        "actor recovered",
        &name,
        format!(
            "new ovs-monitor-ipsec, runtime healthy and configuration applied after {secs} s{}",
            if seen_unhealthy {
                " (reported unhealthy meanwhile)"
            } else {
                ""
            }
        ),
    );
    refresh_rows(run, w).await;
    run.done("actor kill");
    Ok(())
}
