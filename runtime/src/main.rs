//! `kube-ovn-ipsec`: the agent binary. `run` is the `ipsec` container of the
//! kube-ovn-cni Pod (SPEC §1), `cleanup` the one-shot `ipsec-cleanup` init
//! container that replaces it once IPsec is disabled; the command line is
//! `kube_ovn_ipsec_runtime::cli`. Started as `ovs-appctl` (the image's
//! link), it is the troubleshooting front of `kube_ovn_ipsec_runtime::appctl`.

use kube_ovn_ipsec_runtime::{agent, appctl, cleanup, cli};

fn main() -> std::process::ExitCode {
    let mut args = std::env::args_os();
    if args.next().is_some_and(|p| appctl::invoked_as_appctl(&p)) {
        return appctl::exec(&args.collect::<Vec<_>>());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kube-ovn-ipsec: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(cli::main_with(
        agent::Seams::default(),
        cleanup::Seams::default(),
    ))
}
