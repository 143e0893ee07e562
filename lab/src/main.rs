//! `kube-ovn-ipsec-lab`: the lab's command line. Each subcommand is a thin
//! wrapper around the library.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use apiserver::{ADMIN_TOKEN, ApiServer};
use clap::{Parser, Subcommand};

/// The kube-ovn IPsec lab.
#[derive(Debug, Parser)]
#[command(name = "kube-ovn-ipsec-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the real OVS and OVN databases and ovn-northd, activate an
    /// identity generation and flip the NB/SB ipsec switch, printing each step.
    Demo,
    /// Run the embedded Kubernetes API server until SIGTERM or ctrl-c.
    Apiserver(ApiserverArgs),
}

#[derive(Debug, clap::Args)]
struct ApiserverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write an admin kubeconfig here.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Enforce RBAC (the admin token always bypasses it).
    #[arg(long)]
    rbac: bool,
}

async fn apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let server = ApiServer::builder()
        .listen(args.listen)
        .rbac(args.rbac)
        .start()
        .await?;
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path, ADMIN_TOKEN)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{}", server.addr());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Demo => {
            let dir = tempfile::tempdir().context("creating the lab's temporary directory")?;
            lab::demo::run(dir.path()).await?;
            Ok(())
        }
        Command::Apiserver(args) => apiserver(args).await,
    }
}
