//! The CSR controller: a kube-runtime `Controller` over CSRs with
//! `spec.signerName=kubeovn.io/signer`.
//!
//! Per CSR: read live state, [`validate`]; on a denial set `Denied` (or
//! `Failed`, when someone else already approved it) with the check's reason
//! and an event; on success approve, sign (built-in CA or cert-manager) and
//! write `status.certificate`. A CSR that carries a certificate, `Denied` or
//! `Failed` is final and never touched again. Someone else's approval never
//! substitutes for validation: it runs on every CSR this signer signs.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};

use kube_ovn_ipsec_api::clock::Clock;
use kube_ovn_ipsec_api::pki::{PEM_CERTIFICATE, TrustBundle, encode_pem};

use crate::certmanager::{CertManagerForwarder, Forwarded, KubeCertificateRequests};
use crate::error::{Error, Result};
use crate::live::{LiveCache, csr_view, fetch_live};
use crate::metrics::Metrics;
use crate::names;
use crate::policy::Policy;
use crate::resync::resyncing;
use crate::signer::CertificateAuthority;
use crate::validate::validate;

/// How a validated CSR gets its certificate.
pub enum SignerMode {
    /// The built-in CA (reloaded from its Secret by [`crate::run`]).
    BuiltIn(RwLock<Arc<CertificateAuthority>>),
    /// Forwarding to the dedicated cert-manager ClusterIssuer.
    CertManager(Box<CertManagerForwarder<KubeCertificateRequests>>),
}

/// Everything a reconcile needs, shared by all of them.
pub struct Shared {
    /// API client.
    pub client: Client,
    /// Validation policy.
    pub policy: Policy,
    /// Name of the kube-ovn-cni DaemonSet (in `policy.cni_namespace`).
    pub daemon_set: String,
    /// Signer.
    pub signer: SignerMode,
    /// The trust bundle (cert-manager mode checks chains against it).
    pub trust: RwLock<TrustBundle>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Clock.
    pub clock: Arc<dyn Clock>,
    /// `source.component` of the events this controller writes.
    pub component: String,
    /// Watch-fed live state; `None` reads everything directly per CSR.
    pub cache: Option<LiveCache>,
    /// Reconciles running at once (0: unbounded).
    pub concurrency: u16,
    /// How often the CSR watch starts over with a fresh LIST.
    pub resync_period: Duration,
}

impl Shared {
    fn trust(&self) -> TrustBundle {
        // A writer only ever swaps in a whole bundle, so a poisoned lock
        // still holds a complete one.
        self.trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run_controller(
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let csrs: Api<CertificateSigningRequest> = Api::all(shared.client.clone());
    let selector = format!("spec.signerName={}", names::SIGNER_NAME);
    let config = watcher::Config::default().fields(&selector);
    // Every relist hands each CSR to the reconciler again: a pending one the
    // watch never delivered is reconciled then, a final one costs a no-op.
    let (reader, writer) = reflector::store();
    let trigger = reflector(
        writer,
        resyncing(
            "certificatesigningrequests",
            move || watcher(csrs.clone(), config.clone()),
            shared.resync_period,
        ),
    )
    .applied_objects();
    let shutdown = shutdown.shared();
    let synced = reader.clone();
    let controller = Controller::for_stream(trigger, reader)
        .with_config(kube::runtime::Config::default().concurrency(shared.concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, shared)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile did not complete");
            }
        });
    // kube-runtime holds every reconcile until the CSR store has its first
    // list, and a graceful shutdown cuts the watch: stopped before that list,
    // the controller would wait for it forever. Nothing can be running yet
    // then, so it stops at once instead.
    let stop_before_sync = async move {
        shutdown.await;
        if synced.wait_until_ready().now_or_never().is_some() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = controller => {}
        () = stop_before_sync => tracing::info!("stopped before the first CSR list"),
    }
}

fn error_policy(csr: Arc<CertificateSigningRequest>, e: &Error, shared: Arc<Shared>) -> Action {
    shared.metrics.error(e);
    tracing::warn!(csr = %csr.name_any(), error = %e, "CSR reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn has_condition(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == ty && c.status == "True"))
}

/// Whether a CSR needs no more work from this signer.
pub fn is_final(csr: &CertificateSigningRequest) -> bool {
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    issued || has_condition(csr, "Denied") || has_condition(csr, "Failed")
}

/// Reconciles one CSR.
pub async fn reconcile(csr: Arc<CertificateSigningRequest>, shared: Arc<Shared>) -> Result<Action> {
    if csr.spec.signer_name != names::SIGNER_NAME || is_final(&csr) {
        return Ok(Action::await_change());
    }
    let started = tokio::time::Instant::now();
    let name = csr.name_any();
    let view = csr_view(&csr);
    let from_cache = shared
        .cache
        .as_ref()
        .and_then(|c| c.lookup(&view, &shared.policy, &shared.daemon_set))
        .map(|live| validate(&view, &live, &shared.policy));
    let result = match from_cache {
        Some(Ok(validated)) => Ok(validated),
        // No cache (or not synced yet), or the cache says no: a watch may
        // lag the API server (a new Pod not delivered yet), so a denial is
        // only ever decided on direct reads.
        _ => {
            let live =
                fetch_live(&shared.client, &view, &shared.policy, &shared.daemon_set).await?;
            validate(&view, &live, &shared.policy)
        }
    };
    let approved = has_condition(&csr, "Approved");
    let validated = match result {
        Ok(v) => v,
        Err(denial) => {
            let (reason, message) = (denial.reason(), denial.to_string());
            tracing::info!(csr = %name, reason, "denying IPsec CSR: {message}");
            if approved {
                // Approved by someone else: a CSR cannot be both Approved
                // and Denied, so the signer marks it Failed instead.
                write_condition(&shared, &csr, "Failed", reason, &message).await?;
            } else {
                write_condition(&shared, &csr, "Denied", reason, &message).await?;
            }
            shared.metrics.csr("denied", reason);
            publish(&shared, &csr, reason, &message).await;
            return Ok(Action::await_change());
        }
    };

    if !approved {
        write_condition(
            &shared,
            &csr,
            "Approved",
            "KubeOvnIpsecValidated",
            "requester, Pod binding, Node, chassis and request validated",
        )
        .await?;
    }

    // The watch may hand a pass a copy older than an earlier pass's
    // certificate patch: read the CSR itself, so a CSR is signed (or its
    // CertificateRequest created) once, not again from a stale copy.
    let csrs: Api<CertificateSigningRequest> = Api::all(shared.client.clone());
    match csrs.get_opt(&name).await? {
        Some(fresh) if fresh.metadata.uid == csr.metadata.uid && !is_final(&fresh) => {}
        _ => return Ok(Action::await_change()),
    }

    let now = shared.clock.now();
    let pem = match &shared.signer {
        SignerMode::BuiltIn(ca) => {
            let ca = ca
                .read()
                .map(|c| c.clone())
                .map_err(|_| Error::CaSecretInvalid("CA lock poisoned".into()))?;
            encode_pem(PEM_CERTIFICATE, &ca.sign(&validated, now)?)
        }
        SignerMode::CertManager(fwd) => {
            let uid = csr.metadata.uid.clone().unwrap_or_default();
            match fwd
                .forward(&name, &uid, &view.request, &validated, &shared.trust(), now)
                .await
            {
                Ok(Forwarded::Issued(pem)) => pem,
                Ok(Forwarded::Pending(why)) => {
                    tracing::debug!(csr = %name, why, "waiting for cert-manager");
                    return Ok(Action::requeue(Duration::from_secs(2)));
                }
                Err(Error::CertManagerRejected(r)) => {
                    let (reason, message) = (r.reason(), r.to_string());
                    tracing::warn!(csr = %name, reason, "cert-manager result rejected: {message}");
                    write_condition(&shared, &csr, "Failed", reason, &message).await?;
                    shared.metrics.csr("failed", reason);
                    publish(&shared, &csr, reason, &message).await;
                    return Ok(Action::await_change());
                }
                Err(e) => return Err(e),
            }
        }
    };

    let patch = serde_json::json!({
        "status": { "certificate": base64::engine::general_purpose::STANDARD.encode(pem.as_bytes()) }
    });
    csrs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    shared.metrics.csr("signed", "Signed");
    shared
        .metrics
        .signing_latency(started.elapsed().as_secs_f64());
    tracing::info!(csr = %name, node = %validated.node_name, chassis = %validated.chassis, "signed IPsec CSR");
    Ok(Action::await_change())
}

/// Adds a condition: `Approved`/`Denied` through the approval subresource,
/// `Failed` through status. The existing conditions are kept (merge patch
/// replaces lists whole).
async fn write_condition(
    shared: &Shared,
    csr: &CertificateSigningRequest,
    ty: &str,
    reason: &str,
    message: &str,
) -> Result<()> {
    let mut conditions: Vec<serde_json::Value> = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| {
            c.iter()
                .filter_map(|c| serde_json::to_value(c).ok())
                .collect()
        })
        .unwrap_or_default();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    conditions.push(serde_json::json!({
        "type": ty,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }));
    // Conditional on the object as read: a reconcile that ran on a stale
    // copy (a requeue that fired before the watch delivered this
    // controller's own last write) gets a conflict and runs again on the
    // fresh object instead of appending the condition — and counting the
    // outcome — a second time.
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": csr.metadata.resource_version },
        "status": { "conditions": conditions },
    });
    let csrs: Api<CertificateSigningRequest> = Api::all(shared.client.clone());
    let name = csr.name_any();
    if ty == "Failed" {
        csrs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    } else {
        csrs.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// Publishes a Warning event on the CSR. Best effort: an event that cannot
/// be written must not change the outcome.
async fn publish(shared: &Shared, csr: &CertificateSigningRequest, reason: &str, message: &str) {
    let name = csr.name_any();
    let on = crate::events::Involved {
        api_version: "certificates.k8s.io/v1",
        kind: "CertificateSigningRequest",
        name: &name,
        namespace: None,
        uid: csr.metadata.uid.as_deref(),
    };
    crate::events::warning(&shared.client, &shared.component, on, reason, message).await;
}
