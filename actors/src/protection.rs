//! The protection actor (SPEC §4): obtains the node's lease, arms the XFRM
//! guards and reads them back, publishes the lease in OVSDB, and keeps
//! reading the guards back every `readback_period` (and on demand).
//!
//! Nothing is allocated or armed before the arm permit
//! ([`crate::gate::ArmPermit`]): the cluster's coordination asks the node
//! to arm at `Arm` (SPEC §7). A node that already holds a lease (a restart
//! of an armed node) arms it at once, whatever the permit says.
//!
//! Order: lease → guards armed and read back → publication. The patched
//! ovn-controller marks tunnel traffic only once the lease is published, so
//! by then every marked packet already meets a guard. `protectionArmed` is
//! set only after a read-back in which every guard matched. A re-added
//! guard or a conflicting policy is logged, counted
//! ([`Metrics::guard_event`]), shown as a reason and published on the bus
//! (the `runtime` crate raises a Kubernetes Event); a conflicting policy is
//! never overwritten. Nothing here removes a guard: not on stop, not on
//! failure (the guards outlive the agent; only cleanup withdraws them).
//!
//! Every `observe_period` the actor also has the kernel's SAs and policies
//! attributed to the lease and the observation recorded in the key
//! directory (SPEC §3). An observation that fails is logged and retried
//! next period: it is evidence for cleanup, not a condition of protection.

use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::status::Reason;
use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::bus::{Bus, ProtectionEvent};
use crate::error::Error;
use crate::gate::{ArmPermit, ProtectionGate};
use crate::metrics::Metrics;
use crate::ports::{GuardChange, GuardReadback, LeaseSummary, ProtectionPort};
use crate::status::StatusBoard;

/// Tuning of the protection actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtectionConfig {
    /// Between guard read-backs.
    pub readback_period: Duration,
    /// Between SA observation passes (a full XFRM dump each: slower than
    /// the read-back by index, so less often).
    pub observe_period: Duration,
}

impl Default for ProtectionConfig {
    fn default() -> Self {
        Self {
            // Half of what /readyz accepts (`status::MAX_READBACK_AGE`),
            // so a healthy actor is never stale; two GETPOLICY by index
            // cost microseconds (docs/performance.md).
            readback_period: Duration::from_millis(500),
            observe_period: Duration::from_secs(30),
        }
    }
}

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct ProtectionArgs {
    /// Whether a lease may be allocated and armed now (coordination `Arm`,
    /// or no coordination). A persisted lease is armed regardless.
    pub permit: ArmPermit,
    /// Opened after each evaluation that found the guards armed and the
    /// lease published; closed otherwise.
    pub gate: ProtectionGate,
    /// Lease, guards, publication.
    pub port: Arc<dyn ProtectionPort>,
    /// Where `protectionArmed` goes.
    pub board: StatusBoard,
    /// Guard event counter.
    pub metrics: Arc<dyn Metrics>,
    /// Where re-added guards and conflicts are published.
    pub bus: Bus,
    /// Tuning.
    pub config: ProtectionConfig,
}

/// Messages of the protection actor.
#[derive(Debug)]
pub enum ProtectionMsg {
    /// Read the guards back now (the periodic tick, or on demand).
    Evaluate,
    /// Read the guards back now and answer whether protection is armed.
    Readback(RpcReplyPort<bool>),
    /// Attribute and record the kernel's SAs now (the periodic tick).
    Observe,
    /// Internal: the arm permit was granted; allocate and arm now.
    Arm,
}

/// The protection actor's state.
#[derive(Debug)]
pub struct ProtectionState {
    args: ProtectionArgs,
    /// `None` while the node waits for the arm permit and holds no lease.
    lease: Option<LeaseSummary>,
    published: bool,
    /// The last read-back found a conflict (published once per conflict).
    in_conflict: bool,
    tickers: Vec<JoinHandle<()>>,
}

/// The protection actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProtectionActor;

/// Logs, counts and publishes what an evaluation changed; returns the
/// reason to show, if any. `was_in_conflict`: a conflict was already
/// published and is not published again while it lasts.
fn report(
    metrics: &dyn Metrics,
    bus: &Bus,
    changes: &[GuardChange],
    was_in_conflict: bool,
) -> Option<Reason> {
    let mut problem = None;
    for c in changes {
        metrics.guard_event(c.kind());
        match c {
            GuardChange::Readded { .. } => bus
                .protection
                .send(ProtectionEvent::GuardReadded(c.clone())),
            GuardChange::Conflict { .. } if !was_in_conflict => bus
                .protection
                .send(ProtectionEvent::GuardConflict(c.clone())),
            _ => {}
        }
        match c {
            GuardChange::Armed { family, index } => {
                tracing::info!(%family, index, "guard armed");
            }
            GuardChange::Adopted { family, new_index } => {
                tracing::info!(%family, index = new_index, "identical guard adopted");
            }
            GuardChange::Readded {
                family,
                old_index,
                new_index,
            } => {
                tracing::warn!(%family, old_index, new_index, "guard had vanished from the kernel; re-added");
            }
            GuardChange::Conflict {
                family,
                index,
                detail,
            } => {
                tracing::error!(%family, index, %detail, "a foreign policy occupies the guard's place; not overwritten, protection not armed");
                problem = Some(Reason::GuardConflict);
            }
        }
    }
    problem
}

async fn evaluate(state: &mut ProtectionState) -> Result<bool, ActorProcessingErr> {
    let Some(lease) = state.lease.clone() else {
        // Waiting for the permit: nothing to read back, nothing armed.
        return Ok(false);
    };
    let readback: GuardReadback = match state.args.port.evaluate_guards().await {
        Ok(r) => r,
        Err(e) => {
            state
                .args
                .board
                .set_protection(false, Some(Reason::GuardMissing));
            state.args.gate.set_armed(false);
            return Err(Box::new(e));
        }
    };
    let problem = report(
        state.args.metrics.as_ref(),
        &state.args.bus,
        &readback.changes,
        state.in_conflict,
    );
    state.in_conflict = problem == Some(Reason::GuardConflict);
    state.args.board.set_protection(
        readback.armed,
        problem.or((!readback.armed).then_some(Reason::GuardMissing)),
    );
    if readback.armed {
        // Every read-back also checks the publication (one OVSDB read) and
        // writes back what someone removed or changed.
        let drifted = match state.args.port.publish_lease().await {
            Ok(d) => d,
            Err(e) => {
                // OVSDB unreachable (an ovsdb-server restart) or the write
                // refused: not armed until the publication is confirmed,
                // and tried again at the next read-back. Failing the actor
                // instead put each outage under the supervisor's backoff,
                // up to 30 s not ready after OVSDB was back.
                tracing::warn!(error = %e, "publishing the lease in OVSDB failed; not armed, retried at the next read-back");
                state.args.gate.set_armed(false);
                // OVSDB down (or its row gone) is its own reason: the
                // drift hint would send the operator looking for someone
                // editing keys.
                let reason = match &e {
                    Error::Protection { reason, .. } if *reason != Reason::GuardMissing => *reason,
                    _ => Reason::OvsdbUnavailable,
                };
                state.args.board.set_protection(false, Some(reason));
                return Ok(false);
            }
        };
        if !state.published {
            state.published = true;
            tracing::info!(lease_id = %lease.lease_id, mark = lease.mark, reqid = lease.reqid, "lease published in OVSDB external_ids");
        } else if !drifted.is_empty() {
            tracing::warn!(keys = ?drifted, advice = Reason::OvsdbDrift.message(), "the published lease had drifted in OVSDB external_ids; restored");
            state.args.metrics.ovsdb_drift("lease");
            state
                .args
                .bus
                .protection
                .send(ProtectionEvent::OvsdbDriftRestored {
                    what: "lease",
                    keys: drifted,
                });
        }
    }
    state.args.gate.set_armed(readback.armed && state.published);
    Ok(readback.armed)
}

/// One SA observation pass; failures are logged, never fatal.
async fn observe(state: &ProtectionState) {
    if state.lease.is_none() {
        return;
    }
    match state.args.port.observe_sas().await {
        Ok(s) if s.recorded => tracing::info!(
            tunnels = s.tunnels,
            sas = s.sas,
            policies = s.policies,
            "SA observation recorded in the key directory"
        ),
        Ok(s) => tracing::debug!(
            tunnels = s.tunnels,
            sas = s.sas,
            policies = s.policies,
            "SA observation unchanged"
        ),
        Err(e) => tracing::warn!(error = %e, "SA observation failed; retried next period"),
    }
}

/// The node's lease (allocated only when `allocate`); a refusal is shown
/// with its reason and fails the incarnation (the supervisor retries).
async fn obtain(
    args: &ProtectionArgs,
    allocate: bool,
) -> Result<Option<LeaseSummary>, ActorProcessingErr> {
    match args.port.obtain_lease(allocate).await {
        Ok(l) => Ok(l),
        Err(e) => {
            let reason = match &e {
                Error::Protection { reason, .. } => *reason,
                _ => Reason::GuardMissing,
            };
            args.board.set_protection(false, Some(reason));
            args.gate.set_armed(false);
            tracing::error!(error = %e, "no output-protection lease; identity activation, the IKE daemon and the monitor wait");
            Err(Box::new(e))
        }
    }
}

/// Arms `lease`'s guards, reads them back, publishes the lease and starts
/// the periodic read-back and SA observation.
async fn arm(
    myself: &ActorRef<ProtectionMsg>,
    state: &mut ProtectionState,
    lease: LeaseSummary,
) -> Result<(), ActorProcessingErr> {
    tracing::info!(lease_id = %lease.lease_id, mark = lease.mark, reqid = lease.reqid, allocated = lease.allocated, "output-protection lease");
    state.args.board.set_lease(Some(lease.clone()));
    state.lease = Some(lease);
    let armed = evaluate(state).await?;
    if !armed {
        tracing::warn!("guards not armed after arming; retrying every read-back period");
    }
    let config = state.args.config;
    state.tickers.extend([
        myself.send_interval(config.readback_period, || ProtectionMsg::Evaluate),
        myself.send_interval(config.observe_period, || ProtectionMsg::Observe),
    ]);
    // The first observation right after arming, not a period later.
    myself.send_message(ProtectionMsg::Observe)?;
    Ok(())
}

impl Actor for ProtectionActor {
    type Msg = ProtectionMsg;
    type State = ProtectionState;
    type Arguments = ProtectionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ProtectionMsg>,
        args: ProtectionArgs,
    ) -> Result<ProtectionState, ActorProcessingErr> {
        let allocate = args.permit.is_granted();
        let lease = obtain(&args, allocate).await?;
        let mut state = ProtectionState {
            args,
            lease: None,
            published: false,
            in_conflict: false,
            tickers: Vec::new(),
        };
        match lease {
            Some(lease) => arm(&myself, &mut state, lease).await?,
            None => {
                // No lease of this node yet and the cluster has not asked
                // it to arm (SPEC §7 `Prepare`): nothing is allocated,
                // published or armed until the permit comes.
                tracing::info!("output protection waits for the coordination to arm this node");
                state
                    .args
                    .board
                    .set_protection(false, Some(Reason::WaitingForCoordination));
                state.args.gate.set_armed(false);
                let permit = state.args.permit.clone();
                let me = myself.clone();
                state.tickers.push(tokio::spawn(async move {
                    permit.wait().await;
                    let _ = me.cast(ProtectionMsg::Arm);
                }));
            }
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        _: ActorRef<ProtectionMsg>,
        state: &mut ProtectionState,
    ) -> Result<(), ActorProcessingErr> {
        // Deliberately nothing else: the guards stay.
        for h in state.tickers.drain(..) {
            h.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ProtectionMsg>,
        msg: ProtectionMsg,
        state: &mut ProtectionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ProtectionMsg::Evaluate => {
                evaluate(state).await?;
            }
            ProtectionMsg::Readback(reply) => {
                let armed = evaluate(state).await?;
                let _ = reply.send(armed);
            }
            ProtectionMsg::Observe => observe(state).await,
            ProtectionMsg::Arm => {
                if state.lease.is_none()
                    && let Some(lease) = obtain(&state.args, true).await?
                {
                    arm(&myself, state, lease).await?;
                }
            }
        }
        Ok(())
    }
}
