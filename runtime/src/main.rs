//! `kube-ovn-ipsec`: the agent binary. `run` is the `ipsec` container of the
//! kube-ovn-cni Pod (SPEC §1); the wiring lives in
//! `kube_ovn_ipsec_runtime::agent`.

use clap::{Parser, Subcommand};
use kube_ovn_ipsec_runtime::agent::{self, RunArgs};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Kube-OVN node IPsec agent.
#[derive(Debug, Parser)]
#[command(name = "kube-ovn-ipsec", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (the `ipsec` container) until SIGTERM.
    Run(Box<RunArgs>),
}

fn init_logging() {
    // JSON logs for the cluster's log pipeline; RUST_LOG overrides the level.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    init_logging();
    let cli = Cli::parse();
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        let _ = tx.send(true);
    });
    let result = match cli.command {
        Command::Run(args) => agent::run::run(*args, rx).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, exit_code = e.exit_code(), "agent failed");
            std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}
