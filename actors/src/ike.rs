//! The IKE actor: runs the IKE daemon (strongSwan starter + charon) as its
//! foreground child through [`IkePort`], probes it, and feeds
//! `runtimeHealthy` ([`RuntimeComponent::IkeDaemon`]).
//!
//! An exit or failed probes (policy in `process_watch`) stop the daemon's
//! process group and fail the actor: the node supervisor restarts it on the
//! 1 s … 30 s schedule. A normal stop (`post_stop`) sends SIGTERM to the
//! group, then SIGKILL after the grace period. The guards do not depend on
//! this process: they stay armed through every restart.

use std::sync::Arc;

use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::error::Error;
use crate::metrics::Metrics;
use crate::ports::{IkePort, RunningProcess};
pub use crate::process_watch::ProcessConfig;
use crate::process_watch::{ProbeVerdict, Watch};
use crate::status::{RuntimeComponent, StatusBoard};

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct IkeArgs {
    /// Starts the daemon.
    pub port: Arc<dyn IkePort>,
    /// Where `runtimeHealthy` goes.
    pub board: StatusBoard,
    /// Failure counter.
    pub metrics: Arc<dyn Metrics>,
    /// Probe tuning.
    pub config: ProcessConfig,
}

/// Messages of the IKE actor.
#[derive(Debug)]
pub enum IkeMsg {
    /// Internal: non-blocking exit check.
    ExitPoll,
    /// Internal (and on demand): run the health probe.
    Probe,
    /// Whether the daemon passed its last probe, and its PID.
    Health(RpcReplyPort<(bool, u32)>),
}

/// The IKE actor's state.
#[derive(Debug)]
pub struct IkeState {
    args: IkeArgs,
    process: Box<dyn RunningProcess>,
    watch: Watch,
    healthy: bool,
    exit_poll: Option<JoinHandle<()>>,
}

/// The IKE actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct IkeActor;

const NAME: &str = "ike";

/// Records a probe verdict for one process actor: its health on the board
/// (and a log line when it changes), or `Err(reason)` when the process must
/// be failed and restarted.
pub(crate) fn record_probe(
    name: &'static str,
    component: RuntimeComponent,
    verdict: ProbeVerdict,
    healthy: &mut bool,
    board: &StatusBoard,
) -> Result<(), String> {
    let now_healthy = match verdict {
        ProbeVerdict::Healthy => true,
        ProbeVerdict::NotYet(why) => {
            tracing::debug!(process = name, %why, "probe failed");
            false
        }
        ProbeVerdict::Fail(reason) => return Err(reason),
    };
    if now_healthy != *healthy {
        tracing::info!(
            process = name,
            healthy = now_healthy,
            "runtime process health"
        );
    }
    *healthy = now_healthy;
    board.set_runtime_health(component, now_healthy);
    Ok(())
}

/// The shared `post_stop` of the process actors: the exit poll ends, the
/// component counts as unhealthy, and the process group gets SIGTERM, then
/// SIGKILL. Guards are not touched (SPEC §4).
pub(crate) async fn stop_on_shutdown(
    name: &'static str,
    component: RuntimeComponent,
    exit_poll: &mut Option<JoinHandle<()>>,
    process: &mut dyn RunningProcess,
    board: &StatusBoard,
) {
    if let Some(h) = exit_poll.take() {
        h.abort();
    }
    board.set_runtime_health(component, false);
    if let Err(e) = process.stop().await {
        tracing::warn!(process = name, error = %e, "stopping the process on shutdown");
    }
}

/// Stops the process and turns `reason` into the actor's failure.
pub(crate) async fn fail_process(
    name: &'static str,
    component: RuntimeComponent,
    process: &mut dyn RunningProcess,
    board: &StatusBoard,
    metrics: &dyn Metrics,
    reason: String,
) -> ActorProcessingErr {
    board.set_runtime_health(component, false);
    metrics.process_failure(name);
    tracing::warn!(process = name, pid = process.pid(), %reason, "runtime process failed; stopping its group for a restart");
    if let Err(e) = process.stop().await {
        tracing::warn!(process = name, error = %e, "stopping the failed process");
    }
    Box::new(Error::Process {
        process: name,
        reason,
    })
}

impl Actor for IkeActor {
    type Msg = IkeMsg;
    type State = IkeState;
    type Arguments = IkeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<IkeMsg>,
        args: IkeArgs,
    ) -> Result<IkeState, ActorProcessingErr> {
        args.board
            .set_runtime_health(RuntimeComponent::IkeDaemon, false);
        let process = args.port.start().await.map_err(|e| {
            args.metrics.process_failure(NAME);
            Error::Process {
                process: NAME,
                reason: format!("start: {e}"),
            }
        })?;
        tracing::info!(pid = process.pid(), "IKE daemon started");
        let watch = Watch::new(args.config);
        let exit_poll = Some(myself.send_interval(args.config.exit_poll, || IkeMsg::ExitPoll));
        myself.send_after(watch.next_probe(), || IkeMsg::Probe);
        Ok(IkeState {
            args,
            process,
            watch,
            healthy: false,
            exit_poll,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<IkeMsg>,
        state: &mut IkeState,
    ) -> Result<(), ActorProcessingErr> {
        stop_on_shutdown(
            NAME,
            RuntimeComponent::IkeDaemon,
            &mut state.exit_poll,
            state.process.as_mut(),
            &state.args.board,
        )
        .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<IkeMsg>,
        msg: IkeMsg,
        state: &mut IkeState,
    ) -> Result<(), ActorProcessingErr> {
        let reason = match msg {
            IkeMsg::Health(reply) => {
                let _ = reply.send((state.healthy, state.process.pid()));
                return Ok(());
            }
            IkeMsg::ExitPoll => match state.process.try_exited() {
                Some(s) => format!("exited ({s})"),
                None => return Ok(()),
            },
            IkeMsg::Probe => {
                let verdict = state.watch.probe(state.process.as_mut()).await;
                let board = &state.args.board;
                match record_probe(
                    NAME,
                    RuntimeComponent::IkeDaemon,
                    verdict,
                    &mut state.healthy,
                    board,
                ) {
                    Ok(()) => {
                        myself.send_after(state.watch.next_probe(), || IkeMsg::Probe);
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
            RuntimeComponent::IkeDaemon,
            state.process.as_mut(),
            &state.args.board,
            state.args.metrics.as_ref(),
            reason,
        )
        .await)
    }
}
