//! Start-up order and shutdown of `kube-ovn-ipsec run`.
//!
//! Order: the key directory's owner lock, Kubernetes client, OVSDB, who
//! this node is (chassis from OVSDB,
//! Node UID from the API), status server, **capability gate**, trust
//! follower, actor tree (identity actors, then protection, IKE daemon,
//! monitor). The status server comes up before the tree so a node stuck
//! early (no chassis yet, CSR denied) is visible through `/status` instead
//! of a crash loop.
//!
//! The capability gate (SPEC §4) runs before any actor that creates a key,
//! a CSR or a lease. On failure the agent keeps serving `/status` (phase
//! `CapabilityMissing`) and a failing `/readyz` for
//! `--capability-exit-delay` seconds (SIGTERM ends it), then exits with
//! [`crate::capability::CAPABILITY_MISSING_EXIT_CODE`] (docs/decisions.md).

use std::sync::Arc;
use std::time::Duration;

use actors::bus::Bus;
use actors::coordinator::ReceiptPort;
use actors::identity::IdentityConfig;
use actors::metrics::PrometheusMetrics;
use actors::ports::{CsrApi, IkePort, MonitorPort, OvsdbIdentity, ProtectionPort};
use actors::status::StatusBoard;
use actors::supervisor::SupervisorConfig;
use actors::supervisor::SupervisorMsg;
use actors::tree::{self, AgentTreeArgs};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock};
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::names::ovs;
use ovsdb::MapColumn;
use prometheus_client::registry::Registry;
use ractor::ActorRef;
use tokio::sync::watch;

use actors::process_watch::ProcessConfig;
use actors::protection::ProtectionConfig;
use actors::tree::TunnelPorts;

use actors::coordinator::NodeSelf;
use actors::coordinator::plan::RecordView;
use actors::tree::CoordinationPorts;
use kube_ovn_ipsec_api::names::k8s;

use super::config::{CoordinationMode, IkeDaemonKind, KeyAlgorithm, NodeArgs, RunArgs};
use super::coordination::{self, KubeReceipts};
use super::events::{EventForwarder, ForwarderArgs, NodeEvents};
use super::http;
use super::kube_csr::KubeCsrApi;
use super::ovsdb_identity::OvsdbIdentityAdapter;
use super::ports::{DatapathReaders, IkeAdapter, MonitorAdapter, ProtectionAdapter, TunnelMtu};
use super::trust;
use super::unixctl;
use crate::capability::{self, CapabilityConfig};
use crate::ike::IkeConfig;
use crate::lease::AllocationConfig;
use crate::monitor::MonitorConfig;
use crate::monitor_patch;
use crate::process::Launcher;
use xfrm::XfrmHandle;

/// Why the agent could not start (after start-up, failures are the
/// supervisor's and show in `/status`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No usable Kubernetes client configuration.
    #[error("kubernetes client: {0}")]
    KubeConfig(String),
    /// The Kubernetes API refused or failed a start-up read.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The local Open_vSwitch database is unreachable.
    #[error("OVSDB {remote}: {source}")]
    Ovsdb {
        /// The remote tried.
        remote: String,
        /// Why.
        source: ovsdb::Error,
    },
    /// `external_ids:system-id` never appeared (ovn-controller / OVS not
    /// initialised on this node).
    #[error(
        "no chassis: Open_vSwitch external_ids:system-id is not set after {0:?}; is OVS initialised on this node?"
    )]
    NoChassis(Duration),
    /// A name or UID did not pass the contract's checks.
    #[error("invalid {what}: {source}")]
    Invalid {
        /// Which value.
        what: &'static str,
        /// Why.
        source: kube_ovn_ipsec_api::Error,
    },
    /// The Node object has no UID.
    #[error("Node {0} has no metadata.uid")]
    NodeWithoutUid(String),
    /// The status address could not be bound.
    #[error("status server on {addr}: {source}")]
    Http {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The actor tree failed to start.
    #[error("actor tree: {0}")]
    Tree(#[from] actors::Error),
    /// The capability gate failed: exit with
    /// [`crate::capability::CAPABILITY_MISSING_EXIT_CODE`].
    #[error("{0}")]
    CapabilityMissing(crate::Error),
    /// A configured choice this build does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The rekeying flags leave no time to rekey before a lifetime ends.
    #[error("rekeying flags: {0}; nothing on this node was touched")]
    Rekeying(kube_ovn_ipsec_api::rekeying::RekeyingError),
    /// A runtime adapter could not be set up (monitor script, XFRM socket).
    #[error("runtime: {0}")]
    Runtime(crate::Error),
    /// The key directory's owner lock could not be taken (another agent
    /// holds it: its PID is in the message), or the directory is unusable.
    #[error("{0}; nothing on this node was touched")]
    Owner(actors::Error),
    /// Another agent or cleanup holds this node (whatever its key
    /// directory), or the claim could not be made.
    #[error("{0}; nothing on this node was touched")]
    NodeClaimed(crate::node_claim::ClaimError),
}

impl AgentError {
    /// The process exit code: the contract's distinct code for a failed
    /// capability gate, 1 for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            AgentError::CapabilityMissing(_) => crate::capability::CAPABILITY_MISSING_EXIT_CODE,
            _ => 1,
        }
    }
}

/// A started agent.
#[derive(Debug)]
pub struct Agent {
    /// The status board (what `/status` serves).
    pub board: StatusBoard,
    /// The bound status address.
    pub status_addr: std::net::SocketAddr,
}

/// The Kubernetes client: `--kubeconfig`, or the in-cluster ServiceAccount,
/// loaded so that no failure quotes a credential ([`crate::k8s_client`]).
pub async fn kube_client(args: &NodeArgs) -> Result<Client, AgentError> {
    crate::k8s_client::client(args.kubeconfig.as_deref())
        .await
        .map_err(AgentError::KubeConfig)
}

async fn chassis(
    client: &ovsdb::Client,
    timeout: Duration,
) -> Result<(Chassis, uuid::Uuid), AgentError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client.read_map(&MapColumn::ovs_external_ids()).await {
            Ok(snap) => {
                if let Some(why) = unsupported_encap(
                    snap.entries
                        .get(ovs::EXTERNAL_ID_ENCAP_TYPE)
                        .map(String::as_str),
                ) {
                    return Err(AgentError::Unsupported(why));
                }
                if let Some(id) = snap.entries.get(ovs::EXTERNAL_ID_SYSTEM_ID) {
                    let chassis =
                        Chassis::new(id.clone()).map_err(|source| AgentError::Invalid {
                            what: "chassis (external_ids:system-id)",
                            source,
                        })?;
                    return Ok((chassis, snap.row));
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading external_ids:system-id"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(AgentError::NoChassis(timeout));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Why this node's tunnel type cannot be encrypted, if it cannot: OVN
/// encrypts Geneve and VXLAN tunnels only, and Linux has no STT datapath
/// (the chart refuses `stt` at render; this is the same refusal on a node
/// whose OVSDB says it, e.g. a chart rendered without the tunnel type).
fn unsupported_encap(encap_type: Option<&str>) -> Option<String> {
    let encap = encap_type?;
    encap
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case("stt"))
        .then(|| {
            format!(
                "external_ids:{}=\"{encap}\": OVN encrypts only geneve and vxlan tunnels, and \
                 Linux has no STT datapath; set Kube-OVN's TUNNEL_TYPE to geneve or vxlan, or \
                 run without IPsec; nothing on this node was touched",
                ovs::EXTERNAL_ID_ENCAP_TYPE
            )
        })
}

/// The running ovn-controller's control socket from its pidfile:
/// `<pidfile dir>/ovn-controller.<pid>.ctl`. Without a readable pidfile the
/// pidfile's own path is returned, so the probe fails naming it.
fn discover_ctl(pidfile: &std::path::Path) -> std::ffi::OsString {
    match std::fs::read_to_string(pidfile) {
        Ok(pid) if pid.trim().parse::<u32>().is_ok() => pidfile
            .with_file_name(format!("ovn-controller.{}.ctl", pid.trim()))
            .into_os_string(),
        _ => {
            tracing::warn!(pidfile = %pidfile.display(), "no readable ovn-controller pidfile");
            pidfile.as_os_str().to_owned()
        }
    }
}

/// The adapters the actors get: what [`Seams::wrap`] may replace.
#[derive(Debug, Clone)]
pub struct Adapters {
    /// The CSR API (kube-rs).
    pub csr_api: Arc<dyn CsrApi>,
    /// The identity keys in OVSDB.
    pub ovsdb: Arc<dyn OvsdbIdentity>,
    /// The lease and the XFRM guards.
    pub protection: Arc<dyn ProtectionPort>,
    /// The IKE daemon.
    pub ike: Arc<dyn IkePort>,
    /// The monitor.
    pub monitor: Arc<dyn MonitorPort>,
    /// The signed receipts (only with `--coordination cluster`).
    pub receipts: Option<Arc<dyn ReceiptPort>>,
}

/// The two points the chaos suite (`chaos-tests`) reaches a running agent
/// through: every adapter can be wrapped by a fault injector before the
/// actors get it, and the started node supervisor is handed out so a test
/// can kill any actor by name. [`run`] passes [`Seams::default`], which
/// changes nothing.
#[derive(Default)]
pub struct Seams {
    /// Replaces the adapters the actors get.
    pub wrap: Option<Box<dyn FnOnce(Adapters) -> Adapters + Send>>,
    /// Receives the node supervisor once the tree has started.
    pub started: Option<tokio::sync::oneshot::Sender<ActorRef<SupervisorMsg>>>,
    /// The wall clock every actor reads (default: the system's), so a test
    /// can jump it.
    pub clock: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seams")
            .field("wrap", &self.wrap.is_some())
            .field("started", &self.started.is_some())
            .field("clock", &self.clock.is_some())
            .finish()
    }
}

/// Runs the agent until `shutdown` turns true, then stops the actor tree
/// (which never removes guards or identity state: SPEC §4).
pub async fn run(args: RunArgs, shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    run_with(args, shutdown, Seams::default()).await
}

/// [`run`], with the adapters and the supervisor reachable through `seams`.
pub async fn run_with(
    args: RunArgs,
    mut shutdown: watch::Receiver<bool>,
    seams: Seams,
) -> Result<(), AgentError> {
    if args.ike_daemon == IkeDaemonKind::Libreswan {
        return Err(AgentError::Unsupported(
            "--ike-daemon=libreswan is not supported yet; use strongswan".into(),
        ));
    }
    let rekeying = args.rekeying().map_err(AgentError::Rekeying)?;
    // Who the node is, read only: its OVSDB row and chassis. Nothing is
    // written before the two claims below.
    let ovs = ovsdb::Client::connect_str(&args.node.ovsdb)
        .await
        .map_err(|source| AgentError::Ovsdb {
            remote: args.node.ovsdb.clone(),
            source,
        })?;
    let (chassis, row) = chassis(&ovs, Duration::from_secs(args.chassis_timeout)).await?;
    // The node's claim, then the key directory's owner lock (SPEC §2):
    // before this process writes the key directory, the lease, OVSDB or
    // the kernel. A second agent on the same node stops at the first,
    // whatever its key directory, naming the holder and having touched
    // nothing; both are held until the process exits.
    let _node_claim = crate::node_claim::claim_blocking(
        args.node.xfrm_netns.clone(),
        row.to_string(),
        crate::node_claim::claimant("agent", &args.node.key_dir),
    )
    .await
    .map_err(AgentError::NodeClaimed)?;
    let key_dir = args.node.key_dir.clone();
    let owner = tokio::task::spawn_blocking(move || actors::keydir::OwnerLock::acquire(key_dir))
        .await
        .map_err(|e| {
            AgentError::Runtime(crate::Error::Blocking {
                what: "taking the key directory's owner lock",
                reason: e.to_string(),
            })
        })?
        .map_err(AgentError::Owner)?;
    let owner = Arc::new(owner);
    tracing::info!(key_dir = %args.node.key_dir.display(), pid = std::process::id(), row = %row, "node claimed and key directory owner lock taken");
    let client = kube_client(&args.node).await?;
    let node = Api::<Node>::all(client.clone())
        .get(&args.node.node_name)
        .await?;
    let node_uid = node
        .metadata
        .uid
        .ok_or_else(|| AgentError::NodeWithoutUid(args.node.node_name.clone()))?;
    let node_uid = Uid::new(node_uid).map_err(|source| AgentError::Invalid {
        what: "Node UID",
        source,
    })?;
    let pod_uid = Uid::new(args.node.pod_uid.clone()).map_err(|source| AgentError::Invalid {
        what: "POD_UID",
        source,
    })?;
    tracing::info!(node = %args.node.node_name, node_uid = %node_uid.as_str(), chassis = %chassis.as_str(), key_dir = %args.node.key_dir.display(), "starting agent");

    let clock: Arc<dyn Clock> = match &seams.clock {
        Some(c) => c.clone(),
        None => Arc::new(SystemClock),
    };
    let board = StatusBoard::new(clock.clone());
    board.set_node(node_uid.clone(), chassis.clone());
    let mut registry = Registry::default();
    let metrics = Arc::new(PrometheusMetrics::register(&mut registry));

    let (status_addr, serve) = http::bind(
        args.status_addr,
        board.clone(),
        Arc::new(registry),
        shutdown.clone(),
    )
    .await
    .map_err(|source| AgentError::Http {
        addr: args.status_addr,
        source,
    })?;
    let server = tokio::spawn(serve);
    tracing::info!(%status_addr, "status server listening");

    // The capability gate: before any key, CSR or lease exists.
    let launcher = match args.node_netns_pid {
        Some(pid) => Launcher::nsenter(pid),
        None => Launcher::direct(),
    };
    let capability = CapabilityConfig {
        ovn_controller: args.ovn_controller.clone(),
        appctl: args.ovs_appctl.clone(),
        running_ctl: match &args.ovn_controller_ctl {
            Some(ctl) => ctl.clone(),
            None => discover_ctl(&args.ovn_controller_pidfile),
        },
    };
    if let Err(e) = capability::check(&capability, &launcher).await {
        board.set_capability_missing();
        tracing::error!(error = %e, exit_code = capability::CAPABILITY_MISSING_EXIT_CODE, exit_in_secs = args.capability_exit_delay, "capability gate failed: ovn-controller lacks the IPsec output protection patch; no key, CSR or lease was created");
        // Visible before the distinct exit: /status says CapabilityMissing
        // (and /readyz fails) for a while, so an operator or a probe sees
        // why, not only a crash loop.
        let delay = tokio::time::sleep(Duration::from_secs(args.capability_exit_delay));
        tokio::select! {
            () = delay => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        return Err(AgentError::CapabilityMissing(e));
    }
    tracing::info!("capability gate passed: both ovn-controllers advertise output protection");
    let patch = monitor_patch::inspect(&args.monitor_script).map_err(AgentError::Runtime)?;
    tracing::info!(?patch, ca_workaround = patch.needs_ca_workaround(), script = %args.monitor_script.display(), "ovs-monitor-ipsec");
    if args.key_algorithm == KeyAlgorithm::EcdsaP256 && !patch.loads_ecdsa_keys() {
        // Refused before any key exists: a node with an ECDSA key this
        // monitor cannot load would authenticate no IKE_SA at all.
        return Err(AgentError::Unsupported(format!(
            "--key-algorithm ecdsa-p256 needs the ovs-monitor-ipsec patch v4 or later: {} \
             ({patch:?}) writes the node key into ipsec.secrets as `: RSA`, which strongSwan \
             refuses for an ECDSA key; use --key-algorithm rsa2048 or the image's monitor",
            args.monitor_script.display()
        )));
    }
    if !patch.takes_rekeying() {
        tracing::warn!(
            ?patch,
            "this ovs-monitor-ipsec takes no rekeying arguments: strongSwan's defaults apply, and \
             every IKE_SA is reauthenticated break-before-make every 2h42-2h51 (traffic waits \
             for new CHILD_SAs); the image's patch v4 rekeys instead"
        );
    }
    // Opening the socket (in another namespace: a helper thread that
    // enters it) blocks: off the executor, like every netlink call.
    let netns = args.node.xfrm_netns.clone();
    let xfrm = tokio::task::spawn_blocking(move || match netns {
        Some(ns) => XfrmHandle::in_netns(&ns),
        None => XfrmHandle::open(),
    })
    .await
    .map_err(|e| {
        AgentError::Runtime(crate::Error::Blocking {
            what: "opening the netlink XFRM socket",
            reason: e.to_string(),
        })
    })?
    .map_err(|e| AgentError::Runtime(e.into()))?;
    let stop_grace = Duration::from_secs(args.stop_grace);
    let command_timeout = Duration::from_secs(args.command_timeout);
    let ike = IkeConfig {
        ipsec: args.ipsec.clone(),
        log_file: args.ike_log_file.clone(),
        stop_grace,
        command_timeout,
        cacerts_dir: args.ipsec_cacerts_dir.clone(),
    };
    let monitor = MonitorConfig {
        python: args.monitor_python.clone(),
        script: args.monitor_script.clone(),
        database: args
            .monitor_database
            .clone()
            .unwrap_or_else(|| args.node.ovsdb.clone()),
        rundir: args.monitor_rundir.clone(),
        log_file: args.monitor_log_file.clone(),
        output_file: args.monitor_output_file.clone(),
        appctl: args.ovs_appctl.clone(),
        stop_grace,
        command_timeout,
        rekeying: patch.takes_rekeying().then_some(rekeying),
    };
    // The data path's counters and MTUs, read in the same namespace as XFRM.
    let netns = args.node.xfrm_netns.clone();
    let tunnel_mtu = match args.tunnel_mtu {
        Some(m) => TunnelMtu::Fixed(m),
        None => TunnelMtu::Interface(args.tunnel_mtu_interface.clone()),
    };
    let readers =
        tokio::task::spawn_blocking(move || DatapathReaders::open(netns.as_deref(), tunnel_mtu))
            .await
            .map_err(|e| {
                AgentError::Runtime(crate::Error::Blocking {
                    what: "opening the data-path readers",
                    reason: e.to_string(),
                })
            })?
            .map_err(AgentError::Runtime)?;
    let protection = Arc::new(ProtectionAdapter::new(
        &args.node.key_dir,
        node_uid.clone(),
        AllocationConfig {
            reserved_bits: args.reserved_mark_bits,
        },
        xfrm,
        ovs.clone(),
        readers,
    ));
    let refresh = actors::datapath::RefreshSignal::default();
    let coordinated = args.coordination == CoordinationMode::Cluster;
    let namespace = args.node.coordination_namespace();
    let adapters = Adapters {
        csr_api: Arc::new(KubeCsrApi::new(client.clone())),
        ovsdb: Arc::new(OvsdbIdentityAdapter::new(ovs)),
        protection: protection.clone(),
        ike: Arc::new(IkeAdapter {
            config: ike.clone(),
            launcher: launcher.clone(),
            stale_pidfiles: args.node.ike_pidfiles(),
        }),
        monitor: Arc::new(MonitorAdapter {
            config: monitor,
            ike,
            launcher,
            patch,
        }),
        receipts: coordinated.then(|| {
            Arc::new(KubeReceipts::new(
                client.clone(),
                &args.node.node_name,
                &namespace,
                k8s::COORDINATION_CONFIGMAP,
            )) as Arc<dyn ReceiptPort>
        }),
    };
    let adapters = match seams.wrap {
        Some(wrap) => wrap(adapters),
        None => adapters,
    };
    let datapath_ports = actors::tree::DatapathPorts {
        port: protection,
        refresh: refresh.clone(),
        config: actors::datapath::DatapathConfig {
            period: Duration::from_millis(args.datapath_period_ms),
            fast_period: Duration::from_millis(args.datapath_fast_period_ms),
            window: Duration::from_secs(args.datapath_window),
        },
    };
    let tunnel_ports = TunnelPorts {
        protection: adapters.protection.clone(),
        ike: adapters.ike.clone(),
        monitor: adapters.monitor.clone(),
        protection_config: ProtectionConfig {
            readback_period: Duration::from_millis(args.guard_readback_ms),
            observe_period: Duration::from_secs(args.sa_observe_period.max(1)),
        },
        process_config: ProcessConfig {
            probe_period: Duration::from_secs(args.probe_period.max(1)),
            start_timeout: Duration::from_secs(args.process_start_timeout).max(stop_grace),
            start_timeout_max: (Duration::from_secs(args.process_start_timeout) * 8)
                .max(stop_grace),
            probe_failures: args.probe_failures,
            ..ProcessConfig::default()
        },
        ack_retry: Duration::from_secs(1),
    };

    let (trust_tx, trust_rx) = watch::channel(None);
    let follower = tokio::spawn(trust::follow(
        client.clone(),
        args.node.trust_namespace.clone(),
        args.trust_configmap.clone(),
        trust_tx,
        shutdown.clone(),
    ));

    let mut identity = IdentityConfig::new(
        args.node.node_name.clone(),
        node_uid,
        pod_uid,
        chassis,
        args.node.key_dir.clone(),
    );
    identity.key_type = args.key_algorithm.into();
    identity.expiration_seconds = args.certificate_lifetime;
    identity.request_timeout = args.request_timeout();
    identity.rotation_spread = Duration::from_secs(args.rotation_spread);
    identity.owner = Some(owner);
    // The Event forwarder subscribes before the tree starts: the identity
    // actor reports a moved-aside state file while it opens the key
    // directory, i.e. during its own start-up.
    let bus = Bus::default();
    let (forwarder, forwarder_join) = ractor::Actor::spawn(
        None,
        EventForwarder,
        ForwarderArgs {
            bus: bus.clone(),
            events: NodeEvents::new(
                client.clone(),
                &args.node.node_name,
                identity.node_uid.as_str(),
            ),
        },
    )
    .await
    .map_err(|e| {
        AgentError::Tree(actors::Error::Spawn {
            actor: "event-forwarder".into(),
            reason: e.to_string(),
        })
    })?;
    let mut tree_args = AgentTreeArgs {
        identity,
        csr_api: adapters.csr_api.clone(),
        ovsdb: adapters.ovsdb.clone(),
        clock,
        metrics,
        board: board.clone(),
        bus,
        trust: trust_rx,
        supervisor: SupervisorConfig::default(),
        gate: actors::gate::ProtectionGate::default(),
        permit: if coordinated {
            actors::gate::ArmPermit::withheld()
        } else {
            actors::gate::ArmPermit::granted()
        },
        extra_children: Vec::new(),
    };
    tree_args.extra_children = tree::tunnel_child_specs(&tree_args, tunnel_ports);
    tree_args
        .extra_children
        .push(tree::datapath_child_spec(&tree_args, datapath_ports));
    let ctl = unixctl::bind(&args.ctl_socket, board.clone(), refresh, shutdown.clone()).map_err(
        |source| {
            AgentError::Runtime(crate::Error::Io {
                path: args.ctl_socket.clone(),
                source,
            })
        },
    )?;
    let ctl = tokio::spawn(ctl);
    tracing::info!(socket = %args.ctl_socket.display(), "control socket listening (ovs-appctl -t <socket> ipsec/show)");
    let mut record_follower = None;
    if let Some(receipts) = adapters.receipts.clone() {
        let (record_tx, record_rx) = watch::channel(RecordView::Unknown);
        tracing::info!(%namespace, configmap = k8s::COORDINATION_CONFIGMAP, "following the cluster's coordination: this node arms when it asks");
        record_follower = Some(tokio::spawn(coordination::follow(
            client.clone(),
            namespace.clone(),
            k8s::COORDINATION_CONFIGMAP.to_owned(),
            record_tx,
            shutdown.clone(),
        )));
        let spec = tree::coordinator_child_spec(
            &tree_args,
            CoordinationPorts {
                me: NodeSelf {
                    node_name: args.node.node_name.clone(),
                    node_uid: tree_args.identity.node_uid.clone(),
                    pod_uid: tree_args.identity.pod_uid.clone(),
                    template_hash: args.node.pod_template_hash.clone(),
                },
                record: record_rx,
                receipts,
                refresh: Duration::from_secs(args.receipt_refresh),
            },
        );
        tree_args.extra_children.push(spec);
    } else {
        tracing::warn!("--coordination=off: arming at start without the cluster's coordination");
    }
    let (supervisor, join) = tree::start(tree_args).await?;
    if let Some(started) = seams.started {
        let _ = started.send(supervisor.clone());
    }

    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    tracing::info!("shutting down: stopping the actor tree (guards and identity state stay)");
    supervisor.stop(Some("SIGTERM".into()));
    let _ = join.await;
    forwarder.stop(None);
    let _ = forwarder_join.await;
    let _ = ctl.await;
    follower.abort();
    if let Some(f) = record_follower {
        f.abort();
    }
    let _ = server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn stt_is_refused_and_geneve_and_vxlan_are_not() {
        for ok in [None, Some("geneve"), Some("vxlan"), Some("geneve,vxlan")] {
            assert_eq!(unsupported_encap(ok), None, "{ok:?}");
        }
        for stt in ["stt", "STT", "geneve, stt"] {
            let why = unsupported_encap(Some(stt)).unwrap();
            assert!(
                why.contains("ovn-encap-type") && why.contains("STT datapath"),
                "{why}"
            );
            assert!(why.contains("nothing on this node was touched"), "{why}");
        }
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// The flags every agent needs, then `extra`.
    fn parse(extra: &[&str]) -> Result<Cli, clap::Error> {
        const REQUIRED: [&str; 9] = [
            "run",
            "--node-name",
            "n",
            "--pod-name",
            "p",
            "--pod-namespace",
            "kube-system",
            "--pod-uid",
            "0b0e6a3c-1111-4222-8333-444455556666",
        ];
        Cli::try_parse_from(REQUIRED.iter().chain(extra))
    }

    #[tokio::test]
    async fn libreswan_is_accepted_by_the_flag_and_refused_clearly() {
        let cli = parse(&["--ike-daemon", "libreswan"]).unwrap();
        let (_tx, rx) = watch::channel(false);
        let err = run(cli.run, rx).await.unwrap_err();
        assert!(matches!(err, AgentError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("libreswan"), "{err}");
        assert_eq!(err.exit_code(), 1);
    }

    #[tokio::test]
    async fn rekeying_that_leaves_no_time_is_refused_before_anything_starts() {
        let cli = parse(&[]).unwrap();
        assert_eq!(
            cli.run.rekeying(),
            Ok(kube_ovn_ipsec_api::rekeying::Rekeying::DEFAULT)
        );
        let cli = parse(&["--child-lifetime", "60", "--rekey-margin", "30"]).unwrap();
        let (_tx, rx) = watch::channel(false);
        // No OVSDB is reachable here: the refusal comes before any
        // connection is tried.
        let err = run(cli.run, rx).await.unwrap_err();
        assert!(matches!(err, AgentError::Rekeying(_)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("rekey margin of 30 s") && text.contains("60 s lifetime"),
            "{text}"
        );
        assert_eq!(err.exit_code(), 1);
    }

    #[test]
    fn probe_deadlines_default_to_a_real_node_and_refuse_zero() {
        let cli = parse(&[]).unwrap();
        assert_eq!((cli.run.command_timeout, cli.run.probe_failures), (10, 2));
        let cli = parse(&["--command-timeout", "30", "--probe-failures", "4"]).unwrap();
        assert_eq!((cli.run.command_timeout, cli.run.probe_failures), (30, 4));
        for bad in [["--command-timeout", "0"], ["--probe-failures", "0"]] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains(bad[0]), "{err}");
        }
    }

    #[test]
    fn ctl_is_discovered_from_the_pidfile() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("ovn-controller.pid");
        std::fs::write(&pidfile, "4242\n").unwrap();
        assert_eq!(
            discover_ctl(&pidfile),
            dir.path().join("ovn-controller.4242.ctl").into_os_string()
        );
        let missing = dir.path().join("nope.pid");
        assert_eq!(discover_ctl(&missing), missing.into_os_string());
    }
}
