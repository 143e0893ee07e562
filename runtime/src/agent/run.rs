//! Start-up order and shutdown of `kube-ovn-ipsec run`.
//!
//! Order: Kubernetes client, OVSDB, who this node is (chassis from OVSDB,
//! Node UID from the API), status server, trust follower, actor tree. The
//! status server comes up before the tree so a node stuck early (no
//! chassis yet, CSR denied) is visible through `/status` instead of a
//! crash loop.

use std::sync::Arc;
use std::time::Duration;

use actors::bus::Bus;
use actors::clock::{SystemClock, WallClock};
use actors::identity::IdentityConfig;
use actors::metrics::PrometheusMetrics;
use actors::status::StatusBoard;
use actors::supervisor::SupervisorConfig;
use actors::tree::{self, AgentTreeArgs};
use k8s_openapi::api::core::v1::Node;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::names::ovs;
use ovsdb::MapColumn;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::config::RunArgs;
use super::http;
use super::kube_csr::KubeCsrApi;
use super::ovsdb_identity::OvsdbIdentityAdapter;
use super::trust;

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
}

/// A started agent.
#[derive(Debug)]
pub struct Agent {
    /// The status board (what `/status` serves).
    pub board: StatusBoard,
    /// The bound status address.
    pub status_addr: std::net::SocketAddr,
}

async fn kube_client(args: &RunArgs) -> Result<Client, AgentError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc =
                Kubeconfig::read_from(path).map_err(|e| AgentError::KubeConfig(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| AgentError::KubeConfig(e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| AgentError::KubeConfig(e.to_string()))?,
    };
    Client::try_from(config).map_err(AgentError::Kube)
}

async fn chassis(client: &ovsdb::Client, timeout: Duration) -> Result<Chassis, AgentError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client.read_map(&MapColumn::ovs_external_ids()).await {
            Ok(snap) => {
                if let Some(id) = snap.entries.get(ovs::EXTERNAL_ID_SYSTEM_ID) {
                    return Chassis::new(id.clone()).map_err(|source| AgentError::Invalid {
                        what: "chassis (external_ids:system-id)",
                        source,
                    });
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

/// Runs the agent until `shutdown` turns true, then stops the actor tree
/// (which never removes guards or identity state: SPEC §4).
pub async fn run(args: RunArgs, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    let client = kube_client(&args).await?;
    let ovs = ovsdb::Client::connect_str(&args.ovsdb)
        .await
        .map_err(|source| AgentError::Ovsdb {
            remote: args.ovsdb.clone(),
            source,
        })?;
    let chassis = chassis(&ovs, Duration::from_secs(args.chassis_timeout)).await?;
    let node = Api::<Node>::all(client.clone())
        .get(&args.node_name)
        .await?;
    let node_uid = node
        .metadata
        .uid
        .ok_or_else(|| AgentError::NodeWithoutUid(args.node_name.clone()))?;
    let node_uid = Uid::new(node_uid).map_err(|source| AgentError::Invalid {
        what: "Node UID",
        source,
    })?;
    let pod_uid = Uid::new(args.pod_uid.clone()).map_err(|source| AgentError::Invalid {
        what: "POD_UID",
        source,
    })?;
    tracing::info!(node = %args.node_name, node_uid = %node_uid.as_str(), chassis = %chassis.as_str(), key_dir = %args.key_dir.display(), "starting agent");

    let clock: Arc<dyn WallClock> = Arc::new(SystemClock);
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

    let (trust_tx, trust_rx) = watch::channel(None);
    let follower = tokio::spawn(trust::follow(
        client.clone(),
        args.trust_namespace.clone(),
        args.trust_configmap.clone(),
        trust_tx,
        shutdown.clone(),
    ));

    let mut identity = IdentityConfig::new(
        args.node_name.clone(),
        node_uid,
        pod_uid,
        chassis,
        args.key_dir.clone(),
    );
    identity.key_type = args.key_algorithm.into();
    identity.expiration_seconds = args.certificate_lifetime;
    identity.request_timeout = args.request_timeout();
    let (supervisor, join) = tree::start(AgentTreeArgs {
        identity,
        csr_api: Arc::new(KubeCsrApi::new(client)),
        ovsdb: Arc::new(OvsdbIdentityAdapter::new(ovs)),
        clock,
        metrics,
        board: board.clone(),
        bus: Bus::default(),
        trust: trust_rx,
        supervisor: SupervisorConfig::default(),
        extra_children: Vec::new(),
    })
    .await?;

    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    tracing::info!("shutting down: stopping the actor tree (guards and identity state stay)");
    supervisor.stop(Some("SIGTERM".into()));
    let _ = join.await;
    follower.abort();
    let _ = server.await;
    Ok(())
}
