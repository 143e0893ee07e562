//! `kube-ovn-ipsec`: the agent binary. `run` is the `ipsec` container of the
//! kube-ovn-cni Pod (SPEC §1); the wiring lives in
//! `kube_ovn_ipsec_runtime::agent`. `cleanup` is the one-shot
//! `ipsec-cleanup` init container that replaces it once IPsec is disabled
//! (`kube_ovn_ipsec_runtime::cleanup`).

use clap::{Parser, Subcommand};
use kube_ovn_ipsec_runtime::agent::{self, RunArgs};
use kube_ovn_ipsec_runtime::cleanup::{self, CleanupArgs, Outcome};
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
    /// Withdraw exactly this node's IPsec state after a disable and publish
    /// the signed release receipt (the `ipsec-cleanup` init container).
    Cleanup(Box<CleanupArgs>),
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
        Command::Cleanup(args) => {
            return match cleanup::run(*args, rx).await {
                Ok(Outcome::NothingToRelease(why)) => {
                    tracing::info!(reason = %why, "nothing to release");
                    std::process::ExitCode::SUCCESS
                }
                Ok(Outcome::Released { .. }) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, exit_code = e.exit_code(), "cleanup did not release this node");
                    std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
                }
            };
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, exit_code = e.exit_code(), "agent failed");
            std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}
