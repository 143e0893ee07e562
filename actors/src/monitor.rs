//! The monitor actor: runs `ovs-monitor-ipsec --no-restart-ike-daemon` as
//! its foreground child through [`MonitorPort`] (probe and restart policy
//! in `process_watch`, as for the IKE daemon), feeds `runtimeHealthy`
//! ([`RuntimeComponent::Monitor`]), and acknowledges activations.
//!
//! Acknowledgement (SPEC §3): the actor listens to the identity actor's
//! `Active` events, which come once OVSDB points at a generation and the
//! key directory records it; on start it gets the identity active now
//! ([`crate::bus::IdentityPort::subscribe_with_current`]), so a restarted
//! monitor acknowledges it again. For each generation not yet acknowledged
//! it reads the identity keys OVSDB points at, has the IKE port install the
//! trust bundle they name ([`IkePort::install_trust`], once per bundle and
//! incarnation), has the monitor and the IKE daemon read back
//! ([`RunningMonitor::acknowledge`], which only reads) and sets
//! `configurationApplied` and the acknowledged trust digest on the board
//! only for a matching read-back. The install comes first, in the same
//! step, because the read-back checks the CAs the daemon loaded. The
//! monitor rewrites the IKE daemon's configuration asynchronously, so a
//! mismatch is retried every `ack_retry` until it matches or a newer
//! generation replaces it.
//!
//! Expiry: IKE_SAs are rekeyed, never reauthenticated, and the monitor
//! keeps established connections across a renewal, so nothing in the IKE
//! daemon ends an IKE_SA when the certificate that authenticated it
//! expires. The actor does: at each probe while the active leaf has
//! expired (the renewal failed past its end, no successor), it has the IKE
//! port end every IKE_SA of the monitor's connections
//! ([`IkePort::end_ike_sas`]). New ones cannot be set up with the expired
//! leaf (peers refuse it), so the node's overlay traffic stays behind the
//! guards while `/status` says `Expired`: closed and loud, never open with
//! a proof of identity that ran out. A valid successor makes the monitor
//! load new connections, which negotiate afresh.

use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::clock::Clock;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::time::Timestamp;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::bus::{Bus, IdentityEvent};
use crate::error::Result;
use crate::gate::ProtectionGate;
use crate::metrics::Metrics;
use crate::ports::{
    Acknowledgement, IkePort, MonitorPort, OvsdbIdentity, OvsdbIdentityKeys, RunningMonitor,
};
use crate::process_watch::{ProcessConfig, ProcessWatch, StartPatience, WatchArgs};
use crate::status::{RuntimeComponent, StatusBoard, timestamp};

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct MonitorArgs {
    /// The guards must be armed before the monitor starts.
    pub gate: ProtectionGate,
    /// Starts the monitor.
    pub port: Arc<dyn MonitorPort>,
    /// Installs the trust bundle for the IKE daemon before a read-back.
    pub ike: Arc<dyn IkePort>,
    /// Reads the identity keys OVSDB points at.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Where `runtimeHealthy` and the acknowledgement go.
    pub board: StatusBoard,
    /// Failure counter.
    pub metrics: Arc<dyn Metrics>,
    /// Event ports (the identity's `Active`).
    pub bus: Bus,
    /// Probe tuning.
    pub config: ProcessConfig,
    /// Start timeouts in a row, shared by every incarnation.
    pub patience: StartPatience,
    /// Delay between acknowledgement attempts while the read-back does not
    /// match yet.
    pub ack_retry: Duration,
    /// Wall clock (the active leaf's expiry is checked against it).
    pub clock: Arc<dyn Clock>,
}

/// Messages of the monitor actor.
#[derive(Debug)]
pub enum MonitorMsg {
    /// Internal: non-blocking exit check.
    ExitPoll,
    /// Internal (and on demand): run the health probe.
    Probe,
    /// OVSDB now points at this generation (expiring at the timestamp):
    /// acknowledge it.
    Activated(u64, Timestamp),
    /// Internal: try the pending acknowledgement again.
    AckRetry,
    /// Health, PID and the generation acknowledged.
    Health(RpcReplyPort<(bool, u32, Option<u64>)>),
}

/// The monitor actor's state.
#[derive(Debug)]
pub struct MonitorState {
    monitor: ProcessWatch<dyn RunningMonitor, MonitorMsg>,
    ike: Arc<dyn IkePort>,
    /// The trust bundle this incarnation installed for the IKE daemon. A
    /// restarted monitor starts with none and installs again, so a CA
    /// directory changed while no monitor ran is put right.
    installed_trust: Option<Sha256Digest>,
    /// A CA left the installed bundle: the connections kept across
    /// renewals are rebuilt once the daemon has the new trust (the
    /// acknowledgement), and until that succeeds.
    rebuild_due: bool,
    ovsdb: Arc<dyn OvsdbIdentity>,
    board: StatusBoard,
    ack_retry: Duration,
    /// The active generation, as the last `Active` event said.
    active: Option<u64>,
    /// When the active generation's leaf expires.
    active_expires: Option<Timestamp>,
    clock: Arc<dyn Clock>,
    /// The generation this incarnation's read-back matched.
    acknowledged: Option<u64>,
    retry_scheduled: bool,
}

impl MonitorState {
    /// The active generation while it still awaits acknowledgement.
    fn pending(&self) -> Option<u64> {
        self.active.filter(|g| self.acknowledged != Some(*g))
    }

    /// Installs the trust bundle `keys` name for the IKE daemon (unless
    /// this incarnation did already), then reads the monitor and the
    /// daemon back.
    async fn read_back(&mut self, keys: &OvsdbIdentityKeys) -> Result<Acknowledgement> {
        if let Some(t) = self.ike.install_trust(keys, self.installed_trust).await? {
            self.installed_trust = Some(t.digest);
            if t.retired > 0 {
                tracing::info!(
                    retired = t.retired,
                    "a CA left the trust bundle: the IKE_SAs kept across renewals will be rebuilt"
                );
                self.rebuild_due = true;
            }
        }
        self.monitor.process().acknowledge(keys).await
    }

    /// Rebuilds the kept connections if a CA was retired and the daemon
    /// has the new trust; tried again at the next acknowledgement or probe
    /// when it fails.
    async fn rebuild_if_due(&mut self) {
        if !self.rebuild_due || self.acknowledged.is_none() || !self.monitor.healthy() {
            return;
        }
        match self.monitor.process().rebuild().await {
            Ok(tunnels) => {
                tracing::info!(
                    ?tunnels,
                    "rebuilt the tunnels kept across renewals, make-before-break, under the current trust"
                );
                self.rebuild_due = false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "rebuilding the tunnels kept across renewals failed; trying again")
            }
        }
    }

    /// Ends the IKE_SAs of the monitor's connections while the active
    /// leaf has expired (see the module docs); tried at every probe, so
    /// one set up since is ended too.
    async fn end_if_expired(&mut self) {
        let Some(expires) = self.active_expires else {
            return;
        };
        if timestamp(self.clock.now()) < expires {
            return;
        }
        match self.ike.end_ike_sas().await {
            Ok(ended) if ended.is_empty() => {}
            Ok(ended) => tracing::warn!(
                generation = ?self.active,
                %expires,
                ?ended,
                "the active certificate expired without a successor: its IKE_SAs ended"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "the active certificate expired: ending its IKE_SAs failed; trying again"
            ),
        }
    }
}

/// The monitor actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonitorActor;

impl MonitorActor {
    /// Reads the pending generation back, if the monitor is healthy and a
    /// generation awaits acknowledgement; schedules a retry on a mismatch.
    async fn try_acknowledge(&self, myself: &ActorRef<MonitorMsg>, state: &mut MonitorState) {
        if !state.monitor.healthy() {
            return;
        }
        let Some(generation) = state.pending() else {
            return;
        };
        let outcome = match state.ovsdb.read().await {
            Ok(keys) => state.read_back(&keys).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ack) if ack.configuration_applied => {
                tracing::info!(generation, trust_digest = ?ack.trust_digest, "monitor acknowledged the active generation");
                state
                    .board
                    .set_acknowledgement(generation, ack.trust_digest);
                state.acknowledged = Some(generation);
                state.rebuild_if_due().await;
                return;
            }
            Ok(ack) => {
                tracing::debug!(generation, mismatches = ?ack.mismatches, "monitor read-back does not match yet");
                state.board.set_acknowledgement(generation, None);
            }
            Err(e) => {
                tracing::debug!(generation, error = %e, "monitor read-back failed");
                state.board.set_acknowledgement(generation, None);
            }
        }
        if !state.retry_scheduled {
            state.retry_scheduled = true;
            myself.send_after(state.ack_retry, || MonitorMsg::AckRetry);
        }
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
        // Not before the guards (SPEC §4 "Order"). The supervisor starts
        // this actor only once the gate is open; a gate that closed again
        // in between is a failure it retries on its backoff.
        args.gate.check("the monitor")?;
        // From the identity active now: a restarted monitor acknowledges
        // it again.
        args.bus
            .identity
            .subscribe_with_current(myself.clone(), |e| match e {
                IdentityEvent::Active(a) => Some(MonitorMsg::Activated(
                    a.generation,
                    a.certificate.not_after(),
                )),
                _ => None,
            });
        let watch = WatchArgs {
            name: "monitor",
            component: RuntimeComponent::Monitor,
            config: args.config,
            board: args.board.clone(),
            metrics: args.metrics,
            exit_poll: || MonitorMsg::ExitPoll,
            probe: || MonitorMsg::Probe,
            patience: args.patience.clone(),
        };
        let monitor = ProcessWatch::start(watch, &myself, args.port.start()).await?;
        tracing::info!(pid = monitor.pid(), "ovs-monitor-ipsec started");
        Ok(MonitorState {
            monitor,
            ike: args.ike,
            installed_trust: None,
            rebuild_due: false,
            ovsdb: args.ovsdb,
            board: args.board,
            ack_retry: args.ack_retry,
            active: None,
            active_expires: None,
            clock: args.clock,
            acknowledged: None,
            retry_scheduled: false,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<MonitorMsg>,
        state: &mut MonitorState,
    ) -> Result<(), ActorProcessingErr> {
        state.monitor.stop().await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<MonitorMsg>,
        msg: MonitorMsg,
        state: &mut MonitorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            MonitorMsg::Health(reply) => {
                let acked = state.acknowledged.filter(|g| state.active == Some(*g));
                let _ = reply.send((state.monitor.healthy(), state.monitor.pid(), acked));
            }
            MonitorMsg::Activated(generation, expires) => {
                state.active = Some(generation);
                state.active_expires = Some(expires);
                self.try_acknowledge(&myself, state).await;
            }
            MonitorMsg::AckRetry => {
                state.retry_scheduled = false;
                self.try_acknowledge(&myself, state).await;
            }
            MonitorMsg::ExitPoll => state.monitor.on_exit_poll().await?,
            MonitorMsg::Probe => {
                if state.monitor.on_probe().await? {
                    // What became active while the monitor was not (yet)
                    // healthy is acknowledged now.
                    self.try_acknowledge(&myself, state).await;
                }
                state.rebuild_if_due().await;
                state.end_if_expired().await;
            }
        }
        Ok(())
    }
}
