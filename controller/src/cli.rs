//! The `kube-ovn-ipsec-controller` command line: flags, logging, then
//! [`crate::run`] or one of the maintenance commands. A library module so
//! that a second binary (the chaos suite's, which SIGKILLs it) runs the
//! very same program.

use std::sync::Arc;

use crate::ca::{self, CaSettings};
use crate::config::Config;
use crate::metrics::Metrics;
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube_ovn_ipsec_api::clock::SystemClock;

#[derive(Parser)]
#[command(version, about = "Kube-OVN IPsec CSR controller")]
struct Cli {
    #[command(flatten)]
    config: Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Built-in CA maintenance (see docs/controller.md, "CA rotation").
    Ca {
        #[command(subcommand)]
        op: CaOp,
    },
    /// Prints the enable/disable cohort (read only): phase, epoch, and per
    /// node whether its receipt is in or why it is waiting.
    Status,
    /// Asks the coordinator to retire a target whose Node was re-created
    /// (same name, another UID; `status` shows it as NodeUIDChanged). The
    /// leader removes the target only if the cohort froze it with exactly
    /// this UID; the new Node then joins like any other.
    RetireNode {
        /// The Node's name.
        name: String,
        /// The UID the cohort froze for it: the deleted Node's.
        #[arg(long, required_unless_present = "withdraw")]
        uid: Option<String>,
        /// Withdraw the request for this Node instead.
        #[arg(long, conflicts_with = "uid")]
        withdraw: bool,
    },
}

#[derive(Subcommand)]
enum CaOp {
    /// Generate a new CA, add it to the trust bundle, make it the signer.
    Rotate,
    /// Remove every CA but the active one from the trust bundle.
    Retire {
        /// The trust digest every node reports as acknowledged; must equal
        /// the bundle's current digest.
        #[arg(long)]
        acknowledged_digest: String,
    },
}

/// The whole program, from `std::env::args` to its end: parses the flags,
/// installs the JSON logger ([`crate::logging`]), then runs the controller
/// until SIGTERM or SIGINT (or the maintenance command asked for). The
/// error it ends with, which the runtime prints as `Error: …`, is redacted
/// like a log line.
pub async fn main() -> anyhow::Result<()> {
    crate::logging::init();
    program().await.map_err(|e| {
        let text = format!("{e:?}");
        anyhow::Error::msg(kube_ovn_ipsec_api::logsafe::redact_str(&text).into_owned())
    })
}

async fn program() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let client = kube_client().await.context("kubernetes client")?;
    let config = cli.config;
    match cli.command {
        Some(Command::Ca { op: CaOp::Rotate }) => {
            let settings = CaSettings {
                namespace: config.namespace.clone(),
                algorithm: config.ca_key_algorithm,
                lifetime: config.ca_lifetime,
            };
            let bundle = ca::rotate_ca(&client, &settings, &SystemClock).await?;
            println!("new trust digest: {}", bundle.digest());
        }
        Some(Command::Ca {
            op: CaOp::Retire {
                acknowledged_digest,
            },
        }) => {
            let bundle =
                ca::retire_old_cas(&client, &config.namespace, &acknowledged_digest).await?;
            println!("new trust digest: {}", bundle.digest());
        }
        Some(Command::RetireNode { name, uid, .. }) => {
            let uid = uid
                .map(kube_ovn_ipsec_api::ident::Uid::new)
                .transpose()
                .context("--uid")?;
            println!(
                "{}",
                crate::coordination::run::request_retirement(
                    &client,
                    &config.namespace,
                    &name,
                    uid
                )
                .await?
            );
        }
        Some(Command::Status) => {
            let d = crate::coordination::run::describe(&client, &config.namespace).await?;
            print!("{}", d.text);
            if let Some(fault) = d.fault {
                anyhow::bail!(fault);
            }
        }
        None => {
            let metrics = Arc::new(Metrics::new());
            let listener = tokio::net::TcpListener::bind(config.metrics_addr)
                .await
                .with_context(|| format!("bind metrics address {}", config.metrics_addr))?;
            let (tx, rx) = tokio::sync::watch::channel(false);
            let mut rx2 = rx.clone();
            tokio::spawn(crate::serve_metrics(
                listener,
                metrics.clone(),
                async move {
                    let _ = rx2.changed().await;
                },
            ));
            // Installed before anything slow: a SIGTERM during start-up then
            // still ends in a clean stop instead of the default disposition.
            let stop = shutdown_signal()?;
            tokio::spawn(async move {
                let signal = stop.await;
                tracing::info!(signal, "shutting down");
                let _ = tx.send(true);
            });
            let mut rx3 = rx;
            crate::run(
                client,
                &config,
                metrics,
                Arc::new(SystemClock),
                async move {
                    let _ = rx3.changed().await;
                },
            )
            .await?;
            tracing::info!("kube-ovn-ipsec-controller stopped");
        }
    }
    Ok(())
}

/// The Kubernetes client as `kube::Client::try_default` finds it — the
/// kubeconfig (`KUBECONFIG`, `~/.kube/config`), else the in-cluster
/// ServiceAccount — without its failure's words where they can quote a
/// credential: the YAML parser's message shows the document around the
/// fault, a token included, and `Config::infer` logs it at TRACE.
async fn kube_client() -> anyhow::Result<kube::Client> {
    use kube::config::{KubeConfigOptions, KubeconfigError};
    let mut config = match kube::Config::from_kubeconfig(&KubeConfigOptions::default()).await {
        Ok(config) => config,
        Err(kubeconfig) => {
            let kubeconfig = match kubeconfig {
                KubeconfigError::Parse(_) => "the kubeconfig is not valid YAML (the parser's \
                    message is not shown: it quotes the file, credentials included)"
                    .to_owned(),
                other => other.to_string(),
            };
            kube::Config::incluster().map_err(|in_cluster| {
                anyhow::anyhow!("no kubeconfig ({kubeconfig}) and not in a cluster ({in_cluster})")
            })?
        }
    };
    config.apply_debug_overrides();
    // kube-rs panics on a static token that is no valid header value.
    if let Some(token) = &config.auth_info.token {
        use secrecy::ExposeSecret as _;
        if http::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret())).is_err() {
            anyhow::bail!(
                "the kubeconfig's token is not a valid HTTP header value \
                 (it holds a line break or another control character)"
            );
        }
    }
    Ok(kube::Client::try_from(config)?)
}

/// Resolves with the signal's name on the first SIGTERM (what the kubelet
/// sends to stop a Pod) or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
