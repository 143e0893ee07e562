//! The agent's actor tree as child specs of the node supervisor: the
//! `runtime` crate builds [`AgentTreeArgs`] from its adapters and calls
//! [`start`].
//!
//! Two groups of children, started in this order:
//! - the identity actors ([`identity_child_specs`]): OVSDB writer, renewal
//!   timer, identity. Order matters only at first start: the OVSDB writer
//!   and the renewal timer subscribe to the bus before the identity actor
//!   publishes. Later respawns reconnect through the bus (see `bus`).
//! - the tunnel actors ([`tunnel_child_specs`], passed in
//!   `extra_children`): protection, IKE, monitor, in that order, so the
//!   guards are armed before the IKE daemon starts.

use std::sync::Arc;

use kube_ovn_ipsec_api::status::Reason;
use ractor::ActorRef;
use tokio::sync::watch;

use crate::bus::Bus;
use crate::error::Result;
use crate::gate::ProtectionGate;
use crate::identity::{IdentityActor, IdentityArgs, IdentityConfig};
use crate::ike::{IkeActor, IkeArgs};
use crate::metrics::Metrics;
use crate::monitor::{MonitorActor, MonitorArgs};
use crate::ovsdb_writer::{OvsdbWriter, OvsdbWriterArgs};
use crate::ports::{CsrApi, IkePort, MonitorPort, OvsdbIdentity, ProtectionPort};
use crate::process_watch::{ProcessConfig, StartPatience};
use crate::protection::{ProtectionActor, ProtectionArgs, ProtectionConfig};
use crate::renewal_timer::{RenewalTimer, RenewalTimerArgs};
use crate::status::StatusBoard;
use crate::supervisor::{self, ChildSpec, SupervisorArgs, SupervisorConfig, SupervisorMsg};
use kube_ovn_ipsec_api::clock::Clock;

/// Child names, as they appear in logs, status and the restart metric.
pub mod names {
    /// The OVSDB writer.
    pub const OVSDB_WRITER: &str = "ovsdb-writer";
    /// The renewal timer.
    pub const RENEWAL_TIMER: &str = "renewal-timer";
    /// The identity actor.
    pub const IDENTITY: &str = "identity";
    /// The protection (lease, XFRM guard) actor.
    pub const PROTECTION: &str = "protection";
    /// The IKE daemon actor.
    pub const IKE: &str = "ike";
    /// The monitor actor.
    pub const MONITOR: &str = "monitor";
    /// The node coordinator.
    pub const COORDINATOR: &str = "coordinator";
    /// The datapath (health) actor.
    pub const DATAPATH: &str = "datapath";
}

/// What the datapath actor needs beyond the tree's own arguments.
#[derive(Debug, Clone)]
pub struct DatapathPorts {
    /// Reads the data path.
    pub port: Arc<dyn crate::ports::DatapathPort>,
    /// `ipsec/refresh`.
    pub refresh: crate::datapath::RefreshSignal,
    /// Tuning.
    pub config: crate::datapath::DatapathConfig,
}

/// The datapath actor's child spec (SPEC §10), started after the tunnel
/// actors; it only reads, so nothing waits for it.
pub fn datapath_child_spec(a: &AgentTreeArgs, ports: DatapathPorts) -> ChildSpec {
    let args = crate::datapath::DatapathArgs {
        port: ports.port,
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
        clock: a.clock.clone(),
        refresh: ports.refresh,
        config: ports.config,
    };
    ChildSpec::actor(names::DATAPATH, Reason::DatapathUnmeasured, move || {
        (crate::datapath::DatapathActor, args.clone())
    })
}

/// What the node coordinator needs beyond the tree's own arguments.
#[derive(Debug, Clone)]
pub struct CoordinationPorts {
    /// Who this node is.
    pub me: crate::coordinator::NodeSelf,
    /// The record as the runtime's follower sees it.
    pub record: watch::Receiver<crate::coordinator::plan::RecordView>,
    /// Signs and publishes receipts.
    pub receipts: Arc<dyn crate::coordinator::ReceiptPort>,
    /// Republish an owed receipt this often.
    pub refresh: std::time::Duration,
}

/// The node coordinator's child spec (started after the tunnel actors):
/// it grants [`AgentTreeArgs::permit`] when the record asks this node to
/// arm and publishes its receipts.
pub fn coordinator_child_spec(a: &AgentTreeArgs, ports: CoordinationPorts) -> ChildSpec {
    let args = crate::coordinator::NodeCoordinatorArgs {
        me: ports.me,
        record: ports.record,
        permit: a.permit.clone(),
        port: ports.receipts,
        board: a.board.clone(),
        bus: a.bus.clone(),
        clock: a.clock.clone(),
        key_dir: a.identity.key_dir.clone(),
        refresh: ports.refresh,
    };
    ChildSpec::actor(names::COORDINATOR, Reason::CoordinationInvalid, move || {
        (crate::coordinator::NodeCoordinator, args.clone())
    })
}

/// The adapters of the tunnel actors (protection, IKE, monitor), and their
/// tuning.
#[derive(Debug, Clone)]
pub struct TunnelPorts {
    /// Lease and guards.
    pub protection: Arc<dyn ProtectionPort>,
    /// The IKE daemon.
    pub ike: Arc<dyn IkePort>,
    /// The monitor.
    pub monitor: Arc<dyn MonitorPort>,
    /// Guard read-back period.
    pub protection_config: ProtectionConfig,
    /// Probe tuning of both processes.
    pub process_config: ProcessConfig,
    /// Delay between monitor acknowledgement attempts.
    pub ack_retry: std::time::Duration,
}

/// The child specs of the tunnel actors (protection, IKE, monitor), for
/// [`AgentTreeArgs::extra_children`].
pub fn tunnel_child_specs(a: &AgentTreeArgs, ports: TunnelPorts) -> Vec<ChildSpec> {
    a.gate.require();
    let protection = ProtectionArgs {
        permit: a.permit.clone(),
        gate: a.gate.clone(),
        port: ports.protection,
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
        config: ports.protection_config,
    };
    let ike = IkeArgs {
        gate: a.gate.clone(),
        port: ports.ike.clone(),
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        config: ports.process_config,
        patience: StartPatience::default(),
    };
    let monitor = MonitorArgs {
        gate: a.gate.clone(),
        port: ports.monitor,
        ike: ports.ike,
        ovsdb: a.ovsdb.clone(),
        board: a.board.clone(),
        metrics: a.metrics.clone(),
        bus: a.bus.clone(),
        config: ports.process_config,
        patience: StartPatience::default(),
        ack_retry: ports.ack_retry,
        clock: a.clock.clone(),
    };
    vec![
        ChildSpec::actor(names::PROTECTION, Reason::GuardMissing, move || {
            (ProtectionActor, protection.clone())
        }),
        ChildSpec::actor(names::IKE, Reason::IkeDaemonUnhealthy, move || {
            (IkeActor, ike.clone())
        })
        .after_gate(a.gate.clone()),
        ChildSpec::actor(names::MONITOR, Reason::MonitorUnhealthy, move || {
            (MonitorActor, monitor.clone())
        })
        .after_gate(a.gate.clone()),
    ]
}

/// Everything the `runtime` crate hands the tree.
#[derive(Debug)]
pub struct AgentTreeArgs {
    /// Identity configuration.
    pub identity: IdentityConfig,
    /// Kubernetes CSR API adapter.
    pub csr_api: Arc<dyn CsrApi>,
    /// OVSDB identity-keys adapter.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Metrics.
    pub metrics: Arc<dyn Metrics>,
    /// The status board the HTTP server reads.
    pub board: StatusBoard,
    /// Event ports.
    pub bus: Bus,
    /// The trust bundle as the ConfigMap watcher last saw it.
    pub trust: watch::Receiver<Option<crate::identity::TrustSource>>,
    /// Restart tuning.
    pub supervisor: SupervisorConfig,
    /// Whether the guards are armed: what identity activation, the IKE
    /// daemon and the monitor wait for. [`tunnel_child_specs`] makes it
    /// required; without the tunnel actors nothing waits.
    pub gate: ProtectionGate,
    /// Whether the protection actor may allocate and arm a lease now:
    /// granted from the start without coordination, otherwise by the node
    /// coordinator.
    pub permit: crate::gate::ArmPermit,
    /// Further children, started after the identity actors: the tunnel
    /// actors ([`tunnel_child_specs`]).
    pub extra_children: Vec<ChildSpec>,
}

/// The child specs of the identity actors (OVSDB writer, renewal timer,
/// identity), in start order.
pub fn identity_child_specs(a: &AgentTreeArgs) -> Vec<ChildSpec> {
    let writer = OvsdbWriterArgs {
        gate: a.gate.clone(),
        board: a.board.clone(),
        verify_period: std::time::Duration::from_secs(2),
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

/// Starts the node supervisor with the identity actors plus
/// `extra_children`. The caller stops the returned supervisor on shutdown.
pub async fn start(
    mut args: AgentTreeArgs,
) -> Result<(ActorRef<SupervisorMsg>, ractor::concurrency::JoinHandle<()>)> {
    let mut children = identity_child_specs(&args);
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

#[cfg(test)]
mod tunnel_tests;
