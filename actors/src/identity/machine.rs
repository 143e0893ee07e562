//! The identity as a pure state machine.
//!
//! [`Machine::step`] takes one [`Input`] (a message, or the result of a job
//! it asked for) and the current time, updates the [`Phase`] of the next
//! generation and returns the [`Effect`]s to run, in order. It does no I/O:
//! key-directory work and key generation are [`Job`]s whose results come
//! back as inputs. The actor shell runs the effects of one step in order
//! and feeds each job's result back before the next message, so a phase
//! that waits for a job sees no other message in between.
//!
//! The active generation lives beside the phase ([`Machine::active`]): a
//! renewal works on the next generation while the current one stays
//! active, and no failure of the next one touches it.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::status::Reason;
use kube_ovn_ipsec_api::time::Timestamp;

use super::generation::{Active, Pending};
use super::mint::{self, MintPlan, Minted, RefreshPlan, StorePlan};
use super::recovery::{self, Recovered};
use super::{IdentityConfig, TrustSource};
use crate::bus::ActiveIdentity;
use crate::error::{Error, Result};
use crate::keydir::{
    ActiveRecord, CsrBinding, KeyDirState, MovedAside, PendingStage, RetiredRecord,
};
use crate::pki::verify_issued;
use crate::ports::{CsrOutcome, CsrRef, CsrSubmission};
use crate::status::{IdentityCondition, timestamp};
use kube_ovn_ipsec_api::backoff::Backoff;

/// Where the next generation stands.
#[derive(Debug)]
pub(crate) enum Phase {
    /// The key directory is not open: not tried yet, or unusable (the
    /// reason is in status and a retry is scheduled). `wanted`: a new
    /// identity was asked for meanwhile.
    Closed {
        /// A new identity is wanted once open.
        wanted: bool,
    },
    /// Opening, locking and reading the key directory (job).
    Opening {
        /// Carried over from [`Phase::Closed`].
        wanted: bool,
    },
    /// Writing the recovered state back (job); `pending` is resumed after.
    Recovering {
        /// A new identity is wanted.
        wanted: bool,
        /// The pending generation to resume, with its certificate if stored.
        pending: Option<(Pending, Option<Certificate>)>,
    },
    /// Nothing to request: the active generation is current.
    Idle,
    /// A new generation is wanted (none yet, renewal due, expired,
    /// untrusted, an attempt abandoned) and not started: no trust bundle
    /// yet, or a retry is scheduled.
    Wanted,
    /// Generating a key and CSR, persisting them with the binding (job).
    Minting,
    /// Making a trust-only generation (job).
    RefreshingTrust {
        /// The active generation it copies.
        from: u64,
        /// The active leaf it reuses.
        certificate: Certificate,
    },
    /// The pending CSR is being created and waited on (a task).
    Requesting(Pending),
    /// The pending CSR has no wait running: resumed at start, or a retry is
    /// scheduled. The same key and CSR are used again.
    Waiting(Pending),
    /// Storing a verified certificate (job).
    Storing {
        /// The pending generation.
        pending: Pending,
        /// The verified leaf.
        certificate: Certificate,
        /// The trust it was verified against.
        ca_digest: Sha256Digest,
    },
    /// Stored; published as ready (again on every retry) until the OVSDB
    /// writer confirms it.
    AwaitingActivation {
        /// The pending generation.
        pending: Pending,
        /// Its verified leaf.
        certificate: Certificate,
    },
}

impl Phase {
    /// The pending generation, in the phases that have one.
    pub(crate) fn pending(&self) -> Option<&Pending> {
        match self {
            Phase::Recovering {
                pending: Some((p, _)),
                ..
            }
            | Phase::Requesting(p)
            | Phase::Waiting(p)
            | Phase::Storing { pending: p, .. }
            | Phase::AwaitingActivation { pending: p, .. } => Some(p),
            _ => None,
        }
    }
}

/// Why a state file write happened, for what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SavePurpose {
    /// The recovered state: the key directory counts as open once written.
    Recovery,
    /// The CSR's UID was recorded.
    Binding,
    /// A generation was promoted to active.
    Activation {
        /// The generation.
        generation: u64,
    },
    /// A pending generation was abandoned.
    Abandon,
    /// Retired generations were collected.
    Collection,
}

/// Work that blocks or waits; its result comes back as an [`Input`].
#[derive(Debug)]
pub(crate) enum Job {
    /// Open and lock the key directory and read it
    /// ([`recovery::read`]); result [`Input::Opened`].
    Open {
        /// For orphan adoption and moved-aside names.
        now_unix: i64,
    },
    /// [`mint::mint`]; result [`Input::Minted`].
    Mint(Box<MintPlan>),
    /// [`mint::refresh_trust`]; result [`Input::Refreshed`].
    RefreshTrust(Box<RefreshPlan>),
    /// [`mint::store_issued`]; result [`Input::Stored`].
    StoreIssued(Box<StorePlan>),
    /// Save the state file; result [`Input::Saved`].
    Save {
        /// The state.
        state: Box<KeyDirState>,
        /// Why.
        purpose: SavePurpose,
    },
    /// Read the paths OVSDB points at; result [`Input::OvsdbRead`].
    ReadOvsdb,
    /// Collect retired generations; result [`Input::Collected`].
    CollectGarbage {
        /// The state (its `retired` list is updated).
        state: Box<KeyDirState>,
        /// Now.
        now_unix: i64,
        /// The grace period.
        grace_secs: i64,
        /// What OVSDB points at (never removed).
        referenced: Vec<PathBuf>,
    },
}

/// What the shell should do.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Status: the identity condition (no confirmed identity).
    Condition(IdentityCondition),
    /// Status: a warning beside the confirmed identity.
    Warning(Option<Reason>),
    /// Status: the trust bundle held.
    TrustHeld(Sha256Digest),
    /// Status and bus: the confirmed identity.
    PublishActive(Box<ActiveIdentity>),
    /// Bus: please activate this generation.
    PublishReady {
        /// The generation.
        generation: u64,
        /// Its leaf.
        certificate: Box<Certificate>,
        /// The CSR it was issued for, when known.
        csr: Option<CsrBinding>,
    },
    /// Bus: the state file was moved aside.
    MovedAside(MovedAside),
    /// Metrics: the outcome of a renewal step.
    Renewal(&'static str),
    /// Timer: deliver [`Input::Retry`] with `token` after `delay`.
    RetryAfter {
        /// The delay.
        delay: Duration,
        /// Only the latest token counts.
        token: u64,
    },
    /// Timer: deliver [`Input::CollectGarbage`] after the delay.
    CollectGarbageAfter(Duration),
    /// Timer: deliver [`Input::RenewalDue`] for `generation` after `delay`
    /// (a CA rotation's early renewal).
    RenewalDueAfter {
        /// The generation to renew.
        generation: u64,
        /// The delay.
        delay: Duration,
    },
    /// Task: create the CSR and wait for its outcome, replacing any running
    /// one; reports [`Input::Submitted`] and [`Input::Settled`].
    SubmitCsr {
        /// The pending generation.
        generation: u64,
        /// The object.
        submission: CsrSubmission,
    },
    /// Release the key directory (and its lock).
    CloseKeyDir,
    /// Run a job and feed its result back.
    Job(Job),
}

/// What the machine reacts to.
#[derive(Debug)]
pub(crate) enum Input {
    /// Open the key directory (at start).
    Open,
    /// The trust ConfigMap's content.
    Trust(TrustSource),
    /// The renewal point of `generation` has come.
    RenewalDue {
        /// The generation.
        generation: u64,
    },
    /// The renewal timer (re)started.
    TimerStarted,
    /// The OVSDB writer (re)started: a request it held is gone.
    WriterStarted,
    /// OVSDB points at `generation`.
    Activated {
        /// The generation.
        generation: u64,
    },
    /// Activating `generation` failed.
    ActivationFailed {
        /// The generation.
        generation: u64,
        /// The error's label.
        reason: String,
    },
    /// The CSR object exists.
    Submitted {
        /// The pending generation.
        generation: u64,
        /// The object.
        csr: CsrRef,
    },
    /// The CSR wait ended.
    Settled {
        /// The pending generation.
        generation: u64,
        /// The outcome.
        outcome: Result<CsrOutcome>,
    },
    /// A backoff delay elapsed.
    Retry {
        /// The token it was scheduled with.
        token: u64,
    },
    /// Time to collect retired generations.
    CollectGarbage,
    /// Result of [`Job::Open`].
    Opened(Result<Box<Recovered>>),
    /// Result of [`Job::Mint`].
    Minted(Result<Box<Minted>>),
    /// Result of [`Job::RefreshTrust`].
    Refreshed(Result<Box<Minted>>),
    /// Result of [`Job::StoreIssued`].
    Stored(Result<()>),
    /// Result of [`Job::Save`].
    Saved {
        /// Why it was saved.
        purpose: SavePurpose,
        /// The outcome.
        result: Result<()>,
    },
    /// Result of [`Job::ReadOvsdb`].
    OvsdbRead(Result<Vec<PathBuf>>),
    /// Result of [`Job::CollectGarbage`].
    Collected {
        /// The updated retired list.
        retired: Vec<RetiredRecord>,
        /// The removed generations.
        result: Result<Vec<u64>>,
    },
}

/// Controller-supplied text (denial reasons) reaches logs only short and
/// without anything that looks like PEM.
fn sanitize(text: &str) -> String {
    if text.contains("-----") {
        return "<redacted>".into();
    }
    text.chars().take(200).collect()
}

/// A trust-only generation: not needed, to start, or impossible now.
enum Refresh {
    No,
    Start(Box<RefreshPlan>),
    Failed(Error),
}

/// The identity's state and its transitions.
#[derive(Debug)]
pub(crate) struct Machine {
    config: IdentityConfig,
    phase: Phase,
    kd: KeyDirState,
    trust: Option<TrustBundle>,
    /// The signing CA's fingerprint as the trust ConfigMap last announced it.
    signing_ca: Option<String>,
    /// The rotation renewal last scheduled (generation, when), so a repeated
    /// bundle does not arm the same timer again.
    rotation: Option<(u64, Timestamp)>,
    active: Option<Active>,
    backoff: Backoff,
    retry_token: u64,
    /// The reason this machine last showed in status: a repeated good
    /// bundle clears a `TrustBundleInvalid` it showed.
    shown: Option<Reason>,
    now: Timestamp,
    out: Vec<Effect>,
}

impl Machine {
    /// A machine with the key directory not yet open.
    pub(crate) fn new(config: IdentityConfig) -> Self {
        let backoff = config.retry.start();
        Machine {
            config,
            phase: Phase::Closed { wanted: false },
            kd: KeyDirState::default(),
            trust: None,
            signing_ca: None,
            rotation: None,
            active: None,
            backoff,
            retry_token: 0,
            shown: None,
            now: timestamp(SystemTime::UNIX_EPOCH),
            out: Vec::new(),
        }
    }

    /// The phase.
    pub(crate) fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The active generation.
    pub(crate) fn active(&self) -> Option<&Active> {
        self.active.as_ref()
    }

    /// The trust bundle held.
    pub(crate) fn trust(&self) -> Option<&TrustBundle> {
        self.trust.as_ref()
    }

    /// The key directory state as the machine holds it.
    #[cfg(test)]
    pub(crate) fn key_dir_state(&self) -> &KeyDirState {
        &self.kd
    }

    /// Reacts to `input` at `now`; returns the effects to run in order.
    pub(crate) fn step(&mut self, input: Input, now: SystemTime) -> Vec<Effect> {
        self.now = timestamp(now);
        match input {
            Input::Open => self.open(),
            Input::Trust(source) => self.on_trust(source),
            Input::RenewalDue { generation } => self.on_renewal_due(generation),
            Input::TimerStarted => self.publish_active(),
            Input::WriterStarted => self.on_writer_started(),
            Input::Activated { generation } => self.on_activated(generation),
            Input::ActivationFailed { generation, reason } => {
                tracing::warn!(generation, reason, "activation failed; will retry");
                self.emit(Effect::Renewal("activation_failed"));
                self.condition(Some(Reason::ActivationFailed));
            }
            Input::Submitted { generation, csr } => self.on_submitted(generation, &csr),
            Input::Settled {
                generation,
                outcome,
            } => self.on_settled(generation, outcome),
            Input::Retry { token } => self.on_retry(token),
            Input::CollectGarbage => self.emit(Effect::Job(Job::ReadOvsdb)),
            Input::Opened(result) => self.on_opened(result),
            Input::Minted(result) => self.on_minted(result),
            Input::Refreshed(result) => self.on_refreshed(result),
            Input::Stored(result) => self.on_stored(result),
            Input::Saved { purpose, result } => self.on_saved(purpose, result),
            Input::OvsdbRead(result) => self.on_ovsdb_read(result),
            Input::Collected { retired, result } => self.on_collected(retired, result),
        }
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, effect: Effect) {
        self.out.push(effect);
    }

    fn take_phase(&mut self) -> Phase {
        std::mem::replace(&mut self.phase, Phase::Idle)
    }

    fn schedule_retry(&mut self) -> Duration {
        let delay = self.backoff.next_delay();
        self.retry_token += 1;
        let token = self.retry_token;
        self.emit(Effect::RetryAfter { delay, token });
        delay
    }

    fn schedule_collection(&mut self) {
        let grace = self.config.gc_grace;
        self.emit(Effect::CollectGarbageAfter(grace + Duration::from_secs(1)));
    }

    fn confirmed(&self) -> bool {
        self.active.as_ref().is_some_and(|a| a.confirmed)
    }

    /// Shows `reason`: as a warning beside a confirmed identity, otherwise
    /// as what the identity is working on.
    fn condition(&mut self, reason: Option<Reason>) {
        self.shown = reason;
        let effect = if self.confirmed() {
            Effect::Warning(reason)
        } else {
            Effect::Condition(IdentityCondition::Working(reason))
        };
        self.emit(effect);
    }

    /// A new identity is wanted; the pending phases already work on one.
    fn want(&mut self) {
        match &mut self.phase {
            Phase::Idle => self.phase = Phase::Wanted,
            Phase::Closed { wanted }
            | Phase::Opening { wanted }
            | Phase::Recovering { wanted, .. } => *wanted = true,
            _ => {}
        }
    }

    fn open(&mut self) {
        if let Phase::Closed { wanted } = self.phase {
            self.phase = Phase::Opening { wanted };
            let now_unix = self.now.unix();
            self.emit(Effect::Job(Job::Open { now_unix }));
        }
    }

    /// The key directory is unusable: blocked in status, retried with
    /// backoff (no crash loop).
    fn blocked(&mut self, e: &Error, wanted: bool) {
        self.emit(Effect::CloseKeyDir);
        self.phase = Phase::Closed { wanted };
        let reason = e.status_reason();
        tracing::error!(
            path = %self.config.key_dir.display(),
            error = %e,
            advice = reason.message(),
            "key directory unusable; retrying with backoff"
        );
        self.shown = Some(reason);
        self.emit(Effect::Condition(IdentityCondition::Blocked(reason)));
        self.schedule_retry();
    }

    fn on_opened(&mut self, result: Result<Box<Recovered>>) {
        let Phase::Opening { wanted } = self.phase else {
            return;
        };
        let mut rec = match result {
            Ok(rec) => rec,
            Err(e) => return self.blocked(&e, wanted),
        };
        if let Some(m) = rec.moved.take() {
            tracing::warn!(
                moved_to = %m.moved_to.display(),
                reason = %m.reason,
                "key directory state unusable; moved aside, requesting a fresh identity"
            );
            self.emit(Effect::MovedAside(m));
        }
        let r = recovery::reconcile(*rec, self.now);
        self.kd = r.state;
        if self.trust.is_none() {
            // Until the ConfigMap arrives, trust what this identity was
            // activated with.
            self.trust = r.trust;
        }
        if r.active.is_some() {
            self.active = r.active;
        }
        self.phase = Phase::Recovering {
            wanted: wanted || r.wanted,
            pending: r.pending,
        };
        let state = Box::new(self.kd.clone());
        self.emit(Effect::Job(Job::Save {
            state,
            purpose: SavePurpose::Recovery,
        }));
    }

    fn on_saved(&mut self, purpose: SavePurpose, result: Result<()>) {
        match (purpose, result) {
            (SavePurpose::Recovery, result) => self.recovered(result),
            (_, Ok(())) => {}
            (SavePurpose::Binding, Err(e)) => {
                tracing::warn!(error = %e, "saving CSR binding failed");
            }
            (SavePurpose::Activation { generation }, Err(e)) => {
                // OVSDB is on N; the state file still says pending N
                // (Issued). A restart re-requests activation of N, which
                // the writer confirms without a transaction: nothing is
                // lost.
                tracing::warn!(generation, error = %e, "recording activation failed");
            }
            (SavePurpose::Abandon | SavePurpose::Collection, Err(e)) => {
                tracing::warn!(error = %e, "saving key directory state failed");
            }
        }
    }

    /// The recovered state is written (or not): the key directory is open.
    fn recovered(&mut self, result: Result<()>) {
        if !matches!(self.phase, Phase::Recovering { .. }) {
            return;
        }
        let Phase::Recovering { wanted, pending } = self.take_phase() else {
            return;
        };
        if let Err(e) = result {
            return self.blocked(&e, wanted);
        }
        self.shown = None;
        self.emit(Effect::Condition(IdentityCondition::Working(None)));
        self.backoff.reset();
        // Orphans adopted at load are collected after the grace period.
        self.schedule_collection();
        let active = self.active.as_ref().map(|a| a.generation);
        let resumed = pending.as_ref().map(|(p, _)| p.generation);
        if active.is_some() || resumed.is_some() {
            tracing::info!(?active, pending = ?resumed, "key directory loaded");
        }
        let mut wanted = wanted || self.requested_by_another_pod();
        // A pending generation another Pod requested is not resumed: its
        // CSR cannot back this Pod's receipts (and, not yet issued, the
        // controller denies it with that Pod gone). A fresh one replaces
        // it; the abandoned folder is collected like any orphan.
        let this_pod = self.config.pod_uid.as_str();
        let pending = match pending {
            Some(p)
                if self.kd.pending.as_ref().is_some_and(|r| {
                    r.requester_pod_uid
                        .as_deref()
                        .is_some_and(|pod| pod != this_pod)
                }) =>
            {
                tracing::info!(
                    generation = p.0.generation,
                    "pending identity was requested by another Pod of this node; requesting anew"
                );
                wanted = true;
                None
            }
            p => p,
        };
        self.phase = match pending {
            Some((pending, Some(certificate))) => Phase::AwaitingActivation {
                pending,
                certificate,
            },
            Some((pending, None)) => Phase::Waiting(pending),
            None if wanted => Phase::Wanted,
            None => Phase::Idle,
        };
        self.drive();
    }

    /// The CSR the pending generation's certificate was issued for: its
    /// own, or — for a trust-only generation, which reuses the active
    /// certificate — the active one's.
    fn pending_csr(&self) -> Option<CsrBinding> {
        let p = self.kd.pending.as_ref()?;
        if p.trust_refresh {
            return self.active.as_ref().and_then(|a| a.csr.clone());
        }
        Some(CsrBinding {
            name: p.csr_name.clone(),
            uid: p.csr_uid.clone()?,
            pod_uid: p.requester_pod_uid.clone(),
        })
    }

    /// Takes the next step the phase calls for. Idempotent.
    fn drive(&mut self) {
        match &self.phase {
            Phase::AwaitingActivation {
                pending,
                certificate,
            } => {
                let generation = pending.generation;
                let effect = Effect::PublishReady {
                    generation,
                    certificate: Box::new(certificate.clone()),
                    csr: self.pending_csr(),
                };
                self.emit(effect);
                // Watchdog: republish until the writer confirms.
                self.schedule_retry();
            }
            Phase::Waiting(_) => self.request_csr(),
            Phase::Idle | Phase::Wanted => {
                if let Some(a) = &self.active
                    && !a.confirmed
                {
                    let effect = Effect::PublishReady {
                        generation: a.generation,
                        certificate: Box::new(a.certificate.clone()),
                        csr: a.csr.clone(),
                    };
                    self.emit(effect);
                    self.schedule_retry();
                }
                if matches!(self.phase, Phase::Wanted) {
                    self.start_mint();
                }
            }
            _ => {}
        }
    }

    fn start_mint(&mut self) {
        let Some(trust) = &self.trust else {
            // The ConfigMap watcher will send it; nothing to retry.
            self.condition(Some(Reason::TrustBundleMissing));
            return;
        };
        let cfg = &self.config;
        let plan = MintPlan {
            generation: self.kd.last_generation + 1,
            key_type: cfg.key_type,
            chassis: cfg.chassis.clone(),
            node_uid: cfg.node_uid.clone(),
            pod_uid: cfg.pod_uid.clone(),
            expiration_seconds: cfg.expiration_seconds,
            trust_digest: trust.digest(),
            state: self.kd.clone(),
        };
        self.phase = Phase::Minting;
        self.emit(Effect::Job(Job::Mint(Box::new(plan))));
    }

    fn on_minted(&mut self, result: Result<Box<Minted>>) {
        if !matches!(self.phase, Phase::Minting) {
            return;
        }
        match result {
            Ok(m) => {
                tracing::info!(generation = m.record.generation, csr = %m.record.csr_name, key_digest = %m.record.key_digest, "identity request prepared");
                self.kd.last_generation = m.record.generation;
                self.kd.pending = Some(m.record);
                self.phase = Phase::Waiting(m.pending);
                self.request_csr();
            }
            Err(e) => {
                self.phase = Phase::Wanted;
                tracing::warn!(error = %e, "identity request could not be prepared");
                self.emit(Effect::Renewal(e.metric_label()));
                self.condition(Some(e.status_reason()));
                self.schedule_retry();
            }
        }
    }

    fn request_csr(&mut self) {
        let Phase::Waiting(_) = self.phase else {
            return;
        };
        let Phase::Waiting(p) = self.take_phase() else {
            return;
        };
        let submission = mint::submission(&self.config, &p);
        self.condition(Some(Reason::CsrPending));
        self.emit(Effect::SubmitCsr {
            generation: p.generation,
            submission,
        });
        self.phase = Phase::Requesting(p);
    }

    fn on_submitted(&mut self, generation: u64, csr: &CsrRef) {
        let Some(rec) = self
            .kd
            .pending
            .as_mut()
            .filter(|r| r.generation == generation)
        else {
            return;
        };
        if rec.csr_uid.as_deref() != Some(csr.uid.as_str()) {
            rec.csr_uid = Some(csr.uid.clone());
            rec.stage = PendingStage::Submitted;
            let state = Box::new(self.kd.clone());
            self.emit(Effect::Job(Job::Save {
                state,
                purpose: SavePurpose::Binding,
            }));
        }
        tracing::info!(generation, csr = %csr.name, uid = %csr.uid, "CSR submitted");
    }

    fn on_settled(&mut self, generation: u64, outcome: Result<CsrOutcome>) {
        if !matches!(&self.phase, Phase::Requesting(p) if p.generation == generation) {
            return;
        }
        let Phase::Requesting(p) = self.take_phase() else {
            return;
        };
        let name = p.csr_name.clone();
        match outcome {
            Ok(CsrOutcome::Issued { certificate_pem }) => match self.trust.clone() {
                Some(trust) => self.verify(p, &trust, &certificate_pem),
                None => {
                    // Cannot verify yet; the CSR stays issued, ask again
                    // later.
                    self.phase = Phase::Waiting(p);
                    self.fail_attempt(generation, &Error::TrustBundleMissing, false);
                }
            },
            Ok(CsrOutcome::Denied { reason, message }) => {
                self.phase = Phase::Waiting(p);
                let e = Error::CsrDenied {
                    name: name.clone(),
                    reason: sanitize(&reason),
                };
                tracing::warn!(generation, csr = %name, reason = %sanitize(&reason), message = %sanitize(&message), "CSR denied");
                self.fail_attempt(generation, &e, true);
            }
            Ok(CsrOutcome::Failed { reason, message }) => {
                self.phase = Phase::Waiting(p);
                let e = Error::CsrFailed {
                    name: name.clone(),
                    reason: sanitize(&reason),
                };
                tracing::warn!(generation, csr = %name, reason = %sanitize(&reason), message = %sanitize(&message), "CSR failed");
                self.fail_attempt(generation, &e, true);
            }
            Ok(CsrOutcome::Pending) => {
                self.phase = Phase::Waiting(p);
                let e = Error::CsrTimeout { name };
                tracing::warn!(generation, error = %e, "CSR not issued yet; will keep waiting");
                self.fail_attempt(generation, &e, false);
            }
            Ok(CsrOutcome::NotFound) => {
                self.phase = Phase::Waiting(p);
                let e = Error::CsrApi(format!("CSR {name} disappeared; resubmitting"));
                tracing::warn!(generation, error = %e, "CSR gone");
                self.fail_attempt(generation, &e, false);
            }
            Err(e) => {
                self.phase = Phase::Waiting(p);
                tracing::warn!(generation, error = %e, "CSR API failed");
                self.fail_attempt(generation, &e, false);
            }
        }
    }

    /// Checks an issued certificate against the pending key, the chassis,
    /// the trust and the requested lifetime; a good one is stored.
    fn verify(&mut self, p: Pending, trust: &TrustBundle, pem: &[u8]) {
        let generation = p.generation;
        let cfg = &self.config;
        match verify_issued(
            pem,
            &p.key,
            &cfg.chassis,
            trust,
            self.now,
            cfg.expiration_seconds,
        ) {
            Ok(certificate) => {
                let mut state = self.kd.clone();
                if let Some(rec) = &mut state.pending {
                    rec.stage = PendingStage::Issued;
                }
                self.emit(Effect::Job(Job::StoreIssued(Box::new(StorePlan {
                    generation,
                    certificate_pem: certificate.to_pem(),
                    ca_pem: trust.to_pem(),
                    state,
                }))));
                self.phase = Phase::Storing {
                    pending: p,
                    certificate,
                    ca_digest: trust.digest(),
                };
            }
            Err(e) => {
                // A rejected certificate discards the key (new attempt).
                let csr = p.csr_name.clone();
                self.phase = Phase::Waiting(p);
                tracing::warn!(generation, csr = %csr, error = %e, rejected = true, "issued certificate not accepted");
                self.fail_attempt(generation, &e, true);
            }
        }
    }

    fn on_stored(&mut self, result: Result<()>) {
        if !matches!(self.phase, Phase::Storing { .. }) {
            return;
        }
        let Phase::Storing {
            mut pending,
            certificate,
            ca_digest,
        } = self.take_phase()
        else {
            return;
        };
        let generation = pending.generation;
        match result {
            Ok(()) => {
                if let Some(rec) = &mut self.kd.pending {
                    rec.stage = PendingStage::Issued;
                }
                pending.ca_digest = Some(ca_digest);
                tracing::info!(generation, csr = %pending.csr_name, "certificate issued and verified");
                self.phase = Phase::AwaitingActivation {
                    pending,
                    certificate,
                };
                self.backoff.reset();
                self.drive();
            }
            Err(e) => {
                // Failing to store a good certificate keeps the key: the
                // same CSR again.
                tracing::warn!(generation, csr = %pending.csr_name, error = %e, rejected = false, "issued certificate not accepted");
                self.phase = Phase::Waiting(pending);
                self.fail_attempt(generation, &e, false);
            }
        }
    }

    /// Records a failed attempt of the [`Phase::Waiting`] generation;
    /// `abandon` discards its key (the next attempt is a new generation),
    /// otherwise the same CSR is resumed.
    fn fail_attempt(&mut self, generation: u64, e: &Error, abandon: bool) {
        self.emit(Effect::Renewal(e.metric_label()));
        self.condition(Some(e.status_reason()));
        if abandon {
            self.kd.pending = None;
            self.kd.retired.push(RetiredRecord {
                generation,
                retired_at: self.now.unix(),
            });
            self.phase = Phase::Wanted;
            let state = Box::new(self.kd.clone());
            self.emit(Effect::Job(Job::Save {
                state,
                purpose: SavePurpose::Abandon,
            }));
        }
        let delay = self.schedule_retry();
        tracing::info!(
            generation,
            retry_in_secs = delay.as_secs_f64(),
            "identity attempt will be retried"
        );
    }

    fn on_retry(&mut self, token: u64) {
        if token != self.retry_token {
            return;
        }
        if matches!(self.phase, Phase::Closed { .. }) {
            self.open();
            return;
        }
        if matches!(self.phase, Phase::Idle) && self.confirmed() {
            self.check_trust_and_expiry();
        }
        self.drive();
    }

    /// A respawned writer lost any activation request it held: one that is
    /// awaited is published again at once (the watchdog would, but only
    /// after its backoff delay).
    fn on_writer_started(&mut self) {
        let awaited = match &self.phase {
            Phase::AwaitingActivation { .. } => true,
            Phase::Idle => self.active.as_ref().is_some_and(|a| !a.confirmed),
            _ => false,
        };
        if awaited {
            self.drive();
        }
    }

    fn on_renewal_due(&mut self, generation: u64) {
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.generation == generation)
            && self.phase.pending().is_none()
        {
            tracing::info!(generation, "renewal due");
            self.want();
            self.drive();
        }
    }

    fn on_activated(&mut self, generation: u64) {
        let promoted = matches!(
            &self.phase,
            Phase::AwaitingActivation { pending, .. } if pending.generation == generation
        );
        if promoted {
            let Phase::AwaitingActivation {
                pending,
                certificate,
            } = self.take_phase()
            else {
                return;
            };
            let csr = self.pending_csr();
            let old = self.kd.active.take();
            self.kd.active = Some(ActiveRecord {
                generation,
                certificate_digest: certificate.digest().to_hex(),
                csr: csr.clone(),
            });
            self.kd.pending = None;
            if let Some(old) = old {
                self.kd.retired.push(RetiredRecord {
                    generation: old.generation,
                    retired_at: self.now.unix(),
                });
            }
            let state = Box::new(self.kd.clone());
            self.emit(Effect::Job(Job::Save {
                state,
                purpose: SavePurpose::Activation { generation },
            }));
            self.phase = Phase::Idle;
            self.active = Some(Active {
                generation,
                certificate,
                confirmed: true,
                ca_digest: pending.ca_digest,
                csr,
            });
            self.emit(Effect::Renewal("success"));
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
        self.schedule_collection();
        // Renewal may have been wanted while this generation was in flight
        // (an expired or untrusted identity, a CA rotation).
        self.check_trust_and_expiry();
        self.plan_rotation();
        self.refresh_or_drive();
    }

    fn publish_active(&mut self) {
        let Some(a) = &self.active else { return };
        if !a.confirmed {
            return;
        }
        let identity = ActiveIdentity {
            generation: a.generation,
            certificate: a.certificate.clone(),
            csr: a.csr.clone(),
        };
        // The board clears the warning and the condition with it.
        self.shown = None;
        self.emit(Effect::PublishActive(Box::new(identity)));
    }

    /// Marks a renewal wanted when the active leaf is expired or does not
    /// verify against the current trust.
    fn check_trust_and_expiry(&mut self) {
        let Some(a) = &self.active else {
            self.want();
            return;
        };
        if self.now >= a.certificate.not_after() {
            self.want();
            return;
        }
        if self.requested_by_another_pod() {
            self.want();
            return;
        }
        if let Some(t) = &self.trust
            && t.verify_leaf(&a.certificate, self.now).is_err()
        {
            tracing::warn!(
                generation = a.generation,
                "active identity does not verify against the trust bundle; renewing now"
            );
            self.want();
            self.condition(Some(Reason::IdentityUntrusted));
        }
    }

    /// Whether the active identity's CSR was requested by another Pod of
    /// this node (the DaemonSet replaced the Pod). Such an identity keeps
    /// serving IKE, but the controller ties coordination receipts to the
    /// live Pod through the CSR, so it is renewed for this Pod — at once,
    /// also before the identity is activated: a node in `Prepare` activates
    /// nothing and would otherwise offer the old Pod's CSR forever.
    fn requested_by_another_pod(&self) -> bool {
        let this_pod = self.config.pod_uid.as_str();
        let Some(a) = &self.active else { return false };
        let other = a
            .csr
            .as_ref()
            .is_some_and(|c| c.pod_uid.as_deref() != Some(this_pod));
        if other {
            tracing::info!(
                generation = a.generation,
                "active identity was requested by another Pod of this node; renewing for this Pod"
            );
        }
        other
    }

    /// Schedules the early renewal of a CA rotation when the announced
    /// signing CA is in the bundle and the active leaf predates it and came
    /// from another CA (`Certificate::rotation_time`).
    fn plan_rotation(&mut self) {
        let (Some(a), Some(fingerprint), Some(trust)) =
            (&self.active, &self.signing_ca, &self.trust)
        else {
            return;
        };
        let Some(signing) = trust
            .certificates()
            .iter()
            .find(|c| c.digest().to_hex().eq_ignore_ascii_case(fingerprint))
        else {
            tracing::warn!(
                signing_ca = %fingerprint,
                "the announced signing CA is not in the trust bundle; no rotation renewal"
            );
            return;
        };
        let Some(at) = a.certificate.rotation_time(
            signing,
            &self.config.node_uid,
            self.config.rotation_spread,
        ) else {
            return;
        };
        let generation = a.generation;
        if self.rotation == Some((generation, at)) {
            return;
        }
        self.rotation = Some((generation, at));
        let delay = Duration::from_secs(u64::try_from(at.secs_since(self.now)).unwrap_or(0));
        tracing::info!(
            generation,
            signing_ca = %fingerprint,
            %at,
            "CA rotation: renewing onto the signing CA"
        );
        self.emit(Effect::RenewalDueAfter { generation, delay });
    }

    fn on_trust(&mut self, source: TrustSource) {
        self.signing_ca = source.signing_ca;
        let bundle = match TrustBundle::from_pem(&source.bundle_pem) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "trust bundle rejected; keeping the previous one");
                self.condition(Some(Reason::TrustBundleInvalid));
                return;
            }
        };
        let digest = bundle.digest();
        let same = self.trust.as_ref().is_some_and(|t| t.digest() == digest);
        self.emit(Effect::TrustHeld(digest));
        if same {
            // A repeated bundle clears an earlier "invalid" warning.
            if self.shown == Some(Reason::TrustBundleInvalid) {
                self.condition(None);
            }
            self.plan_rotation();
            self.drive();
            return;
        }
        tracing::info!(trust_digest = %digest, "trust bundle updated");
        self.trust = Some(bundle);
        self.condition(None);
        self.check_trust_and_expiry();
        self.plan_rotation();
        self.refresh_or_drive();
    }

    /// Starts a trust-only generation when one is needed, else drives.
    fn refresh_or_drive(&mut self) {
        match self.trust_refresh() {
            Refresh::No => self.drive(),
            Refresh::Start(plan) => {
                self.phase = Phase::RefreshingTrust {
                    from: plan.from,
                    certificate: plan.certificate.clone(),
                };
                self.emit(Effect::Job(Job::RefreshTrust(plan)));
            }
            Refresh::Failed(e) => {
                tracing::warn!(error = %e, "trust-only generation could not be prepared");
                self.schedule_retry();
            }
        }
    }

    /// When the confirmed active generation's `ca.pem` is not the trust
    /// held now (and the leaf still verifies — otherwise a renewal is
    /// wanted), a trust-only generation brings the new bundle to OVSDB.
    fn trust_refresh(&self) -> Refresh {
        let open = match self.phase {
            Phase::Idle => true,
            Phase::Closed { wanted: false } => false,
            _ => return Refresh::No,
        };
        let (Some(a), Some(trust)) = (&self.active, &self.trust) else {
            return Refresh::No;
        };
        if !a.confirmed || a.ca_digest == Some(trust.digest()) {
            return Refresh::No;
        }
        if !open {
            return Refresh::Failed(Error::KeyDirLocked {
                path: self.config.key_dir.clone(),
                holder: None,
            });
        }
        Refresh::Start(Box::new(RefreshPlan {
            from: a.generation,
            generation: self.kd.last_generation + 1,
            certificate: a.certificate.clone(),
            trust: trust.clone(),
            state: self.kd.clone(),
        }))
    }

    fn on_refreshed(&mut self, result: Result<Box<Minted>>) {
        if !matches!(self.phase, Phase::RefreshingTrust { .. }) {
            return;
        }
        let Phase::RefreshingTrust { from, certificate } = self.take_phase() else {
            return;
        };
        match result {
            Ok(m) => {
                let generation = m.record.generation;
                self.kd.last_generation = generation;
                self.kd.pending = Some(m.record);
                tracing::info!(
                    generation,
                    from,
                    "trust bundle changed; activating a trust-only generation"
                );
                self.phase = Phase::AwaitingActivation {
                    pending: m.pending,
                    certificate,
                };
                self.drive();
            }
            Err(e) => {
                self.phase = Phase::Idle;
                tracing::warn!(error = %e, "trust-only generation could not be prepared");
                self.schedule_retry();
            }
        }
    }

    fn on_ovsdb_read(&mut self, result: Result<Vec<PathBuf>>) {
        let referenced = match result {
            Ok(r) => r,
            Err(e) => {
                // Never delete what OVSDB may reference: no read, no GC.
                tracing::warn!(error = %e, "OVSDB unreadable; garbage collection skipped");
                return;
            }
        };
        if matches!(self.phase, Phase::Closed { .. } | Phase::Opening { .. }) {
            return;
        }
        let grace_secs = i64::try_from(self.config.gc_grace.as_secs()).unwrap_or(i64::MAX);
        self.emit(Effect::Job(Job::CollectGarbage {
            state: Box::new(self.kd.clone()),
            now_unix: self.now.unix(),
            grace_secs,
            referenced,
        }));
    }

    fn on_collected(&mut self, retired: Vec<RetiredRecord>, result: Result<Vec<u64>>) {
        self.kd.retired = retired;
        match result {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(?removed, "retired generations collected");
                let state = Box::new(self.kd.clone());
                self.emit(Effect::Job(Job::Save {
                    state,
                    purpose: SavePurpose::Collection,
                }));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "garbage collection failed"),
        }
    }
}

#[cfg(test)]
mod tests;
