//! The identity actor: owns the key directory and the node's IPsec identity
//! (SPEC §2).
//!
//! Cold start: generate a key, build the CSR, persist key and binding
//! (fsync'd, 0600) *before* creating the CSR, create it, wait until it is
//! issued or denied, verify the certificate (pending key, subject/SAN, chain
//! to the trust bundle, sane lifetime), store it and ask the OVSDB writer to
//! activate the generation. Only the writer's confirmed `Activated` promotes
//! the generation to active in the key directory. A restart resumes the
//! pending CSR with the same key. Renewal repeats the flow for the next
//! generation while the current one stays active; failures retry with
//! backoff and never touch the active identity. A trust bundle under which
//! the leaf no longer verifies triggers renewal at once; one under which it
//! still verifies is activated as a trust-only generation (same key and
//! certificate, new `ca.pem`).
//!
//! Nothing here logs or publishes key material or PEM: logs carry
//! generations, CSR names, digests and error labels.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::csr::csr_name;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::names::{defaults, k8s};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::status::Reason;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::backoff::{Backoff, BackoffPolicy};
use crate::bus::{
    ActivationEvent, ActivationRequest, ActiveIdentity, Bus, IdentityEvent, RenewalEvent,
};
use crate::clock::WallClock;
use crate::error::{Error, Result};
use crate::keydir::{
    ActiveRecord, KeyDir, KeyDirState, PendingRecord, PendingStage, RetiredRecord, files,
};
use crate::metrics::Metrics;
use crate::pki::{KeyType, PrivateKey, verify_issued};
use crate::ports::{CsrApi, CsrOutcome, CsrRef, CsrSubmission, OvsdbIdentity};
use crate::status::{IdentityCondition, StatusBoard, timestamp};

/// Who this node is and how it asks for an identity.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// The Node's name (annotation `kube-ovn.io/ipsec-node`).
    pub node_name: String,
    /// The Node's UID.
    pub node_uid: Uid,
    /// This Pod's UID (part of the CSR name).
    pub pod_uid: Uid,
    /// The chassis (OVS `system-id`).
    pub chassis: Chassis,
    /// The key directory (`OVN_IPSEC_KEY_DIR`).
    pub key_dir: PathBuf,
    /// Key type (RSA-2048 by default).
    pub key_type: KeyType,
    /// `expirationSeconds` of the CSR.
    pub expiration_seconds: u32,
    /// How long one wait for the CSR may take before `CsrTimeout`.
    pub request_timeout: Duration,
    /// Retry schedule for failed attempts.
    pub retry: BackoffPolicy,
    /// How long a retired generation is kept before collection.
    pub gc_grace: Duration,
}

impl IdentityConfig {
    /// Defaults for everything but the node's names and the key directory.
    pub fn new(
        node_name: String,
        node_uid: Uid,
        pod_uid: Uid,
        chassis: Chassis,
        key_dir: PathBuf,
    ) -> Self {
        IdentityConfig {
            node_name,
            node_uid,
            pod_uid,
            chassis,
            key_dir,
            key_type: KeyType::Rsa2048,
            expiration_seconds: defaults::CERTIFICATE_LIFETIME_SECS,
            request_timeout: Duration::from_secs(300),
            retry: BackoffPolicy::default(),
            gc_grace: Duration::from_secs(3600),
        }
    }
}

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct IdentityArgs {
    /// Configuration.
    pub config: IdentityConfig,
    /// The Kubernetes CSR API.
    pub csr_api: Arc<dyn CsrApi>,
    /// OVSDB, read only here: garbage collection never removes a generation
    /// OVSDB still points at.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Wall clock for certificate validity.
    pub clock: Arc<dyn WallClock>,
    /// Status.
    pub board: StatusBoard,
    /// Metrics.
    pub metrics: Arc<dyn Metrics>,
    /// Event ports.
    pub bus: Bus,
    /// The `ca.crt` of ConfigMap `ovn-ipsec-trust` (PEM) as the runtime's
    /// watcher last saw it. A watch rather than messages alone, so every
    /// incarnation of this actor starts from the current bundle.
    pub trust: tokio::sync::watch::Receiver<Option<Vec<u8>>>,
}

/// What the identity actor is doing, for tests and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySnapshot {
    /// Whether the key directory is open and locked.
    pub key_dir_open: bool,
    /// The active generation, and whether OVSDB confirmed it.
    pub active: Option<(u64, bool)>,
    /// The pending generation and its CSR name.
    pub pending: Option<(u64, String)>,
    /// Key digest of the pending key.
    pub pending_key_digest: Option<String>,
    /// The trust bundle held.
    pub trust_digest: Option<Sha256Digest>,
}

/// Messages of the identity actor.
#[derive(Debug)]
pub enum IdentityMsg {
    /// A trust bundle (`ca.crt` PEM); sent by the forwarder of
    /// [`IdentityArgs::trust`] on every change, or directly.
    TrustBundle(Vec<u8>),
    /// From the renewal timer.
    Renewal(RenewalEvent),
    /// From the OVSDB writer.
    Activation(ActivationEvent),
    /// Internal: the CSR object exists.
    Submitted {
        /// The pending generation it belongs to.
        generation: u64,
        /// The object.
        csr: CsrRef,
    },
    /// Internal: the CSR wait ended.
    Settled {
        /// The pending generation it belongs to.
        generation: u64,
        /// The outcome.
        outcome: Result<CsrOutcome>,
    },
    /// Internal: a backoff delay elapsed.
    Retry {
        /// Only the latest scheduled retry counts.
        token: u64,
    },
    /// Internal: collect retired generations.
    CollectGarbage,
    /// Diagnostics.
    Snapshot(RpcReplyPort<IdentitySnapshot>),
}

struct Active {
    generation: u64,
    certificate: Certificate,
    confirmed: bool,
}

struct Pending {
    generation: u64,
    key: PrivateKey,
    request_pem: String,
    csr_name: String,
    /// Set once verified and stored.
    certificate: Option<Certificate>,
}

/// The identity actor's state.
pub struct IdentityState {
    args: IdentityArgs,
    keydir: Option<KeyDir>,
    kd: KeyDirState,
    trust: Option<TrustBundle>,
    active: Option<Active>,
    pending: Option<Pending>,
    /// A new identity is wanted (none yet, renewal due, untrusted, expired).
    wanted: bool,
    /// A CSR submit/wait task is running for this generation.
    in_flight: Option<u64>,
    backoff: Backoff,
    retry_token: u64,
    task: Option<tokio::task::JoinHandle<()>>,
    trust_forwarder: Option<tokio::task::JoinHandle<()>>,
}

/// The identity actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityActor;

fn now_unix(s: &IdentityState) -> i64 {
    timestamp(s.args.clock.now()).unix()
}

/// Controller-supplied text (denial reasons) reaches logs only short and
/// without anything that looks like PEM.
fn sanitize(text: &str) -> String {
    if text.contains("-----") {
        return "<redacted>".into();
    }
    text.chars().take(200).collect()
}

impl IdentityState {
    fn schedule_retry(&mut self, myself: &ActorRef<IdentityMsg>) -> Duration {
        let delay = self.backoff.next_delay();
        self.retry_token += 1;
        let token = self.retry_token;
        myself.send_after(delay, move || IdentityMsg::Retry { token });
        delay
    }

    fn keydir(&self) -> Result<&KeyDir> {
        self.keydir.as_ref().ok_or_else(|| Error::KeyDirLocked {
            path: self.args.config.key_dir.clone(),
        })
    }

    fn save(&self) -> Result<()> {
        self.keydir()?.save(&self.kd)
    }

    fn condition(&self, reason: Option<Reason>) {
        if self.active.as_ref().is_some_and(|a| a.confirmed) {
            self.args.board.set_warning(reason);
        } else {
            self.args
                .board
                .set_identity_condition(IdentityCondition::Working(reason));
        }
    }

    /// Opens the key directory and loads what it holds.
    fn open(&mut self) -> Result<()> {
        let kd = KeyDir::open(&self.args.config.key_dir)?;
        let now = now_unix(self);
        let (state, moved) = kd.load(now)?;
        if let Some(m) = moved {
            tracing::warn!(
                moved_to = %m.moved_to.display(),
                reason = %m.reason,
                "key directory state unusable; moved aside, requesting a fresh identity"
            );
            self.args.bus.identity.send(IdentityEvent::StateMovedAside {
                moved_to: m.moved_to,
                reason: m.reason,
            });
        }
        self.keydir = Some(kd);
        self.kd = state;
        self.load_active();
        self.load_pending();
        self.save()?;
        self.args
            .board
            .set_identity_condition(IdentityCondition::Working(None));
        Ok(())
    }

    fn load_active(&mut self) {
        let Some(rec) = self.kd.active.clone() else {
            self.wanted = true;
            return;
        };
        let loaded = (|| -> Result<(Certificate, Option<TrustBundle>)> {
            let kd = self.keydir()?;
            let cert = Certificate::from_pem(&kd.read_file(rec.generation, files::CERTIFICATE)?)
                .map_err(|e| Error::GenerationInconsistent {
                    generation: rec.generation,
                    reason: e.to_string(),
                })?;
            if cert.digest().to_hex() != rec.certificate_digest {
                return Err(Error::GenerationInconsistent {
                    generation: rec.generation,
                    reason: "certificate digest differs from the state".into(),
                });
            }
            kd.read_file(rec.generation, files::PRIVATE_KEY)?;
            let trust = kd
                .read_file(rec.generation, files::CA)
                .ok()
                .and_then(|pem| TrustBundle::from_pem(&pem).ok());
            Ok((cert, trust))
        })();
        match loaded {
            Ok((certificate, trust)) => {
                if self.trust.is_none() {
                    // Until the ConfigMap arrives, trust what this identity
                    // was activated with.
                    self.trust = trust;
                }
                let now = timestamp(self.args.clock.now());
                if now >= certificate.not_after() {
                    self.wanted = true;
                }
                self.active = Some(Active {
                    generation: rec.generation,
                    certificate,
                    confirmed: false,
                });
            }
            Err(e) => {
                tracing::warn!(generation = rec.generation, error = %e, "active generation unusable; requesting a new identity");
                let now = now_unix(self);
                self.kd.retired.push(RetiredRecord {
                    generation: rec.generation,
                    retired_at: now,
                });
                self.kd.active = None;
                self.wanted = true;
            }
        }
    }

    fn load_pending(&mut self) {
        let Some(rec) = self.kd.pending.clone() else {
            return;
        };
        let loaded = (|| -> Result<Pending> {
            let kd = self.keydir()?;
            let key = PrivateKey::from_pem(&kd.read_file(rec.generation, files::PRIVATE_KEY)?)?;
            if key.digest_hex() != rec.key_digest {
                return Err(Error::GenerationInconsistent {
                    generation: rec.generation,
                    reason: "pending key digest differs from the binding".into(),
                });
            }
            // A trust-only generation has no request of its own.
            let request = if rec.trust_refresh {
                Vec::new()
            } else {
                kd.read_file(rec.generation, files::REQUEST)?
            };
            let request_pem =
                String::from_utf8(request).map_err(|_| Error::GenerationInconsistent {
                    generation: rec.generation,
                    reason: "request is not PEM".into(),
                })?;
            let certificate = if rec.stage == PendingStage::Issued {
                Some(
                    Certificate::from_pem(&kd.read_file(rec.generation, files::CERTIFICATE)?)
                        .map_err(|e| Error::GenerationInconsistent {
                            generation: rec.generation,
                            reason: e.to_string(),
                        })?,
                )
            } else {
                None
            };
            Ok(Pending {
                generation: rec.generation,
                key,
                request_pem,
                csr_name: rec.csr_name.clone(),
                certificate,
            })
        })();
        match loaded {
            Ok(p) => {
                tracing::info!(generation = p.generation, csr = %p.csr_name, "resuming pending identity request");
                self.pending = Some(p);
            }
            Err(e) => {
                tracing::warn!(generation = rec.generation, error = %e, "pending request unusable; starting over");
                self.abandon_pending_record(rec.generation);
            }
        }
    }

    fn abandon_pending_record(&mut self, generation: u64) {
        let now = now_unix(self);
        self.kd.pending = None;
        self.kd.retired.push(RetiredRecord {
            generation,
            retired_at: now,
        });
        self.pending = None;
        self.in_flight = None;
        self.wanted = true;
    }

    /// Creates a new generation: key, CSR, binding persisted before
    /// submission.
    fn start_request(&mut self) -> Result<()> {
        let trust = self.trust.as_ref().ok_or(Error::TrustBundleMissing)?;
        let trust_digest = trust.digest();
        let cfg = &self.args.config;
        let generation = self.kd.last_generation + 1;
        let key = PrivateKey::generate(cfg.key_type)?;
        let request_pem = key.csr_pem(&cfg.chassis)?;
        let name = csr_name(
            &cfg.node_uid,
            &cfg.pod_uid,
            cfg.expiration_seconds,
            &trust_digest,
            request_pem.as_bytes(),
        );
        let kd = self.keydir()?;
        kd.create_generation(generation)?;
        kd.write_file(
            generation,
            files::PRIVATE_KEY,
            key.to_pem().as_bytes(),
            true,
        )?;
        kd.write_file(generation, files::REQUEST, request_pem.as_bytes(), false)?;
        self.kd.last_generation = generation;
        self.kd.pending = Some(PendingRecord {
            generation,
            key_digest: key.digest_hex(),
            csr_name: name.clone(),
            csr_uid: None,
            trust_digest: trust_digest.to_hex(),
            stage: PendingStage::Prepared,
            trust_refresh: false,
        });
        // The binding is on disk (fsync'd) before the CSR exists.
        self.save()?;
        tracing::info!(generation, csr = %name, key_digest = %key.digest_hex(), "identity request prepared");
        self.pending = Some(Pending {
            generation,
            key,
            request_pem,
            csr_name: name,
            certificate: None,
        });
        self.wanted = false;
        Ok(())
    }

    /// A generation with the active key and certificate and the new trust.
    fn start_trust_refresh(&mut self) -> Result<()> {
        let (Some(active), Some(trust)) = (&self.active, &self.trust) else {
            return Ok(());
        };
        let kd = self.keydir()?;
        let from = active.generation;
        let generation = self.kd.last_generation + 1;
        let key_pem = kd.read_file(from, files::PRIVATE_KEY)?;
        let key = PrivateKey::from_pem(&key_pem)?;
        kd.create_generation(generation)?;
        kd.write_file(generation, files::PRIVATE_KEY, &key_pem, true)?;
        kd.write_file(
            generation,
            files::CERTIFICATE,
            active.certificate.to_pem().as_bytes(),
            false,
        )?;
        kd.write_file(generation, files::CA, trust.to_pem().as_bytes(), false)?;
        let certificate = active.certificate.clone();
        self.kd.last_generation = generation;
        self.kd.pending = Some(PendingRecord {
            generation,
            key_digest: key.digest_hex(),
            csr_name: String::new(),
            csr_uid: None,
            trust_digest: trust.digest().to_hex(),
            stage: PendingStage::Issued,
            trust_refresh: true,
        });
        self.save()?;
        tracing::info!(
            generation,
            from,
            "trust bundle changed; activating a trust-only generation"
        );
        self.pending = Some(Pending {
            generation,
            key,
            request_pem: String::new(),
            csr_name: String::new(),
            certificate: Some(certificate),
        });
        Ok(())
    }

    fn submission(&self, p: &Pending) -> CsrSubmission {
        let cfg = &self.args.config;
        let annotations = BTreeMap::from([
            (k8s::ANNOTATION_NODE.to_owned(), cfg.node_name.clone()),
            (
                k8s::ANNOTATION_NODE_UID.to_owned(),
                cfg.node_uid.to_string(),
            ),
            (k8s::ANNOTATION_CHASSIS.to_owned(), cfg.chassis.to_string()),
            (
                k8s::ANNOTATION_GENERATION.to_owned(),
                p.generation.to_string(),
            ),
        ]);
        CsrSubmission {
            name: p.csr_name.clone(),
            annotations,
            request_pem: p.request_pem.clone().into_bytes(),
            signer_name: k8s::SIGNER_NAME.to_owned(),
            usages: k8s::CSR_USAGES.iter().map(|s| (*s).to_owned()).collect(),
            expiration_seconds: cfg.expiration_seconds,
        }
    }

    fn spawn_csr_task(&mut self, myself: &ActorRef<IdentityMsg>) {
        let Some(p) = &self.pending else { return };
        if self.in_flight == Some(p.generation) {
            return;
        }
        let generation = p.generation;
        let submission = self.submission(p);
        let api = self.args.csr_api.clone();
        let timeout = self.args.config.request_timeout;
        let me = myself.clone();
        self.in_flight = Some(generation);
        self.condition(Some(Reason::CsrPending));
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.task = Some(tokio::spawn(async move {
            let csr = match api.submit(&submission).await {
                Ok(csr) => csr,
                Err(e) => {
                    let _ = me.send_message(IdentityMsg::Settled {
                        generation,
                        outcome: Err(e),
                    });
                    return;
                }
            };
            let name = csr.name.clone();
            let _ = me.send_message(IdentityMsg::Submitted { generation, csr });
            let outcome = api.wait(&name, timeout).await;
            let _ = me.send_message(IdentityMsg::Settled {
                generation,
                outcome,
            });
        }));
    }

    fn publish_ready(&self, generation: u64) {
        if let Some(kd) = &self.keydir {
            self.args
                .bus
                .identity
                .send(IdentityEvent::Ready(ActivationRequest {
                    generation,
                    paths: kd.identity_paths(generation),
                }));
        }
    }

    /// Decides the next step from the state. Idempotent.
    fn drive(&mut self, myself: &ActorRef<IdentityMsg>) {
        if self.keydir.is_none() {
            return;
        }
        if let Some(p) = &self.pending {
            if p.certificate.is_some() {
                let g = p.generation;
                self.publish_ready(g);
                // Watchdog: republish until the writer confirms.
                self.schedule_retry(myself);
            } else if self.in_flight.is_none() {
                self.spawn_csr_task(myself);
            }
            return;
        }
        if let Some(a) = &self.active
            && !a.confirmed
        {
            let g = a.generation;
            self.publish_ready(g);
            self.schedule_retry(myself);
        }
        if self.wanted {
            match self.start_request() {
                Ok(()) => self.spawn_csr_task(myself),
                Err(Error::TrustBundleMissing) => {
                    // The ConfigMap watcher will send it; nothing to retry.
                    self.condition(Some(Reason::TrustBundleMissing));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "identity request could not be prepared");
                    self.args.metrics.renewal(e.metric_label());
                    self.condition(Some(e.status_reason()));
                    self.schedule_retry(myself);
                }
            }
        }
    }

    fn on_settled(
        &mut self,
        myself: &ActorRef<IdentityMsg>,
        generation: u64,
        outcome: Result<CsrOutcome>,
    ) {
        if self.pending.as_ref().map(|p| p.generation) != Some(generation) {
            return;
        }
        self.in_flight = None;
        let name = self
            .pending
            .as_ref()
            .map(|p| p.csr_name.clone())
            .unwrap_or_default();
        match outcome {
            Ok(CsrOutcome::Issued { .. }) if self.trust.is_none() => {
                // Cannot verify yet; the CSR stays issued, ask again later.
                self.fail_attempt(myself, generation, &Error::TrustBundleMissing, false);
            }
            Ok(CsrOutcome::Issued { certificate_pem }) => {
                if let Err(e) = self.accept_issued(&certificate_pem) {
                    // A rejected certificate discards the key (new attempt);
                    // failing to store a good one keeps it (same CSR again).
                    let rejected = matches!(e, Error::CertificateRejected(_));
                    tracing::warn!(generation, csr = %name, error = %e, rejected, "issued certificate not accepted");
                    self.fail_attempt(myself, generation, &e, rejected);
                    return;
                }
                tracing::info!(generation, csr = %name, "certificate issued and verified");
                self.backoff.reset();
                self.drive(myself);
            }
            Ok(CsrOutcome::Denied { reason, message }) => {
                let e = Error::CsrDenied {
                    name: name.clone(),
                    reason: sanitize(&reason),
                };
                tracing::warn!(generation, csr = %name, reason = %sanitize(&reason), message = %sanitize(&message), "CSR denied");
                self.fail_attempt(myself, generation, &e, true);
            }
            Ok(CsrOutcome::Failed { reason, message }) => {
                let e = Error::CsrFailed {
                    name: name.clone(),
                    reason: sanitize(&reason),
                };
                tracing::warn!(generation, csr = %name, reason = %sanitize(&reason), message = %sanitize(&message), "CSR failed");
                self.fail_attempt(myself, generation, &e, true);
            }
            Ok(CsrOutcome::Pending) => {
                let e = Error::CsrTimeout { name };
                tracing::warn!(generation, error = %e, "CSR not issued yet; will keep waiting");
                self.fail_attempt(myself, generation, &e, false);
            }
            Ok(CsrOutcome::NotFound) => {
                let e = Error::CsrApi(format!("CSR {name} disappeared; resubmitting"));
                tracing::warn!(generation, error = %e, "CSR gone");
                self.fail_attempt(myself, generation, &e, false);
            }
            Err(e) => {
                tracing::warn!(generation, error = %e, "CSR API failed");
                self.fail_attempt(myself, generation, &e, false);
            }
        }
    }

    /// Records a failed attempt; `abandon` discards the pending key (the
    /// next attempt is a new generation), otherwise the same CSR is resumed.
    fn fail_attempt(
        &mut self,
        myself: &ActorRef<IdentityMsg>,
        generation: u64,
        e: &Error,
        abandon: bool,
    ) {
        self.args.metrics.renewal(e.metric_label());
        self.condition(Some(e.status_reason()));
        if abandon {
            self.abandon_pending_record(generation);
            if let Err(e) = self.save() {
                tracing::warn!(error = %e, "saving key directory state failed");
            }
        }
        let delay = self.schedule_retry(myself);
        tracing::info!(
            generation,
            retry_in_secs = delay.as_secs_f64(),
            "identity attempt will be retried"
        );
    }

    fn accept_issued(&mut self, pem: &[u8]) -> Result<()> {
        let trust = self.trust.clone().ok_or(Error::TrustBundleMissing)?;
        let now = timestamp(self.args.clock.now());
        let cfg = &self.args.config;
        let p = self
            .pending
            .as_ref()
            .ok_or(Error::CertificateRejected("no pending request".into()))?;
        let cert = verify_issued(
            pem,
            &p.key,
            &cfg.chassis,
            &trust,
            now,
            cfg.expiration_seconds,
        )?;
        let generation = p.generation;
        let kd = self.keydir()?;
        kd.write_file(
            generation,
            files::CERTIFICATE,
            cert.to_pem().as_bytes(),
            false,
        )?;
        kd.write_file(generation, files::CA, trust.to_pem().as_bytes(), false)?;
        if let Some(rec) = &mut self.kd.pending {
            rec.stage = PendingStage::Issued;
        }
        self.save()?;
        if let Some(p) = &mut self.pending {
            p.certificate = Some(cert);
        }
        Ok(())
    }

    fn on_activated(&mut self, myself: &ActorRef<IdentityMsg>, generation: u64) {
        let now = now_unix(self);
        let promoted = match &self.pending {
            Some(p) if p.generation == generation => p.certificate.clone(),
            _ => None,
        };
        if let Some(certificate) = promoted {
            let old = self.kd.active.take();
            self.kd.active = Some(ActiveRecord {
                generation,
                certificate_digest: certificate.digest().to_hex(),
            });
            self.kd.pending = None;
            if let Some(old) = old {
                self.kd.retired.push(RetiredRecord {
                    generation: old.generation,
                    retired_at: now,
                });
            }
            if let Err(e) = self.save() {
                // OVSDB is on N; the state file still says pending N (Issued).
                // A restart re-requests activation of N, which the writer
                // confirms without a transaction: nothing is lost.
                tracing::warn!(generation, error = %e, "recording activation failed");
            }
            self.pending = None;
            self.active = Some(Active {
                generation,
                certificate,
                confirmed: true,
            });
            self.wanted = false;
            self.args.metrics.renewal("success");
            tracing::info!(generation, "identity generation active");
        } else if let Some(a) = &mut self.active {
            if a.generation != generation {
                return;
            }
            a.confirmed = true;
        } else {
            return;
        }
        self.backoff.reset();
        self.retry_token += 1; // cancels the activation watchdog
        self.publish_active();
        let grace = self.args.config.gc_grace;
        myself.send_after(grace + Duration::from_secs(1), || {
            IdentityMsg::CollectGarbage
        });
        // Renewal may have been wanted while this generation was in flight
        // (an expired or untrusted identity).
        self.check_trust_and_expiry();
        if let Err(e) = self.maybe_trust_refresh() {
            tracing::warn!(error = %e, "trust-only generation could not be prepared");
            self.schedule_retry(myself);
            return;
        }
        self.drive(myself);
    }

    fn publish_active(&self) {
        let Some(a) = &self.active else { return };
        if !a.confirmed {
            return;
        }
        let c = &a.certificate;
        self.args
            .board
            .set_active(a.generation, c.digest(), c.not_after());
        self.args.board.set_warning(None);
        self.args
            .bus
            .identity
            .send(IdentityEvent::Active(ActiveIdentity {
                generation: a.generation,
                certificate: c.clone(),
            }));
    }

    /// Marks a renewal wanted when the active leaf is expired or does not
    /// verify against the current trust.
    fn check_trust_and_expiry(&mut self) {
        let Some(a) = &self.active else {
            self.wanted = true;
            return;
        };
        let now = timestamp(self.args.clock.now());
        if now >= a.certificate.not_after() {
            self.wanted = true;
            return;
        }
        if let Some(t) = &self.trust
            && t.verify_leaf(&a.certificate, now).is_err()
        {
            tracing::warn!(
                generation = a.generation,
                "active identity does not verify against the trust bundle; renewing now"
            );
            self.wanted = true;
            self.condition(Some(Reason::IdentityUntrusted));
        }
    }

    fn on_trust(&mut self, myself: &ActorRef<IdentityMsg>, pem: &[u8]) {
        let bundle = match TrustBundle::from_pem(pem) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "trust bundle rejected; keeping the previous one");
                self.condition(Some(Reason::TrustBundleInvalid));
                return;
            }
        };
        let digest = bundle.digest();
        let same = self.trust.as_ref().is_some_and(|t| t.digest() == digest);
        self.args.board.set_trust(digest);
        if same {
            // A repeated bundle clears an earlier "invalid" warning.
            if self.args.board.snapshot().reason == Some(Reason::TrustBundleInvalid) {
                self.condition(None);
            }
            self.drive(myself);
            return;
        }
        tracing::info!(trust_digest = %digest, "trust bundle updated");
        self.trust = Some(bundle);
        self.condition(None);
        self.check_trust_and_expiry();
        if let Err(e) = self.maybe_trust_refresh() {
            tracing::warn!(error = %e, "trust-only generation could not be prepared");
            self.schedule_retry(myself);
            return;
        }
        self.drive(myself);
    }

    /// When the confirmed active generation's `ca.pem` is not the trust held
    /// now (and the leaf still verifies — otherwise a renewal is wanted),
    /// prepares a trust-only generation so the new bundle reaches OVSDB.
    fn maybe_trust_refresh(&mut self) -> Result<()> {
        if self.wanted || self.pending.is_some() {
            return Ok(());
        }
        let (Some(a), Some(trust)) = (&self.active, &self.trust) else {
            return Ok(());
        };
        let digest = trust.digest();
        let differs = a.confirmed
            && self
                .keydir
                .as_ref()
                .and_then(|kd| kd.read_file(a.generation, files::CA).ok())
                .and_then(|pem| TrustBundle::from_pem(&pem).ok())
                .is_none_or(|t| t.digest() != digest);
        if differs {
            self.start_trust_refresh()?;
        }
        Ok(())
    }

    fn collect_garbage_blocking(&mut self, referenced: &[PathBuf]) {
        let now = now_unix(self);
        let grace = i64::try_from(self.args.config.gc_grace.as_secs()).unwrap_or(i64::MAX);
        let Some(kd) = &self.keydir else { return };
        match kd.collect_garbage(&mut self.kd, now, grace, referenced) {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(?removed, "retired generations collected");
                if let Err(e) = self.save() {
                    tracing::warn!(error = %e, "saving key directory state failed");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
        }
    }
}

impl Actor for IdentityActor {
    type Msg = IdentityMsg;
    type State = IdentityState;
    type Arguments = IdentityArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<IdentityMsg>,
        args: IdentityArgs,
    ) -> Result<IdentityState, ActorProcessingErr> {
        args.board
            .set_node(args.config.node_uid.clone(), args.config.chassis.clone());
        args.bus
            .activation
            .subscribe(myself.clone(), |e| Some(IdentityMsg::Activation(e)));
        args.bus
            .renewal
            .subscribe(myself.clone(), |e| Some(IdentityMsg::Renewal(e)));
        let backoff = args.config.retry.start();
        Ok(IdentityState {
            args,
            keydir: None,
            kd: KeyDirState::default(),
            trust: None,
            active: None,
            pending: None,
            wanted: false,
            in_flight: None,
            backoff,
            retry_token: 0,
            task: None,
            trust_forwarder: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<IdentityMsg>,
        state: &mut IdentityState,
    ) -> Result<(), ActorProcessingErr> {
        open_or_block(&myself, state);
        let mut rx = state.args.trust.clone();
        let current = rx.borrow_and_update().clone();
        if let Some(pem) = current {
            state.on_trust(&myself, &pem);
        }
        let me = myself.clone();
        state.trust_forwarder = Some(tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let pem = rx.borrow_and_update().clone();
                if let Some(pem) = pem
                    && me.send_message(IdentityMsg::TrustBundle(pem)).is_err()
                {
                    return;
                }
            }
        }));
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<IdentityMsg>,
        state: &mut IdentityState,
    ) -> Result<(), ActorProcessingErr> {
        for t in [state.task.take(), state.trust_forwarder.take()]
            .into_iter()
            .flatten()
        {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<IdentityMsg>,
        msg: IdentityMsg,
        state: &mut IdentityState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            IdentityMsg::TrustBundle(pem) => state.on_trust(&myself, &pem),
            IdentityMsg::Renewal(RenewalEvent::Due { generation }) => {
                if state
                    .active
                    .as_ref()
                    .is_some_and(|a| a.generation == generation)
                    && state.pending.is_none()
                {
                    tracing::info!(generation, "renewal due");
                    state.wanted = true;
                    state.drive(&myself);
                }
            }
            IdentityMsg::Renewal(RenewalEvent::TimerStarted) => state.publish_active(),
            IdentityMsg::Activation(ActivationEvent::Activated { generation }) => {
                state.on_activated(&myself, generation)
            }
            IdentityMsg::Activation(ActivationEvent::Failed { generation, reason }) => {
                tracing::warn!(generation, reason, "activation failed; will retry");
                state.args.metrics.renewal("activation_failed");
                state.condition(Some(Reason::ActivationFailed));
            }
            IdentityMsg::Submitted { generation, csr } => {
                if let Some(rec) = state
                    .kd
                    .pending
                    .as_mut()
                    .filter(|r| r.generation == generation)
                {
                    if rec.csr_uid.as_deref() != Some(csr.uid.as_str()) {
                        rec.csr_uid = Some(csr.uid.clone());
                        rec.stage = PendingStage::Submitted;
                        if let Err(e) = state.save() {
                            tracing::warn!(error = %e, "saving CSR binding failed");
                        }
                    }
                    tracing::info!(generation, csr = %csr.name, uid = %csr.uid, "CSR submitted");
                }
            }
            IdentityMsg::Settled {
                generation,
                outcome,
            } => state.on_settled(&myself, generation, outcome),
            IdentityMsg::Retry { token } => {
                if token == state.retry_token {
                    if state.keydir.is_none() {
                        open_or_block(&myself, state);
                    } else {
                        state.check_trust_and_expiry_if_idle();
                        state.drive(&myself);
                    }
                }
            }
            IdentityMsg::CollectGarbage => {
                // Never delete what OVSDB may reference: no read, no GC.
                match state.args.ovsdb.read().await {
                    Ok(keys) => state.collect_garbage_blocking(&keys.paths()),
                    Err(e) => {
                        tracing::warn!(error = %e, "OVSDB unreadable; garbage collection skipped")
                    }
                }
            }
            IdentityMsg::Snapshot(reply) => {
                let _ = reply.send(IdentitySnapshot {
                    key_dir_open: state.keydir.is_some(),
                    active: state.active.as_ref().map(|a| (a.generation, a.confirmed)),
                    pending: state
                        .pending
                        .as_ref()
                        .map(|p| (p.generation, p.csr_name.clone())),
                    pending_key_digest: state.pending.as_ref().map(|p| p.key.digest_hex()),
                    trust_digest: state.trust.as_ref().map(TrustBundle::digest),
                });
            }
        }
        Ok(())
    }
}

impl IdentityState {
    fn check_trust_and_expiry_if_idle(&mut self) {
        if self.pending.is_none()
            && !self.wanted
            && self.active.as_ref().is_some_and(|a| a.confirmed)
        {
            self.check_trust_and_expiry();
        }
    }
}

/// Opens the key directory; a read-only or locked one blocks the agent with
/// the reason in status and is retried with backoff (no crash loop).
fn open_or_block(myself: &ActorRef<IdentityMsg>, state: &mut IdentityState) {
    match state.open() {
        Ok(()) => {
            state.backoff.reset();
            // Orphans adopted at load are collected after the grace period.
            let grace = state.args.config.gc_grace;
            myself.send_after(grace + Duration::from_secs(1), || {
                IdentityMsg::CollectGarbage
            });
            if state.active.is_some() || state.pending.is_some() {
                tracing::info!(
                    active = ?state.active.as_ref().map(|a| a.generation),
                    pending = ?state.pending.as_ref().map(|p| p.generation),
                    "key directory loaded"
                );
            }
            state.drive(myself);
        }
        Err(e) => {
            state.keydir = None;
            let reason = e.status_reason();
            tracing::error!(
                path = %state.args.config.key_dir.display(),
                error = %e,
                "key directory unusable; set OVN_IPSEC_KEY_DIR to a writable directory (e.g. /var/lib/ovs_ipsec_keys on read-only /etc hosts)"
            );
            state
                .args
                .board
                .set_identity_condition(IdentityCondition::Blocked(reason));
            state.schedule_retry(myself);
        }
    }
}

/// Asks the identity actor for its snapshot (1 s timeout).
pub async fn snapshot(identity: &ActorRef<IdentityMsg>) -> Result<IdentitySnapshot> {
    ractor::call_t!(identity, IdentityMsg::Snapshot, 1_000)
        .map_err(|e| Error::Messaging(e.to_string()))
}

#[cfg(test)]
mod tests;
