//! The IKE actor: runs the IKE daemon (strongSwan starter + charon) as its
//! foreground child through [`IkePort`], probes it, and feeds
//! `runtimeHealthy` ([`RuntimeComponent::IkeDaemon`]).
//!
//! The process policy is `process_watch`'s: an exit or failed probes stop
//! the daemon's process group and fail the actor, and the node supervisor
//! restarts it on the 1 s … 30 s schedule. A normal stop (`post_stop`)
//! sends SIGTERM to the group, then SIGKILL after the grace period. The
//! guards do not depend on this process: they stay armed through every
//! restart.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::gate::ProtectionGate;
use crate::metrics::Metrics;
use crate::ports::{IkePort, RunningProcess};
use crate::process_watch::{ProcessConfig, ProcessWatch, StartPatience, WatchArgs};
use crate::status::{RuntimeComponent, StatusBoard};

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct IkeArgs {
    /// The guards must be armed before the daemon starts.
    pub gate: ProtectionGate,
    /// Starts the daemon.
    pub port: Arc<dyn IkePort>,
    /// Where `runtimeHealthy` goes.
    pub board: StatusBoard,
    /// Failure counter.
    pub metrics: Arc<dyn Metrics>,
    /// Probe tuning.
    pub config: ProcessConfig,
    /// Start timeouts in a row, shared by every incarnation.
    pub patience: StartPatience,
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

/// The IKE actor's state: the daemon under its watch.
#[derive(Debug)]
pub struct IkeState {
    daemon: ProcessWatch<dyn RunningProcess, IkeMsg>,
}

/// The IKE actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct IkeActor;

impl Actor for IkeActor {
    type Msg = IkeMsg;
    type State = IkeState;
    type Arguments = IkeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<IkeMsg>,
        args: IkeArgs,
    ) -> Result<IkeState, ActorProcessingErr> {
        // Not before the guards (SPEC §4 "Order"). The supervisor starts
        // this actor only once the gate is open; a gate that closed again
        // in between is a failure it retries on its backoff.
        args.gate.check("the IKE daemon")?;
        let watch = WatchArgs {
            name: "ike",
            component: RuntimeComponent::IkeDaemon,
            config: args.config,
            board: args.board,
            metrics: args.metrics,
            exit_poll: || IkeMsg::ExitPoll,
            probe: || IkeMsg::Probe,
            patience: args.patience.clone(),
        };
        let daemon = ProcessWatch::start(watch, &myself, args.port.start()).await?;
        tracing::info!(pid = daemon.pid(), "IKE daemon started");
        Ok(IkeState { daemon })
    }

    async fn post_stop(
        &self,
        _: ActorRef<IkeMsg>,
        state: &mut IkeState,
    ) -> Result<(), ActorProcessingErr> {
        state.daemon.stop().await;
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<IkeMsg>,
        msg: IkeMsg,
        state: &mut IkeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            IkeMsg::Health(reply) => {
                let _ = reply.send((state.daemon.healthy(), state.daemon.pid()));
            }
            IkeMsg::ExitPoll => state.daemon.on_exit_poll().await?,
            IkeMsg::Probe => {
                state.daemon.on_probe().await?;
            }
        }
        Ok(())
    }
}
