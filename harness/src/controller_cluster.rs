//! A small cluster on `apiserver` with RBAC on: the kube-ovn-cni
//! DaemonSet, its current ControllerRevision, N Nodes with chassis
//! annotations, one CNI Pod per Node with a Pod-bound token, and the
//! controller's own ServiceAccount with the permissions docs/controller.md
//! lists, and the agent's (the CNI ServiceAccount's) with the permissions
//! docs/controller.md lists for it. Each node's token is minted the way the
//! kubelet asks for it: a `TokenRequest` bound to the node's CNI Pod.
//! Shared by the integration tests, `benches/src/bin/csr_e2e.rs` and the
//! agent's end-to-end test with the real controller. [`coordination`]
//! holds the coordinator's other side: node identities, receipt
//! responders, release receipts, reads of the record and of OVN's
//! switches. [`Cluster::roll_daemon_set`] plays the DaemonSet controller's
//! and the kubelets' part when the chart changes the Pod template (no such
//! controller runs here).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerBuilder, ApiServerHandle, Identity, kube_ovn};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

pub mod coordination;

pub use apiserver::kube_ovn::{CNI_SA, CONTROLLER_SA, HASH, NS, Shape};

/// One node of the test cluster (the library's [`apiserver::kube_ovn::CniNode`]).
pub type NodeFx = apiserver::kube_ovn::CniNode;

/// The test cluster, with the controller running in-process until
/// [`Cluster::stop`] (or drop).
pub struct Cluster {
    /// The embedded API server (RBAC on).
    pub server: ApiServerHandle,
    /// The cluster admin's client.
    pub admin: Client,
    /// The nodes, each with its CNI Pod and token.
    pub nodes: Vec<NodeFx>,
    /// The kube-ovn-cni DaemonSet's UID.
    pub ds_uid: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The controller's metrics.
    pub metrics: Arc<controller::metrics::Metrics>,
}

/// [`apiserver::kube_ovn::mint_token`]; a failure fails the test.
pub async fn mint_token(admin: &Client, sa: &str, pod: Option<(&str, &str)>) -> String {
    kube_ovn::mint_token(admin, sa, pod).await.unwrap()
}

/// [`apiserver::kube_ovn::populate`]; a failure fails the test.
pub async fn populate(
    server: &ApiServerHandle,
    admin: &Client,
    nodes: usize,
) -> (Vec<NodeFx>, String) {
    kube_ovn::populate(server, admin, nodes).await.unwrap()
}

/// [`apiserver::kube_ovn::add_node`]; a failure fails the test.
pub async fn add_node(server: &ApiServerHandle, admin: &Client, ds_uid: &str, i: usize) -> NodeFx {
    kube_ovn::add_node(server, admin, ds_uid, i).await.unwrap()
}

/// [`apiserver::kube_ovn::set_template`]; a failure fails the test.
pub async fn set_template(admin: &Client, ds_uid: &str, shape: Shape, hash: &str) {
    kube_ovn::set_template(admin, ds_uid, shape, hash)
        .await
        .unwrap();
}

/// [`apiserver::kube_ovn::replace_pod`]; a failure fails the test.
pub async fn replace_pod(
    server: &ApiServerHandle,
    admin: &Client,
    ds_uid: &str,
    node: &mut NodeFx,
    n: usize,
    shape: Shape,
    hash: &str,
) {
    kube_ovn::replace_pod(server, admin, ds_uid, node, n, shape, hash)
        .await
        .unwrap();
}

/// The kubelet's report of the `ipsec-cleanup` init container of Pod
/// `pod_name`: terminated with `exit` when given (a failure's message
/// names a refusal), running otherwise.
pub async fn set_cleanup_init_of(admin: &Client, pod_name: &str, exit: Option<i32>) {
    let report = match exit {
        Some(exit_code) => kube_ovn::InitReport::Terminated {
            exit_code,
            message: "a foreign owner holds the lease's mark",
        },
        None => kube_ovn::InitReport::Running,
    };
    kube_ovn::set_cleanup_init(admin, pod_name, report)
        .await
        .unwrap();
}

impl Cluster {
    /// Changes the DaemonSet's Pod template to `shape` under template hash
    /// `hash` ([`set_template`]) and rolls every node onto it, as the
    /// DaemonSet controller and the kubelets would: on each node in turn
    /// the old Pod deleted and a new one created ([`Self::replace_pod`]).
    pub async fn roll_daemon_set(&mut self, shape: Shape, hash: &str) {
        set_template(&self.admin, &self.ds_uid, shape, hash).await;
        for n in 0..self.nodes.len() {
            self.replace_pod(n, shape, hash).await;
        }
    }

    /// [`replace_pod`] of node `n`: `nodes[n]` names the new Pod.
    pub async fn replace_pod(&mut self, n: usize, shape: Shape, hash: &str) {
        replace_pod(
            &self.server,
            &self.admin,
            &self.ds_uid,
            &mut self.nodes[n],
            n,
            shape,
            hash,
        )
        .await;
    }

    /// [`set_cleanup_init_of`] node `n`'s Pod.
    pub async fn set_cleanup_init(&self, n: usize, exit: Option<i32>) {
        set_cleanup_init_of(&self.admin, &self.nodes[n].pod_name, exit).await;
    }

    /// Starts the server and creates the DaemonSet, revision, nodes and pods.
    pub async fn start(nodes: usize) -> Cluster {
        Self::start_with(ApiServer::builder(), nodes).await
    }

    /// [`Self::start`] on a server configured by `builder` (RBAC is turned
    /// on and the controller's token added here).
    pub async fn start_with(builder: ApiServerBuilder, nodes: usize) -> Cluster {
        let server = builder
            .rbac(true)
            .token("controller", Identity::service_account(NS, CONTROLLER_SA))
            .start()
            .await
            .unwrap();
        let admin = server.client(ADMIN_TOKEN).await.unwrap();
        let (nodes, ds_uid) = populate(&server, &admin, nodes).await;
        Cluster {
            server,
            admin,
            nodes,
            ds_uid,
            stop: None,
            task: None,
            metrics: Arc::new(controller::metrics::Metrics::new()),
        }
    }

    /// Restarts the API server with its store reset (same address, CA and
    /// tokens; resourceVersions start over) and creates the cluster's
    /// objects again: new UIDs, new Pod-bound tokens in `nodes`. The
    /// controller keeps running against it.
    pub async fn restart_with_empty_store(&mut self) {
        self.server.restart_with_empty_store().await.unwrap();
        self.repopulate().await;
    }

    /// [`Self::restart_with_empty_store`] without the restart: the store is
    /// reset under open connections, watches end without an error.
    pub async fn reset_store(&mut self) {
        self.server.reset_store().unwrap();
        self.repopulate().await;
    }

    async fn repopulate(&mut self) {
        // The admin client's pooled connection may be the old server's: a
        // request on it fails once. Populating starts when one succeeds.
        let admin = self.admin.clone();
        eventually("the API server answers after the reset", || {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
            async move { nodes.list(&Default::default()).await.is_ok() }
        })
        .await;
        let (nodes, ds_uid) = populate(&self.server, &self.admin, self.nodes.len()).await;
        self.nodes = nodes;
        self.ds_uid = ds_uid;
    }

    /// The controller's flags for this cluster.
    pub fn config(&self) -> controller::config::Config {
        self.config_with(&[])
    }

    /// [`Self::config`] with more flags.
    pub fn config_with(&self, flags: &[&str]) -> controller::config::Config {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            c: controller::config::Config,
        }
        let mut args = vec!["test", "--namespace", NS];
        // No reload unless a test asks for one.
        if !flags.contains(&"--ca-reload") {
            args.extend(["--ca-reload", "3600s"]);
        }
        args.extend_from_slice(flags);
        P::parse_from(args).c
    }

    /// Starts the controller in-process as its own ServiceAccount.
    pub async fn start_controller(&mut self, config: controller::config::Config) {
        self.start_controller_as("controller", config).await;
    }

    /// [`Self::start_controller`] with another bearer token.
    pub async fn start_controller_as(&mut self, token: &str, config: controller::config::Config) {
        let client = self.server.client(token).await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let metrics = self.metrics.clone();
        self.task = Some(tokio::spawn(async move {
            controller::run(
                client,
                &config,
                metrics,
                Arc::new(kube_ovn_ipsec_api::clock::SystemClock),
                async {
                    let _ = rx.await;
                },
            )
            .await
            .unwrap();
        }));
        self.stop = Some(tx);
    }

    /// Aborts the in-process controller without its clean stop: from the
    /// API's side what a SIGKILL looks like (no further request).
    pub fn kill_controller(&mut self) {
        self.stop = None;
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    /// Stops the controller and waits for its task.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        self.server.shutdown().await;
    }
}

/// A CSR object as the agent builds it (SPEC §2).
pub fn csr_object(
    name: &str,
    node: &NodeFx,
    request_pem: &[u8],
    lifetime: i32,
) -> CertificateSigningRequest {
    serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "annotations": {
            "kube-ovn.io/ipsec-node": node.name,
            "kube-ovn.io/ipsec-node-uid": node.uid,
            "kube-ovn.io/ipsec-chassis": node.chassis,
            "kube-ovn.io/ipsec-generation": "1"}},
        "spec": {"request": ByteString(request_pem.to_vec()), "signerName": "kubeovn.io/signer",
                 "usages": ["ipsec tunnel"], "expirationSeconds": lifetime}
    }))
    .unwrap()
}

/// A PEM request for `chassis` with `key`.
pub fn request_pem(key: &rcgen::KeyPair, chassis: &str) -> Vec<u8> {
    let mut p = rcgen::CertificateParams::new(vec![chassis.to_owned()]).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "kube-ovn");
    p.distinguished_name
        .push(rcgen::DnType::CommonName, chassis);
    p.serialize_request(key)
        .unwrap()
        .pem()
        .unwrap()
        .into_bytes()
}

/// How a CSR ended.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Issued: the certificate's PEM.
    Issued(Vec<u8>),
    /// Denied: the condition's message.
    Denied(String),
    /// Failed: the condition's message.
    Failed(String),
}

/// The CSR's outcome, once it has one.
pub fn outcome(csr: &CertificateSigningRequest) -> Option<Outcome> {
    let status = csr.status.as_ref()?;
    if let Some(c) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
        return Some(Outcome::Issued(c.0.clone()));
    }
    for c in status.conditions.iter().flatten() {
        let reason = c.reason.clone().unwrap_or_default();
        match c.type_.as_str() {
            "Denied" => return Some(Outcome::Denied(reason)),
            "Failed" => return Some(Outcome::Failed(reason)),
            _ => {}
        }
    }
    None
}

/// Waits (bounded) for a CSR's outcome.
pub async fn wait_outcome(client: &Client, name: &str) -> Outcome {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    for _ in 0..500 {
        if let Some(o) = outcome(&api.get(name).await.unwrap()) {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let csr = api.get(name).await.unwrap();
    panic!(
        "CSR {} has no outcome after 10 s: {:?}",
        csr.name_any(),
        csr.status
    );
}

/// Waits (bounded, 10 s) until `f` holds. The controller writes a CSR's
/// outcome first and counts it and records its Event afterwards, so a test
/// that has just seen the outcome must wait for those.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..500 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within 10 s");
}
