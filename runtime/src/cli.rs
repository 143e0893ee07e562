//! The `kube-ovn-ipsec` command line: `run` is the `ipsec` container of the
//! kube-ovn-cni Pod (SPEC §1; the wiring lives in [`crate::agent`]),
//! `cleanup` the one-shot `ipsec-cleanup` init container that replaces it
//! once IPsec is disabled ([`crate::cleanup`]).
//!
//! The binary is [`main_with`] with default seams. It is a library
//! function so the chaos suite can build the same binary with its fault
//! points wired in (`chaos-tests`, docs/chaos.md) rather than a copy of
//! this parsing and exit-code mapping.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::Subscriber;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::{Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::agent::{self, RunArgs};
use crate::cleanup::{self, CleanupArgs, Outcome};

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

/// The agent's log layer: the controller's ([`kube_ovn_ipsec_api::logsafe::json_layer`]:
/// JSON lines, kube-rs' body-echoing events never written, PEM and tokens
/// redacted, whatever `RUST_LOG` says; docs/controller.md, "Logs and
/// secrets").
pub fn log_layer<S, W, F>(filter: EnvFilter, make: F) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: std::io::Write,
    F: Fn() -> W + Send + Sync + 'static,
{
    kube_ovn_ipsec_api::logsafe::json_layer(filter, make)
}

fn init_logging() {
    // JSON logs for the cluster's log pipeline; RUST_LOG overrides the level.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::registry()
        .with(log_layer(filter, std::io::stderr))
        .init();
}

/// Parses the process's arguments and runs the subcommand until it ends or
/// SIGTERM/SIGINT asks it to stop; the exit code is the error's
/// (`kube_ovn_ipsec_api::names::exit_code`). `agent` and `cleanup` are the seams each
/// subcommand runs with (defaults for the real binary).
pub async fn main_with(agent: agent::Seams, cleanup: cleanup::Seams) -> ExitCode {
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
        Command::Run(args) => agent::run::run_with(*args, rx, agent).await,
        Command::Cleanup(args) => {
            return match cleanup::run_with(*args, rx, cleanup).await {
                Ok(Outcome::NothingToRelease(why)) => {
                    tracing::info!(reason = %why, "nothing to release");
                    ExitCode::SUCCESS
                }
                Ok(Outcome::Released { .. }) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, exit_code = e.exit_code(), "cleanup did not release this node");
                    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, exit_code = e.exit_code(), "agent failed");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}
