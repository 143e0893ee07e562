//! The OVSDB writer: the only writer of the identity keys
//! `other_config:private_key`, `certificate` and `ca_cert`. It activates an
//! identity generation with one guarded transaction that sets the three
//! together, other keys untouched (through [`OvsdbIdentity`]), and publishes
//! `Activated{generation}` only after the commit is confirmed.
//!
//! One activation is one [`OvsdbIdentity::activate`] call and no loop here:
//! the adapter's guarded write already re-reads and retries a lost guard, a
//! bounded number of times, in one place (the `ovsdb` crate's `MapWriter`).
//! A second loop around it would only multiply that bound. An activation
//! that still fails is reported as `Failed`; OVSDB then keeps the previous
//! generation.
//!
//! Activation is idempotent: when OVSDB already points at the generation
//! (a restart after a commit whose confirmation was lost) it is confirmed
//! without writing anything.
//!
//! It also keeps what it wrote: every `verify_period` it reads the three
//! keys back and, when someone removed or changed them (`ovs-vsctl`, a
//! replaced `conf.db`), writes the active generation again — not ready
//! (`OvsdbDrift`) until that succeeds, counted, and published on the bus
//! for a Kubernetes Event.
//!
//! No activation before the guards (SPEC §4 "Order"): while the
//! [`ProtectionGate`] is closed the latest request waits (a newer one
//! replaces it) and runs when the gate opens.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::bus::{ActivationEvent, ActivationRequest, Bus, IdentityEvent};
use crate::gate::ProtectionGate;
use crate::metrics::Metrics;
use crate::ports::{OvsdbIdentity, OvsdbIdentityKeys};
use crate::status::StatusBoard;

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct OvsdbWriterArgs {
    /// What activations wait for.
    pub gate: ProtectionGate,
    /// Where a drift shows (`/readyz`).
    pub board: StatusBoard,
    /// How often the active generation's keys are read back.
    pub verify_period: std::time::Duration,
    /// OVSDB.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Metrics (activation latency).
    pub metrics: Arc<dyn Metrics>,
    /// Event ports.
    pub bus: Bus,
}

/// Messages of the OVSDB writer.
#[derive(Debug)]
pub enum OvsdbWriterMsg {
    /// Point OVSDB at this generation.
    Activate(ActivationRequest),
    /// Internal: the protection gate opened.
    GateOpened,
    /// Internal: read the keys back and restore them if they drifted.
    Verify,
}

/// The writer's state.
pub struct OvsdbWriterState {
    args: OvsdbWriterArgs,
    /// The request waiting for the gate, if any.
    deferred: Option<ActivationRequest>,
    /// The last generation OVSDB was confirmed to point at.
    active: Option<ActivationRequest>,
    /// The verification tick, stopped with the actor.
    ticker: ractor::concurrency::JoinHandle<()>,
}

/// The OVSDB writer actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct OvsdbWriter;

impl Actor for OvsdbWriter {
    type Msg = OvsdbWriterMsg;
    type State = OvsdbWriterState;
    type Arguments = OvsdbWriterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<OvsdbWriterMsg>,
        args: OvsdbWriterArgs,
    ) -> Result<OvsdbWriterState, ActorProcessingErr> {
        args.bus.identity.subscribe(myself.clone(), |e| match e {
            IdentityEvent::Ready(r) => Some(OvsdbWriterMsg::Activate(r)),
            _ => None,
        });
        let ticker = myself.send_interval(args.verify_period, || OvsdbWriterMsg::Verify);
        // A respawned writer: the identity actor asks again now for what it
        // is waiting on, instead of at its watchdog's next turn (up to 30 s).
        args.bus.activation.send(ActivationEvent::WriterStarted);
        Ok(OvsdbWriterState {
            args,
            deferred: None,
            active: None,
            ticker,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<OvsdbWriterMsg>,
        state: &mut OvsdbWriterState,
    ) -> Result<(), ActorProcessingErr> {
        state.ticker.abort();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<OvsdbWriterMsg>,
        msg: OvsdbWriterMsg,
        state: &mut OvsdbWriterState,
    ) -> Result<(), ActorProcessingErr> {
        let req = match msg {
            OvsdbWriterMsg::Activate(req) => req,
            OvsdbWriterMsg::GateOpened => match state.deferred.take() {
                Some(req) => req,
                None => return Ok(()),
            },
            OvsdbWriterMsg::Verify => {
                verify(state).await;
                return Ok(());
            }
        };
        if !state.args.gate.is_open() {
            tracing::info!(
                generation = req.generation,
                "activation waits for the output-protection guards"
            );
            if state.deferred.replace(req).is_none() {
                let gate = state.args.gate.clone();
                tokio::spawn(async move {
                    gate.opened().await;
                    // The writer may be gone by then; its successor gets
                    // the request again from the identity actor.
                    let _ = myself.send_message(OvsdbWriterMsg::GateOpened);
                });
            }
            return Ok(());
        }
        let start = Instant::now();
        let want = OvsdbIdentityKeys::from_paths(&req.paths);
        let generation = req.generation;
        match state.args.ovsdb.activate(&want).await {
            Ok(()) => {
                state
                    .args
                    .metrics
                    .activation_latency(start.elapsed().as_secs_f64());
                tracing::info!(generation, "OVSDB points at generation");
                state.active = Some(req.clone());
                state
                    .args
                    .bus
                    .activation
                    .send(ActivationEvent::Activated { generation });
            }
            Err(e) => {
                tracing::warn!(generation, error = %e, "activation failed; OVSDB keeps the previous generation");
                state.args.bus.activation.send(ActivationEvent::Failed {
                    generation,
                    reason: e.metric_label().to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Reads the active generation's keys back; writes them again when they
/// drifted.
async fn verify(state: &mut OvsdbWriterState) {
    let Some(req) = &state.active else {
        return;
    };
    let want = OvsdbIdentityKeys::from_paths(&req.paths);
    let have = match state.args.ovsdb.read().await {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "reading the identity keys back");
            return;
        }
    };
    if have == want {
        return;
    }
    let keys: Vec<String> = [
        ("private_key", &have.private_key, &want.private_key),
        ("certificate", &have.certificate, &want.certificate),
        ("ca_cert", &have.ca_cert, &want.ca_cert),
    ]
    .into_iter()
    .filter(|(_, h, w)| h != w)
    .map(|(k, _, _)| k.to_owned())
    .collect();
    state.args.board.set_ovsdb_drift(true);
    tracing::warn!(generation = req.generation, keys = ?keys, "the identity keys in OVSDB other_config had drifted; restoring");
    match state.args.ovsdb.activate(&want).await {
        Ok(()) => {
            state.args.board.set_ovsdb_drift(false);
            state.args.metrics.ovsdb_drift("identity");
            state
                .args
                .bus
                .protection
                .send(crate::bus::ProtectionEvent::OvsdbDriftRestored {
                    what: "identity",
                    keys,
                });
            tracing::info!(
                generation = req.generation,
                "identity keys restored in OVSDB"
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "restoring the identity keys failed; retrying next period");
        }
    }
}
