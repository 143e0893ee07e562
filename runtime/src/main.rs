//! `kube-ovn-ipsec`: the agent binary. `run` is the `ipsec` container of the
//! kube-ovn-cni Pod (SPEC §1), `cleanup` the one-shot `ipsec-cleanup` init
//! container that replaces it once IPsec is disabled; the command line is
//! `kube_ovn_ipsec_runtime::cli`.

use kube_ovn_ipsec_runtime::{agent, cleanup, cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    cli::main_with(agent::Seams::default(), cleanup::Seams::default()).await
}
