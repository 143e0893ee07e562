//! The monitor actor: runs `ovs-monitor-ipsec --no-restart-ike-daemon` as
//! its foreground child through [`MonitorPort`] (same probe and restart
//! policy as the IKE actor), feeds `runtimeHealthy`
//! ([`RuntimeComponent::Monitor`]), and acknowledges activations.
//!
//! Acknowledgement (SPEC §3): after each `ActivationEvent::Activated`
//! (and after its own start, for the generation already active) it reads
//! the identity keys OVSDB points at, has the monitor and the IKE daemon
//! read back ([`RunningMonitor::acknowledge`]) and sets
//! `configurationApplied` and the acknowledged trust digest on the board
//! only for a matching read-back. The monitor rewrites the IKE daemon's
//! configuration asynchronously, so a mismatch is retried every
//! `ack_retry` until it matches or a newer generation replaces it.

use std::sync::Arc;
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::bus::{ActivationEvent, Bus};
use crate::error::Error;
use crate::ike::{fail_process, record_probe, stop_on_shutdown};
use crate::metrics::Metrics;
use crate::ports::{MonitorPort, OvsdbIdentity, RunningMonitor};
use crate::process_watch::{ProcessConfig, Watch};
use crate::status::{RuntimeComponent, StatusBoard};

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct MonitorArgs {
    /// Starts the monitor.
    pub port: Arc<dyn MonitorPort>,
    /// Reads the identity keys OVSDB points at.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Where `runtimeHealthy` and the acknowledgement go.
    pub board: StatusBoard,
    /// Failure counter.
    pub metrics: Arc<dyn Metrics>,
    /// Event ports (`Activated`).
    pub bus: Bus,
    /// Probe tuning.
    pub config: ProcessConfig,
    /// Delay between acknowledgement attempts while the read-back does not
    /// match yet.
    pub ack_retry: Duration,
}

/// Messages of the monitor actor.
#[derive(Debug)]
pub enum MonitorMsg {
    /// Internal: non-blocking exit check.
    ExitPoll,
    /// Internal (and on demand): run the health probe.
    Probe,
    /// OVSDB now points at this generation: acknowledge it.
    Activated(u64),
    /// Internal: try the pending acknowledgement again.
    AckRetry,
    /// Health, PID and the generation acknowledged.
    Health(RpcReplyPort<(bool, u32, Option<u64>)>),
}

/// The monitor actor's state.
#[derive(Debug)]
pub struct MonitorState {
    args: MonitorArgs,
    process: Box<dyn RunningMonitor>,
    watch: Watch,
    healthy: bool,
    /// The generation awaiting acknowledgement.
    pending: Option<u64>,
    retry_scheduled: bool,
    exit_poll: Option<JoinHandle<()>>,
}

/// The monitor actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonitorActor;

const NAME: &str = "monitor";

impl MonitorActor {
    async fn try_acknowledge(
        &self,
        myself: &ActorRef<MonitorMsg>,
        state: &mut MonitorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some(generation) = state.pending else {
            return Ok(());
        };
        let active = state.args.board.activated_generation();
        let generation = match active {
            // The board records the activation after the identity actor has
            // persisted it, which can be after this event: try again soon.
            Some(a) if a < generation => {
                schedule_retry(myself, state);
                return Ok(());
            }
            // Replaced by a newer activation: acknowledge that one.
            Some(a) => a,
            None => {
                schedule_retry(myself, state);
                return Ok(());
            }
        };
        state.pending = Some(generation);
        let outcome = match state.args.ovsdb.read().await {
            Ok(keys) => state.process.acknowledge(&keys).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ack) if ack.configuration_applied => {
                tracing::info!(generation, trust_digest = ?ack.trust_digest, "monitor acknowledged the active generation");
                state
                    .args
                    .board
                    .set_acknowledgement(generation, ack.trust_digest);
                state.pending = None;
                return Ok(());
            }
            Ok(ack) => {
                tracing::debug!(generation, mismatches = ?ack.mismatches, "monitor read-back does not match yet");
                state.args.board.set_acknowledgement(generation, None);
            }
            Err(e) => {
                tracing::debug!(generation, error = %e, "monitor read-back failed");
                state.args.board.set_acknowledgement(generation, None);
            }
        }
        schedule_retry(myself, state);
        Ok(())
    }
}

fn schedule_retry(myself: &ActorRef<MonitorMsg>, state: &mut MonitorState) {
    if !state.retry_scheduled {
        state.retry_scheduled = true;
        myself.send_after(state.args.ack_retry, || MonitorMsg::AckRetry);
    }
}

impl Actor for MonitorActor {
    type Msg = MonitorMsg;
    type State = MonitorState;
    type Arguments = MonitorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<MonitorMsg>,
        args: MonitorArgs,
    ) -> Result<MonitorState, ActorProcessingErr> {
        args.board
            .set_runtime_health(RuntimeComponent::Monitor, false);
        args.bus.activation.subscribe(myself.clone(), |e| match e {
            ActivationEvent::Activated { generation } => Some(MonitorMsg::Activated(generation)),
            _ => None,
        });
        let process = args.port.start().await.map_err(|e| {
            args.metrics.process_failure(NAME);
            Error::Process {
                process: NAME,
                reason: format!("start: {e}"),
            }
        })?;
        tracing::info!(pid = process.pid(), "ovs-monitor-ipsec started");
        let watch = Watch::new(args.config);
        let exit_poll = Some(myself.send_interval(args.config.exit_poll, || MonitorMsg::ExitPoll));
        myself.send_after(watch.next_probe(), || MonitorMsg::Probe);
        // A restarted monitor re-acknowledges what is already active.
        let pending = args.board.activated_generation();
        Ok(MonitorState {
            args,
            process,
            watch,
            healthy: false,
            pending,
            retry_scheduled: false,
            exit_poll,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<MonitorMsg>,
        state: &mut MonitorState,
    ) -> Result<(), ActorProcessingErr> {
        stop_on_shutdown(
            NAME,
            RuntimeComponent::Monitor,
            &mut state.exit_poll,
            state.process.as_mut(),
            &state.args.board,
        )
        .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<MonitorMsg>,
        msg: MonitorMsg,
        state: &mut MonitorState,
    ) -> Result<(), ActorProcessingErr> {
        let reason = match msg {
            MonitorMsg::Health(reply) => {
                let acked = state.args.board.acknowledged().map(|(g, _)| g);
                let _ = reply.send((state.healthy, state.process.pid(), acked));
                return Ok(());
            }
            MonitorMsg::Activated(generation) => {
                state.pending = Some(generation);
                if state.healthy {
                    self.try_acknowledge(&myself, state).await?;
                }
                return Ok(());
            }
            MonitorMsg::AckRetry => {
                state.retry_scheduled = false;
                if state.healthy {
                    self.try_acknowledge(&myself, state).await?;
                }
                return Ok(());
            }
            MonitorMsg::ExitPoll => match state.process.try_exited() {
                Some(s) => format!("exited ({s})"),
                None => return Ok(()),
            },
            MonitorMsg::Probe => {
                let verdict = state.watch.probe(state.process.as_mut()).await;
                let board = &state.args.board;
                match record_probe(
                    NAME,
                    RuntimeComponent::Monitor,
                    verdict,
                    &mut state.healthy,
                    board,
                ) {
                    Ok(()) => {
                        let healthy = state.healthy;
                        myself.send_after(state.watch.next_probe(), || MonitorMsg::Probe);
                        // Every probe also checks that the active generation
                        // is the acknowledged one (nothing is missed if an
                        // event raced with the board).
                        let active = state.args.board.activated_generation();
                        let acked = state.args.board.acknowledged().map(|(g, _)| g);
                        if active.is_some() && active != acked && state.pending.is_none() {
                            state.pending = active;
                        }
                        if healthy {
                            self.try_acknowledge(&myself, state).await?;
                        }
                        return Ok(());
                    }
                    Err(reason) => reason,
                }
            }
        };
        if let Some(h) = state.exit_poll.take() {
            h.abort();
        }
        Err(fail_process(
            NAME,
            RuntimeComponent::Monitor,
            state.process.as_mut(),
            &state.args.board,
            state.args.metrics.as_ref(),
            reason,
        )
        .await)
    }
}
