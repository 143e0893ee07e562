//! The OVSDB writer: activates an identity generation with one guarded
//! transaction that sets `other_config:private_key`, `certificate` and
//! `ca_cert` together, other keys untouched (through [`OvsdbIdentity`]),
//! and publishes `Activated{generation}` only after the commit is confirmed.
//!
//! Activation is idempotent: when OVSDB already points at the generation
//! (a restart after a commit whose confirmation was lost) it is confirmed
//! without a transaction. A guard conflict (someone changed the keys between
//! read and write) re-reads and tries again, a bounded number of times.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::bus::{ActivationEvent, ActivationRequest, Bus, IdentityEvent};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::ports::{OvsdbIdentity, OvsdbIdentityKeys};

/// Guard conflicts tolerated per activation before reporting failure.
const MAX_CONFLICTS: usize = 3;

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct OvsdbWriterArgs {
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
}

/// The writer's state.
pub struct OvsdbWriterState {
    args: OvsdbWriterArgs,
}

/// The OVSDB writer actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct OvsdbWriter;

async fn activate(ovsdb: &dyn OvsdbIdentity, want: &OvsdbIdentityKeys) -> Result<bool> {
    for _ in 0..MAX_CONFLICTS {
        let current = ovsdb.read().await?;
        if &current == want {
            return Ok(false);
        }
        match ovsdb.activate(&current, want).await {
            Ok(()) => return Ok(true),
            Err(Error::ActivationConflict) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::ActivationConflict)
}

impl Actor for OvsdbWriter {
    type Msg = OvsdbWriterMsg;
    type State = OvsdbWriterState;
    type Arguments = OvsdbWriterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<OvsdbWriterMsg>,
        args: OvsdbWriterArgs,
    ) -> Result<OvsdbWriterState, ActorProcessingErr> {
        args.bus.identity.subscribe(myself, |e| match e {
            IdentityEvent::Ready(r) => Some(OvsdbWriterMsg::Activate(r)),
            _ => None,
        });
        Ok(OvsdbWriterState { args })
    }

    async fn handle(
        &self,
        _: ActorRef<OvsdbWriterMsg>,
        msg: OvsdbWriterMsg,
        state: &mut OvsdbWriterState,
    ) -> Result<(), ActorProcessingErr> {
        let OvsdbWriterMsg::Activate(req) = msg;
        let start = Instant::now();
        let want = OvsdbIdentityKeys::from_paths(&req.paths);
        let generation = req.generation;
        match activate(state.args.ovsdb.as_ref(), &want).await {
            Ok(wrote) => {
                state
                    .args
                    .metrics
                    .activation_latency(start.elapsed().as_secs_f64());
                tracing::info!(generation, wrote, "OVSDB points at generation");
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
