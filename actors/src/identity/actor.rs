//! The identity actor: a thin shell around the [`Machine`]. It turns
//! messages into inputs, runs the effects through the ports (status board,
//! bus, metrics, timers, the CSR API, OVSDB) and every key-directory job —
//! key generation included — through `ports::blocking`, feeding each
//! result back before it takes the next message. Jobs run one at a time,
//! in the order the machine asked for them.

use std::collections::VecDeque;
use std::sync::Arc;

use kube_ovn_ipsec_api::pki::TrustBundle;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::machine::{Effect, Input, Job, Machine};
use super::{IdentityArgs, IdentityMsg, IdentitySnapshot, Internal, mint, recovery};
use crate::bus::{ActivationEvent, ActivationRequest, IdentityEvent, RenewalEvent};
use crate::error::{Error, Result};
use crate::keydir::KeyDir;
use crate::ports::{CsrSubmission, KeyStore, blocking};

/// What the actor's own tasks and timers send it.
fn internal(input: Input) -> IdentityMsg {
    IdentityMsg::Internal(Internal(input))
}

/// The identity actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityActor;

/// The identity actor's state: the machine, and the handles its effects
/// need.
pub struct IdentityState {
    args: IdentityArgs,
    machine: Machine,
    /// The open, locked key directory.
    store: Option<Arc<dyn KeyStore>>,
    /// The running CSR submit/wait task.
    task: Option<tokio::task::JoinHandle<()>>,
    trust_forwarder: Option<tokio::task::JoinHandle<()>>,
}

impl IdentityState {
    /// Feeds `input` and everything its jobs return to the machine.
    async fn feed(&mut self, myself: &ActorRef<IdentityMsg>, input: Input) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let effects = self.machine.step(input, self.args.clock.now());
            for effect in effects {
                if let Some(next) = self.run(myself, effect).await {
                    inputs.push_back(next);
                }
            }
        }
    }

    async fn run(&mut self, myself: &ActorRef<IdentityMsg>, effect: Effect) -> Option<Input> {
        let board = &self.args.board;
        match effect {
            Effect::Condition(c) => board.set_identity_condition(c),
            Effect::Warning(w) => board.set_warning(w),
            Effect::TrustHeld(digest) => board.set_trust(digest),
            Effect::PublishActive(a) => {
                let c = &a.certificate;
                board.set_active(a.generation, c.digest(), c.not_after());
                board.set_warning(None);
                self.args.bus.identity.send(IdentityEvent::Active(a));
            }
            Effect::PublishReady {
                generation,
                certificate,
                csr,
            } => {
                if let Some(store) = &self.store {
                    self.args
                        .bus
                        .identity
                        .send(IdentityEvent::Ready(ActivationRequest {
                            generation,
                            paths: store.identity_paths(generation),
                            certificate,
                            csr,
                        }));
                }
            }
            Effect::MovedAside(m) => self.args.bus.identity.send(IdentityEvent::StateMovedAside {
                moved_to: m.moved_to,
                reason: m.reason,
            }),
            Effect::Renewal(label) => self.args.metrics.renewal(label),
            Effect::RetryAfter { delay, token } => {
                myself.send_after(delay, move || internal(Input::Retry { token }));
            }
            Effect::CollectGarbageAfter(delay) => {
                myself.send_after(delay, || internal(Input::CollectGarbage));
            }
            Effect::RenewalDueAfter { generation, delay } => {
                myself.send_after(delay, move || internal(Input::RenewalDue { generation }));
            }
            Effect::SubmitCsr {
                generation,
                submission,
            } => self.spawn_csr_task(myself, generation, submission),
            Effect::CloseKeyDir => self.store = None,
            Effect::Job(job) => return Some(self.job(job).await),
        }
        None
    }

    /// Runs `f` with the open key directory on the blocking pool.
    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn KeyStore) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.store.clone().ok_or_else(|| Error::KeyDirLocked {
            path: self.args.config.key_dir.clone(),
            holder: None,
        })?;
        blocking(move || f(&*store)).await
    }

    async fn job(&mut self, job: Job) -> Input {
        match job {
            Job::Open { now_unix } => {
                let dir = self.args.config.key_dir.clone();
                let owner = self.args.config.owner.clone();
                let opened = blocking(move || {
                    let kd = match owner {
                        Some(owner) => KeyDir::open_owned(owner)?,
                        None => KeyDir::open(dir)?,
                    };
                    let rec = recovery::read(&kd, now_unix)?;
                    let store: Arc<dyn KeyStore> = Arc::new(kd);
                    Ok((store, rec))
                })
                .await;
                Input::Opened(opened.map(|(store, rec)| {
                    self.store = Some(store);
                    Box::new(rec)
                }))
            }
            Job::Mint(plan) => Input::Minted(
                self.with_store(move |s| mint::mint(s, *plan).map(Box::new))
                    .await,
            ),
            Job::RefreshTrust(plan) => Input::Refreshed(
                self.with_store(move |s| mint::refresh_trust(s, *plan).map(Box::new))
                    .await,
            ),
            Job::StoreIssued(plan) => {
                Input::Stored(self.with_store(move |s| mint::store_issued(s, *plan)).await)
            }
            Job::Save { state, purpose } => Input::Saved {
                purpose,
                result: self.with_store(move |s| s.save(&state)).await,
            },
            Job::ReadOvsdb => Input::OvsdbRead(self.args.ovsdb.read().await.map(|k| k.paths())),
            Job::CollectGarbage {
                state,
                now_unix,
                grace_secs,
                referenced,
            } => {
                let before = state.retired.clone();
                let mut state = *state;
                let collected = self
                    .with_store(move |s| {
                        let removed =
                            s.collect_garbage(&mut state, now_unix, grace_secs, &referenced);
                        Ok((state.retired, removed))
                    })
                    .await;
                match collected {
                    Ok((retired, result)) => Input::Collected { retired, result },
                    Err(e) => Input::Collected {
                        retired: before,
                        result: Err(e),
                    },
                }
            }
        }
    }

    fn spawn_csr_task(
        &mut self,
        myself: &ActorRef<IdentityMsg>,
        generation: u64,
        submission: CsrSubmission,
    ) {
        let api = self.args.csr_api.clone();
        let timeout = self.args.config.request_timeout;
        let me = myself.clone();
        if let Some(t) = self.task.take() {
            t.abort();
        }
        self.task = Some(tokio::spawn(async move {
            let csr = match api.submit(&submission).await {
                Ok(csr) => csr,
                Err(e) => {
                    let _ = me.send_message(internal(Input::Settled {
                        generation,
                        outcome: Err(e),
                    }));
                    return;
                }
            };
            let name = csr.name.clone();
            let _ = me.send_message(internal(Input::Submitted { generation, csr }));
            let outcome = api.wait(&name, timeout).await;
            let _ = me.send_message(internal(Input::Settled {
                generation,
                outcome,
            }));
        }));
    }

    fn snapshot(&self) -> IdentitySnapshot {
        let pending = self.machine.phase().pending();
        IdentitySnapshot {
            key_dir_open: self.store.is_some(),
            active: self.machine.active().map(|a| (a.generation, a.confirmed)),
            pending: pending.map(|p| (p.generation, p.csr_name.clone())),
            pending_key_digest: pending.map(|p| p.key.digest_hex()),
            trust_digest: self.machine.trust().map(TrustBundle::digest),
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
        Ok(IdentityState {
            machine: Machine::new(args.config.clone()),
            args,
            store: None,
            task: None,
            trust_forwarder: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<IdentityMsg>,
        state: &mut IdentityState,
    ) -> Result<(), ActorProcessingErr> {
        state.feed(&myself, Input::Open).await;
        let mut rx = state.args.trust.clone();
        let current = rx.borrow_and_update().clone();
        if let Some(pem) = current {
            state.feed(&myself, Input::Trust(pem)).await;
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
        let input = match msg {
            IdentityMsg::TrustBundle(pem) => Input::Trust(pem),
            IdentityMsg::Renewal(RenewalEvent::Due { generation }) => {
                Input::RenewalDue { generation }
            }
            IdentityMsg::Renewal(RenewalEvent::TimerStarted) => Input::TimerStarted,
            IdentityMsg::Activation(ActivationEvent::Activated { generation }) => {
                Input::Activated { generation }
            }
            IdentityMsg::Activation(ActivationEvent::Failed { generation, reason }) => {
                Input::ActivationFailed { generation, reason }
            }
            IdentityMsg::Activation(ActivationEvent::WriterStarted) => Input::WriterStarted,
            IdentityMsg::Internal(Internal(input)) => input,
            IdentityMsg::Snapshot(reply) => {
                let _ = reply.send(state.snapshot());
                return Ok(());
            }
        };
        state.feed(&myself, input).await;
        Ok(())
    }
}
