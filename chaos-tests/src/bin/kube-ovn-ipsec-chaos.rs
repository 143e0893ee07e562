//! `kube-ovn-ipsec`, the same command line (`kube_ovn_ipsec_runtime::cli`),
//! with one fault point armed: the process stops itself (SIGSTOP) when it
//! reaches the point `CHAOS_STOP_AT` names, so the test that started it
//! can SIGKILL it exactly there (docs/chaos.md). The names are those of
//! `chaos::plan::Point` (an activation, `run`) and of
//! `kube_ovn_ipsec_runtime::cleanup::Point` (a release, `cleanup`).
//! Without `CHAOS_STOP_AT` it is the agent binary.

use std::sync::Arc;

use chaos::inject::{Injector, stop_process};
use chaos::plan::Point;
use kube_ovn_ipsec_runtime::{agent, cleanup, cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let wanted = std::env::var("CHAOS_STOP_AT").ok();
    let mut agent_seams = agent::Seams::default();
    let mut cleanup_seams = cleanup::Seams::default();
    if let Some(name) = wanted {
        if let Some(point) = Point::ALL.into_iter().find(|p| p.name() == name) {
            let injector = Injector::stopping();
            // Nobody listens in-process: the stop itself is the report.
            drop(injector.arm(point));
            agent_seams.wrap = Some(Box::new(move |a| injector.wrap(a)));
        } else if cleanup::Point::ALL.iter().any(|p| p.name() == name) {
            cleanup_seams.at = Some(Arc::new(move |p: cleanup::Point| {
                if p.name() == name {
                    stop_process(p.name());
                }
            }));
        } else {
            eprintln!("CHAOS_STOP_AT names no point: {name:?}");
            return std::process::ExitCode::from(2);
        }
    }
    cli::main_with(agent_seams, cleanup_seams).await
}
