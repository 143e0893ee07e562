//! `kube-ovn-ipsec`, the same command line (`kube_ovn_ipsec_runtime::cli`),
//! with the suite's fault points wired in: when `CHAOS_STOP_FILE` is set,
//! the process stops itself (SIGSTOP) at a point that file names when it
//! is crossed ([`chaos::inject::StopFile`]), so the test that started it
//! can kill a victim exactly there (docs/chaos.md). The names are those of
//! `chaos::plan::Point` (an activation, `run`), of
//! `chaos::inject::receipt_point` (a coordinated agent's receipt, `run`)
//! and of `kube_ovn_ipsec_runtime::cleanup::Point` (a release, `cleanup`).
//! Without `CHAOS_STOP_FILE` it is the agent binary.

use std::sync::Arc;

use chaos::inject::{Injector, StopFile, stop_process};
use kube_ovn_ipsec_runtime::{agent, cleanup, cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut agent_seams = agent::Seams::default();
    let mut cleanup_seams = cleanup::Seams::default();
    if let Some(path) = std::env::var_os("CHAOS_STOP_FILE") {
        let file = StopFile(path.into());
        let injector = Injector::stopping(file.clone());
        agent_seams.wrap = Some(Box::new(move |a| injector.wrap(a)));
        cleanup_seams.at = Some(Arc::new(move |p: cleanup::Point| {
            if file.take(p.name()) {
                stop_process(p.name());
            }
        }));
    }
    cli::main_with(agent_seams, cleanup_seams).await
}
