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
    /// Run the whole IPsec lifecycle on simulated nodes (the real OVS,
    /// OVN, strongSwan, kernel XFRM, agent and controller), printing each
    /// step, then the summary. Exits non-zero naming the failed step.
    Up(UpCli),
    /// Remove everything a lab created (processes, guest, namespaces,
    /// directories), also after the lab itself crashed.
    Down,
    /// Print the running lab's table (or the last run's).
    Status {
        /// The summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the embedded Kubernetes API server until SIGTERM or ctrl-c.
    Apiserver(ApiserverArgs),
}

#[derive(Debug, clap::Args)]
struct UpCli {
    /// Simulated nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(2..=20))]
    nodes: u16,
    /// The summary as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
    /// The certificate lifetime the agents ask for, in seconds (at least
    /// Kubernetes' 600). Default: 600 on a kernel with ESP, 780 on the
    /// emulated guest, so that the renewal falls after `Enabled`
    /// (docs/lab.md).
    #[arg(long, value_parser = clap::value_parser!(u32).range(600..))]
    certificate_lifetime: Option<u32>,
    /// The probe streams' interval, in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(50..=5000))]
    probe_interval_ms: u64,
    /// The agents' IKE_SA lifetime, in seconds: short, so that IKE_SAs are
    /// rekeyed while the lab watches. Rekeying starts one to two margins
    /// (a quarter of the shorter lifetime) before a lifetime ends.
    #[arg(long, default_value_t = lab::up::DEFAULT_IKE_LIFETIME, value_parser = clap::value_parser!(u64).range(20..))]
    ike_lifetime: u64,
    /// The agents' CHILD_SA lifetime, in seconds.
    #[arg(long, default_value_t = lab::up::DEFAULT_CHILD_LIFETIME, value_parser = clap::value_parser!(u64).range(20..))]
    child_lifetime: u64,
    /// Keep the nodes' logs (agent, controller, charon, monitor,
    /// vswitchd) after a run that passed, as a failed run keeps them;
    /// `down` removes them.
    #[arg(long)]
    keep_logs: bool,
    /// A patched ovn-controller (the project's image/patches applied) to
    /// run on every node instead of the emulation: real chassis in SB, a
    /// logical switch for the pods, the tunnels ovn-controller builds.
    #[arg(long, env = harness::ovn_controller::ENV_OVN_CONTROLLER)]
    ovn_controller: Option<std::path::PathBuf>,
    /// Run here and report on the console (what `up` runs inside the guest).
    #[arg(long, hide = true)]
    in_guest: bool,
    /// The kernel as `up` described it (with `--in-guest`).
    #[arg(long, hide = true, default_value = "")]
    kernel_description: String,
    /// The lab's directory, shared with the guest (with `--in-guest`).
    #[arg(long, hide = true, default_value = "/tmp/koi-lab-logs")]
    dir: std::path::PathBuf,
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

async fn up(cli: UpCli) -> anyhow::Result<()> {
    let args = lab::up::UpArgs {
        nodes: usize::from(cli.nodes),
        certificate_lifetime: cli.certificate_lifetime,
        probe_interval: std::time::Duration::from_millis(cli.probe_interval_ms),
        rekeying: lab::up::lab_rekeying(cli.ike_lifetime, cli.child_lifetime)?,
        json: cli.json,
        keep_logs: cli.keep_logs,
        ovn_controller: cli.ovn_controller.filter(|p| !p.as_os_str().is_empty()),
    };
    if cli.in_guest {
        let summary = lab::up::in_guest(&args, cli.kernel_description, cli.dir).await;
        std::process::exit(i32::from(summary.failed.is_some()));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Interrupted, the run's future is dropped: its processes, namespaces
    // and guest are stopped by their owners' drops; `down` does the rest.
    let summary = tokio::select! {
        s = lab::up::up(&args) => s?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; `kube-ovn-ipsec-lab down` removes what is left"),
        _ = term.recv() => anyhow::bail!("terminated; `kube-ovn-ipsec-lab down` removes what is left"),
    };
    if cli.json {
        println!("{}", summary.to_json());
    } else {
        println!("\n{}", summary.table());
    }
    match &summary.failed {
        Some(f) => anyhow::bail!("the lab failed at step `{}`: {}", f.step, f.reason),
        None => Ok(()),
    }
}

fn down() -> anyhow::Result<()> {
    let dir = std::path::Path::new(lab::state::RUN_DIR);
    let report = lab::state::down(dir)?;
    let _ = std::fs::remove_file(dir.join(lab::up::STATUS_FILE));
    if let Some(why) = &report.unusable_state {
        println!("the state file was unusable ({why}): removed what the namespace prefix names");
    }
    if report.stopped.is_empty() && report.dirs.is_empty() {
        println!("no lab processes or directories left; stale lab namespaces, if any, removed");
    } else {
        println!(
            "stopped {:?}, removed {}",
            report.stopped,
            report
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for skipped in &report.skipped {
        println!(
            "left {} untouched: the state file names it, but {}",
            skipped.path.display(),
            skipped.why
        );
    }
    Ok(())
}

fn status(json: bool) -> anyhow::Result<()> {
    let dir = std::path::Path::new(lab::state::RUN_DIR);
    let recorded = lab::state::read_state(dir)?;
    let stale = recorded.as_ref().filter(|s| !s.live()).map(|s| {
        format!(
            "the lab of PID {} stopped without `down`; `kube-ovn-ipsec-lab down` removes what it left",
            s.process.pid
        )
    });
    let running = recorded.filter(lab::state::LabState::live);
    let path = dir.join(lab::up::STATUS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match running {
            Some(s) => {
                println!(
                    "a lab is running (PID {}, kernel {}): starting, no step reported yet",
                    s.process.pid, s.kernel
                );
                return Ok(());
            }
            None => match stale {
                Some(stale) => anyhow::bail!("no lab is running: {stale}"),
                None => anyhow::bail!("no lab is running and none has run since the last `down`"),
            },
        },
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let summary = lab::summary::Summary::from_json(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if json {
        println!("{}", summary.to_json());
        return Ok(());
    }
    match running {
        Some(s) => println!(
            "a lab is running (PID {}, kernel {})\n",
            s.process.pid, s.kernel
        ),
        None => match stale {
            Some(stale) => println!("no lab is running ({stale}); its run:\n"),
            None => println!("no lab is running; the last run:\n"),
        },
    }
    print!("{}", summary.table());
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let outcome = match Cli::parse().command {
        Command::Up(cli) => up(cli).await,
        Command::Down => down(),
        Command::Status { json } => status(json),
        Command::Apiserver(args) => apiserver(args).await,
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain, not a backtrace: what an operator acts on.
            eprintln!("kube-ovn-ipsec-lab: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
