//! `kube-ovn-ipsec-controller`: the IPsec part of kube-ovn-controller.
//!
//! It validates every CSR for `signerName: kubeovn.io/signer` against live
//! cluster state (SPEC §6), approves and signs the ones that pass — with the
//! built-in CA or through the one dedicated cert-manager ClusterIssuer — and
//! denies the rest with a reason naming the failed check. It publishes the
//! trust bundle and exports metrics.
//!
//! # Layout
//!
//! Pure core (no I/O; unit-tested and fuzzed):
//! - [`pkcs10`]: the PKCS#10 parser, request bytes to
//!   [`pkcs10::RequestFacts`] ([`pkcs10::inspect_request`]; what the fuzzer drives).
//! - [`validate`]: the identity checks,
//!   `validate(csr, live, policy) -> Result<ValidatedCsr, Denial>`.
//! - [`denial`]: [`denial::Denial`], the reasons a CSR is denied.
//! - [`policy`]: [`policy::Policy`], what the operator allows.
//! - [`profile`]: what an issued leaf looks like (backdate, key usages, the
//!   `ipsec tunnel` EKU, lifetime bounds), for the signer and the
//!   cert-manager result check alike.
//! - [`signer`]: the built-in CA, issuing leaves to the profile.
//! - [`certmanager`]: the checks on a cert-manager result ([`certmanager::check_issued`])
//!   and the forwarding flow over a small [`certmanager::CertificateRequestApi`] trait.
//! - [`ca::plan_retire`]: the CA retirement decision.
//! - [`coordination`]: the enable/disable decision over the coordination
//!   record and the judgement of a node's signed receipt.
//!
//! PEM, certificates, the trust bundle and its chain verification, the SPKI
//! key-type parser and the clock trait are `kube_ovn_ipsec_api`'s (one
//! implementation shared with the agent).
//!
//! Kube glue (thin):
//! - [`live`]: API objects to views, live reads for one CSR.
//! - [`ca`]: the CA Secret and trust ConfigMap, rotation and retirement.
//! - [`reconcile`]: the kube-runtime controller over CSRs.
//! - [`resync`]: watches that relist periodically and after errors.
//! - [`secret`]: Secret requests whose bodies kube-rs never decodes (nor
//!   logs), with errors that name fields, never values.
//! - [`metrics`], [`config`], [`names`].
//! - [`logging`]: the JSON logger with the secret guards of
//!   `kube_ovn_ipsec_api::logsafe`.
//! - [`error`]: the crate's one error type (a leaf module).
//! - [`run`]: wires it all together; [`cli`] is the command line around it
//!   (`main.rs` only calls [`cli::main`]).

pub mod ca;
pub mod certmanager;
pub mod cli;
pub mod config;
pub mod coordination;
pub mod denial;
pub mod error;
pub mod events;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod pkcs10;
pub mod policy;
pub mod profile;
pub mod reconcile;
pub mod resync;
pub mod secret;
pub mod signer;
pub mod validate;

use std::future::Future;
use std::sync::{Arc, RwLock};

use crate::ca::CaSettings;
use crate::certmanager::{CertManagerConfig, CertManagerForwarder, KubeCertificateRequests};
use crate::config::Config;
use crate::error::Result;
use crate::metrics::Metrics;
use crate::reconcile::{Shared, SignerMode};
use kube_ovn_ipsec_api::clock::Clock;

pub use crate::error::Error;

/// Sets up the CA (or cert-manager forwarding) and runs the CSR controller
/// until `shutdown` resolves. Metrics are not served here (see
/// [`serve_metrics`]) so in-process users pick their own listener.
pub async fn run(
    client: kube::Client,
    config: &Config,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let policy = config.policy()?;
    let settings = CaSettings {
        namespace: config.namespace.clone(),
        algorithm: config.ca_key_algorithm,
        lifetime: config.ca_lifetime,
    };
    let (signer, trust) = if config.cert_manager {
        let trust = ca::read_bundle(&client, &config.namespace).await?;
        let api = KubeCertificateRequests::new(client.clone(), &config.namespace);
        let cm = CertManagerConfig {
            namespace: config.namespace.clone(),
            issuer_name: config.cert_manager_issuer_name.clone(),
            requester: config.controller_username(),
        };
        (
            SignerMode::CertManager(Box::new(CertManagerForwarder::new(api, cm))),
            trust,
        )
    } else {
        let (ca, trust) = ca::ensure_ca(&client, &settings, clock.as_ref()).await?;
        ca::announce_signing_ca(&client, &config.namespace, ca.certificate()).await?;
        (SignerMode::BuiltIn(RwLock::new(Arc::new(ca))), trust)
    };
    let (cache, feed) = if config.live_cache {
        let (cache, feed) =
            live::LiveCache::start(&client, &policy.cni_namespace, config.resync_period);
        (Some(cache), Some(Background(tokio::spawn(feed))))
    } else {
        (None, None)
    };
    if let Some(cache) = &cache
        && tokio::time::timeout(LIVE_CACHE_SYNC, cache.ready())
            .await
            .is_err()
    {
        // Not fatal: until the stores are synced every CSR is read directly.
        tracing::warn!("live-state cache not synced yet; reading directly meanwhile");
    }
    tracing::info!(
        trust_digest = %trust.digest(),
        cert_manager = config.cert_manager,
        "kube-ovn-ipsec-controller starting"
    );
    let shared = Arc::new(Shared {
        component: "kube-ovn-ipsec-controller".into(),
        client: client.clone(),
        policy,
        daemon_set: config.cni_daemonset.clone(),
        signer,
        trust: RwLock::new(trust),
        metrics,
        clock: clock.clone(),
        cache: cache.clone(),
        concurrency: config.concurrency,
        resync_period: config.resync_period,
    });
    let _reload = Background(tokio::spawn(reload_loop(
        shared.clone(),
        settings,
        config.cert_manager,
        config.ca_reload,
        clock,
    )));
    let _coordinator = match coordinator_config(config)? {
        Some(cc) => {
            let (client, clock) = (client.clone(), shared.clock.clone());
            Some(Background(tokio::spawn(coordination::run::run(
                client,
                cc,
                clock,
                std::future::pending::<()>(),
            ))))
        }
        None => {
            tracing::info!("no --ovn-nb: enable/disable coordination is off (CSR signing only)");
            None
        }
    };
    reconcile::run_controller(shared, shutdown).await;
    // The background tasks stop with `run` (their guards drop here, or
    // wherever `run`'s future is dropped).
    drop(feed);
    Ok(())
}

/// A task that lives exactly as long as this guard: [`run`]'s helpers stop
/// when `run` returns *or* when its future is dropped (an embedding that
/// aborts it), never outliving the controller.
struct Background(tokio::task::JoinHandle<()>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The key, certificate and CA files when a remote in `remotes` is
/// `ssl:`, checked now: the controller refuses to start on a file it
/// cannot read or parse (naming it), rather than retry a connection that
/// cannot succeed. `None` when no remote is `ssl:`.
fn ovn_tls(config: &Config, remotes: &[&str]) -> Result<Option<ovsdb::TlsFiles>> {
    let Some(ssl) = remotes.iter().find(|r| r.starts_with("ssl:")) else {
        return Ok(None);
    };
    let files = ovsdb::TlsFiles {
        private_key: config.ovn_ssl_private_key.clone(),
        certificate: config.ovn_ssl_certificate.clone(),
        ca_cert: config.ovn_ssl_ca_cert.clone(),
    };
    files
        .client_config()
        .map_err(|reason| Error::Config(format!("OVN remote {ssl}: {reason}")))?;
    Ok(Some(files))
}

/// The coordinator's settings, when `--ovn-nb` is given.
fn coordinator_config(config: &Config) -> Result<Option<coordination::run::CoordinatorConfig>> {
    let Some(nb) = &config.ovn_nb else {
        return Ok(None);
    };
    let sb = config.ovn_sb.clone().ok_or_else(|| {
        Error::Config("--ovn-nb needs --ovn-sb (the SB read confirms the switch)".into())
    })?;
    // The Pod name is what the Lease names as holder; outside a Pod, the
    // host name with the process ID stays unique per replica.
    let identity = config.pod_name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let ovn_tls = ovn_tls(config, &[nb.as_str(), sb.as_str()])?;
    Ok(Some(coordination::run::CoordinatorConfig {
        namespace: config.namespace.clone(),
        cni_namespace: config.cni_namespace.clone(),
        daemon_set: config.cni_daemonset.clone(),
        want_enabled: config.enable_ipsec,
        ovn_nb: nb.clone(),
        ovn_sb: sb,
        ovn_tls,
        period: config.coordination_period,
        lease_duration: config.lease_duration,
        identity,
        component: "kube-ovn-ipsec-controller".into(),
    }))
}

/// How long start-up waits for the live-state cache's initial lists.
const LIVE_CACHE_SYNC: std::time::Duration = std::time::Duration::from_secs(30);

/// Re-reads the CA Secret and the trust bundle so a rotation done with
/// `kube-ovn-ipsec-controller ca rotate` is picked up without a restart.
async fn reload_loop(
    shared: Arc<Shared>,
    settings: CaSettings,
    cert_manager: bool,
    every: std::time::Duration,
    clock: Arc<dyn Clock>,
) {
    loop {
        tokio::time::sleep(every).await;
        let result = if cert_manager {
            ca::read_bundle(&shared.client, &settings.namespace)
                .await
                .map(|t| (None, t))
        } else {
            ca::ensure_ca(&shared.client, &settings, clock.as_ref())
                .await
                .map(|(c, t)| (Some(c), t))
        };
        match result {
            Ok((ca, trust)) => {
                if let (Some(ca), SignerMode::BuiltIn(lock)) = (ca, &shared.signer) {
                    let signing = ca.certificate().clone();
                    if let Ok(mut current) = lock.write()
                        && current.cert_der() != ca.cert_der()
                    {
                        tracing::info!("picked up a new IPsec CA");
                        *current = Arc::new(ca);
                    }
                    // After the switch, and on every reload: a lost write
                    // or an operator's edit of the mark is repaired.
                    if let Err(e) =
                        ca::announce_signing_ca(&shared.client, &settings.namespace, &signing).await
                    {
                        shared.metrics.error(&e);
                        tracing::warn!(error = %e, "could not announce the signing CA");
                    }
                }
                if let Ok(mut t) = shared.trust.write() {
                    *t = trust;
                }
            }
            Err(e) => {
                shared.metrics.error(&e);
                tracing::warn!(error = %e, "could not reload the CA / trust bundle");
            }
        }
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                match metrics.encode() {
                    Ok(body) => (
                        axum::http::StatusCode::OK,
                        [("content-type", "text/plain; version=0.0.4")],
                        body,
                    ),
                    Err(_) => (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        [("content-type", "text/plain")],
                        String::new(),
                    ),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;

    fn config(args: &[&str]) -> Config {
        let cmd = Config::augment_args(clap::Command::new("kube-ovn-ipsec-controller"));
        let matches = cmd
            .no_binary_name(true)
            .try_get_matches_from(args)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        <Config as clap::FromArgMatches>::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn an_ssl_remote_needs_readable_files_and_a_tcp_one_none() {
        let tcp = config(&[
            "--ovn-nb",
            "tcp:10.0.0.1:6641",
            "--ovn-sb",
            "tcp:10.0.0.1:6642",
        ]);
        let c = coordinator_config(&tcp).unwrap().unwrap();
        assert_eq!(c.ovn_tls, None);
        // A CA and a certificate that read, a key file that is not there.
        let dir = tempfile::tempdir().unwrap();
        let ca = kube_ovn_ipsec_api::test_util::TestCa::p256("OVN CA");
        let (ca_file, cert_file) = (dir.path().join("cacert"), dir.path().join("cert"));
        std::fs::write(&ca_file, ca.cert_pem()).unwrap();
        std::fs::write(&cert_file, ca.cert_pem()).unwrap();
        let key = dir.path().join("no-such-key");
        let ssl = config(&[
            "--ovn-nb",
            "ssl:10.0.0.1:6641",
            "--ovn-sb",
            "tcp:10.0.0.1:6642",
            "--ovn-ssl-ca-cert",
            ca_file.to_str().unwrap(),
            "--ovn-ssl-certificate",
            cert_file.to_str().unwrap(),
            "--ovn-ssl-private-key",
            key.to_str().unwrap(),
        ]);
        let e = coordinator_config(&ssl).unwrap_err().to_string();
        assert!(e.contains("ssl:10.0.0.1:6641"), "{e}");
        assert!(
            e.contains("private key file") && e.contains("no-such-key"),
            "{e}"
        );
        // Without any of the files, the first one read is named.
        let none = config(&["--ovn-nb", "tcp:a:1", "--ovn-sb", "ssl:b:2"]);
        let e = coordinator_config(&none).unwrap_err().to_string();
        assert!(
            e.contains("ssl:b:2") && e.contains("/var/run/tls/cacert"),
            "{e}"
        );
    }
}
