//! The agent's actor tree as child specs of the node supervisor: the
//! runtime builds [`AgentTreeArgs`] from its adapters and calls [`start`].
//!
//! Order matters only at first start: the OVSDB writer and the renewal timer
//! subscribe to the bus before the identity actor publishes. Later respawns
//! reconnect through the bus (see `bus`). The IKE, monitor and XFRM-guard
//! actors of the next issue are passed in `extra_children`.

use std::sync::Arc;

use kube_ovn_ipsec_api::status::Reason;
use ractor::ActorRef;
use tokio::sync::watch;

use crate::bus::Bus;
use crate::clock::WallClock;
use crate::error::Result;
use crate::identity::{IdentityActor, IdentityArgs, IdentityConfig};
use crate::metrics::Metrics;
use crate::ovsdb_writer::{OvsdbWriter, OvsdbWriterArgs};
use crate::ports::{CsrApi, OvsdbIdentity};
use crate::renewal_timer::{RenewalTimer, RenewalTimerArgs};
use crate::status::StatusBoard;
use crate::supervisor::{self, ChildSpec, SupervisorArgs, SupervisorConfig, SupervisorMsg};

/// Child names, as they appear in logs, status and the restart metric.
pub mod names {
    /// The OVSDB writer.
    pub const OVSDB_WRITER: &str = "ovsdb-writer";
    /// The renewal timer.
    pub const RENEWAL_TIMER: &str = "renewal-timer";
    /// The identity actor.
    pub const IDENTITY: &str = "identity";
}

/// Everything the runtime hands the tree.
#[derive(Debug)]
pub struct AgentTreeArgs {
    /// Identity configuration.
    pub identity: IdentityConfig,
    /// Kubernetes CSR API adapter.
    pub csr_api: Arc<dyn CsrApi>,
    /// OVSDB identity-keys adapter.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Wall clock.
    pub clock: Arc<dyn WallClock>,
    /// Metrics.
    pub metrics: Arc<dyn Metrics>,
    /// The status board the HTTP server reads.
    pub board: StatusBoard,
    /// Event ports.
    pub bus: Bus,
    /// The trust bundle as the ConfigMap watcher last saw it.
    pub trust: watch::Receiver<Option<Vec<u8>>>,
    /// Restart tuning.
    pub supervisor: SupervisorConfig,
    /// Further children (IKE, monitor, XFRM guard), started after these.
    pub extra_children: Vec<ChildSpec>,
}

/// The child specs of this actors.
pub fn child_specs(a: &AgentTreeArgs) -> Vec<ChildSpec> {
    let writer = OvsdbWriterArgs {
        ovsdb: a.ovsdb.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
    };
    let timer = RenewalTimerArgs {
        node_uid: a.identity.node_uid.clone(),
        clock: a.clock.clone(),
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
    };
    let identity = IdentityArgs {
        config: a.identity.clone(),
        csr_api: a.csr_api.clone(),
        ovsdb: a.ovsdb.clone(),
        clock: a.clock.clone(),
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
        trust: a.trust.clone(),
    };
    vec![
        ChildSpec::actor(names::OVSDB_WRITER, Reason::OvsdbUnavailable, move || {
            (OvsdbWriter, writer.clone())
        }),
        ChildSpec::actor(names::RENEWAL_TIMER, Reason::RenewalFailing, move || {
            (RenewalTimer, timer.clone())
        }),
        ChildSpec::actor(names::IDENTITY, Reason::RenewalFailing, move || {
            (IdentityActor, identity.clone())
        }),
    ]
}

/// Starts the node supervisor with this actors plus
/// `extra_children`. The caller stops the returned supervisor on shutdown.
pub async fn start(
    mut args: AgentTreeArgs,
) -> Result<(ActorRef<SupervisorMsg>, ractor::concurrency::JoinHandle<()>)> {
    let mut children = child_specs(&args);
    children.append(&mut args.extra_children);
    supervisor::start(SupervisorArgs {
        children,
        board: args.board.clone(),
        metrics: args.metrics.clone(),
        config: args.supervisor,
    })
    .await
}

#[cfg(test)]
mod tests;
