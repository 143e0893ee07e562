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

use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerBuilder, ApiServerHandle, Identity};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

pub mod coordination;

pub const NS: &str = "kube-system";
pub const CONTROLLER_SA: &str = "ovn";
pub const HASH: &str = "6d8f9c7b5";
/// The CNI Pods' ServiceAccount: the agent's identity.
pub const CNI_SA: &str = "kube-ovn-cni";

#[derive(Clone)]
pub struct NodeFx {
    pub name: String,
    pub uid: String,
    pub chassis: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// The Pod-bound ServiceAccount token `client` authenticates with.
    pub token: String,
    pub client: Client,
}

pub struct Cluster {
    pub server: ApiServerHandle,
    pub admin: Client,
    pub nodes: Vec<NodeFx>,
    pub ds_uid: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub metrics: Arc<controller::metrics::Metrics>,
}

async fn create(admin: &Client, v: Value) -> Value {
    let obj: kube::api::DynamicObject = serde_json::from_value(v.clone()).unwrap();
    let (group, version) = match v["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, ver)) => (g.to_owned(), ver.to_owned()),
        None => (String::new(), v["apiVersion"].as_str().unwrap().to_owned()),
    };
    let kind = v["kind"].as_str().unwrap();
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
    let plural = match kind {
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "DaemonSet" => "daemonsets",
        "ControllerRevision" => "controllerrevisions",
        "Node" => "nodes",
        "Pod" => "pods",
        "ConfigMap" => "configmaps",
        "ServiceAccount" => "serviceaccounts",
        other => panic!("no plural for {other}"),
    };
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<kube::api::DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    let created = api.create(&PostParams::default(), &obj).await.unwrap();
    serde_json::to_value(created).unwrap()
}

fn rbac() -> Vec<Value> {
    let ctrl = json!([{"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": NS}]);
    let cni = json!([{"kind": "ServiceAccount", "name": CNI_SA, "namespace": NS}]);
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kube-ovn-ipsec-controller"},
        "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval", "certificatesigningrequests/status"], "verbs": ["update", "patch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["kubeovn.io/signer"], "verbs": ["approve", "sign"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kube-ovn-ipsec-controller"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kube-ovn-ipsec-controller"},
            "subjects": ctrl}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "kube-ovn-ipsec-controller", "namespace": NS},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["controllerrevisions"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "create", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
            {"apiGroups": ["cert-manager.io"], "resources": ["certificaterequests"], "verbs": ["get", "create", "delete"]},
            {"apiGroups": ["cert-manager.io"], "resources": ["certificaterequests/status"], "verbs": ["patch", "update"]}
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "kube-ovn-ipsec-controller", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-ovn-ipsec-controller"},
            "subjects": ctrl}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": CONTROLLER_SA, "namespace": NS}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": CNI_SA, "namespace": NS}}),
        // The agent: its CSRs, its Node (the UID it binds; its receipt
        // annotation), Events on its Node (namespace `default`), the trust
        // ConfigMap.
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kube-ovn-cni-ipsec"},
        "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
        ]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kube-ovn-cni-ipsec"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kube-ovn-cni-ipsec"},
            "subjects": cni}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "kube-ovn-cni-ipsec", "namespace": NS},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "kube-ovn-cni-ipsec", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-ovn-cni-ipsec"},
            "subjects": cni}),
    ]
}

/// Mints a token for ServiceAccount `sa` in [`NS`] through `TokenRequest`,
/// bound to Pod `pod` (name, UID) when given: what the kubelet asks for a
/// Pod's projected token.
pub async fn mint_token(admin: &Client, sa: &str, pod: Option<(&str, &str)>) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let answer = sas
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap();
    answer.status.unwrap().token
}

/// Creates the ServiceAccounts, RBAC objects, the DaemonSet, its revisions,
/// the nodes and their pods, and a Pod-bound token per node.
pub async fn populate(
    server: &ApiServerHandle,
    admin: &Client,
    nodes: usize,
) -> (Vec<NodeFx>, String) {
    for obj in rbac() {
        create(admin, obj).await;
    }
    let labels = json!({"app": "kube-ovn-cni"});
    let ds = create(admin, json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "kube-ovn-cni", "namespace": NS},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "cni-server", "image": "kube-ovn"}]}}}}))
        .await;
    let ds_uid = ds["metadata"]["uid"].as_str().unwrap().to_owned();
    let owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-ovn-cni",
                            "uid": ds_uid, "controller": true}]);
    create(
        admin,
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": format!("kube-ovn-cni-{HASH}"), "namespace": NS,
                         "labels": {"app": "kube-ovn-cni", "controller-revision-hash": HASH},
                         "ownerReferences": owner},
            "revision": 2}),
    )
    .await;
    create(
        admin,
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "kube-ovn-cni-oldhash", "namespace": NS,
                         "labels": {"app": "kube-ovn-cni", "controller-revision-hash": "oldhash"},
                         "ownerReferences": owner},
            "revision": 1}),
    )
    .await;
    let mut fxs = Vec::new();
    for i in 0..nodes {
        fxs.push(add_node(server, admin, &ds_uid, i).await);
    }
    (fxs, ds_uid)
}

/// Node `node-<i>` (chassis `chassis-<i>`) with its CNI Pod of the current
/// template, owned by the DaemonSet `ds_uid`, and a token bound to that
/// Pod: what the DaemonSet scheduling to a new node amounts to.
pub async fn add_node(server: &ApiServerHandle, admin: &Client, ds_uid: &str, i: usize) -> NodeFx {
    let owner = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-ovn-cni",
                            "uid": ds_uid, "controller": true}]);
    let name = format!("node-{i}");
    let chassis = format!("chassis-{i}");
    let node = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"ovn.kubernetes.io/chassis": chassis}}}),
    )
    .await;
    let uid = node["metadata"]["uid"].as_str().unwrap().to_owned();
    let pod_name = format!("kube-ovn-cni-{i}");
    let pod = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": NS,
                         "labels": {"app": "kube-ovn-cni", "controller-revision-hash": HASH},
                         "ownerReferences": owner},
            "spec": {"nodeName": name, "serviceAccountName": CNI_SA,
                     "containers": [{"name": "cni-server", "image": "kube-ovn"}]}}),
    )
    .await;
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let token = mint_token(admin, CNI_SA, Some((&pod_name, &pod_uid))).await;
    let client = server.client(&token).await.unwrap();
    NodeFx {
        name,
        uid,
        chassis,
        pod_name,
        pod_uid,
        token,
        client,
    }
}

/// The kube-ovn-cni DaemonSet's Pod template as the chart renders it
/// (SPEC §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// IPsec enabled: the `ipsec` agent container beside the CNI server.
    Ipsec,
    /// IPsec disabled after it was enabled: the `ipsec-cleanup` init
    /// container instead of the agent.
    Cleanup,
}

impl Shape {
    /// The Pod spec's containers of this shape.
    fn containers(self) -> Value {
        let c = |name: &str| json!({"name": name, "image": "kube-ovn"});
        match self {
            Shape::Ipsec => json!({"containers": [c("cni-server"), c("ipsec")]}),
            Shape::Cleanup => json!({
                "initContainers": [c("ipsec-cleanup")],
                "containers": [c("cni-server")],
            }),
        }
    }
}

/// Makes `shape` under template hash `hash` the DaemonSet's Pod template,
/// as applying the chart does: the template, and the ControllerRevision
/// `kube-ovn-cni-<hash>` made the newest (an existing one, as for a
/// template reverted to, gets the next revision number). The Pods are
/// rolled separately ([`replace_pod`]).
pub async fn set_template(admin: &Client, ds_uid: &str, shape: Shape, hash: &str) {
    let sets: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let template = json!({"spec": {"template": {"spec": shape.containers()}}});
    sets.patch(
        "kube-ovn-cni",
        &PatchParams::default(),
        &Patch::Merge(&template),
    )
    .await
    .unwrap();
    let revisions: Api<ControllerRevision> = Api::namespaced(admin.clone(), NS);
    let newest = revisions
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.revision)
        .max()
        .unwrap_or(0)
        + 1;
    let name = format!("kube-ovn-cni-{hash}");
    if revisions.get_opt(&name).await.unwrap().is_some() {
        let bump = json!({"revision": newest});
        revisions
            .patch(&name, &PatchParams::default(), &Patch::Merge(&bump))
            .await
            .unwrap();
    } else {
        create(
            admin,
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": NS,
                             "labels": {"app": "kube-ovn-cni", "controller-revision-hash": hash},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "kube-ovn-cni", "uid": ds_uid, "controller": true}]},
                "revision": newest}),
        )
        .await;
    }
}

/// Deletes `node`'s CNI Pod (the `n`th node) and creates a new one of
/// template `hash` in `shape` (what deleting a Pod under the DaemonSet
/// controller amounts to), with a token bound to it: `node` then names the
/// new Pod.
pub async fn replace_pod(
    server: &ApiServerHandle,
    admin: &Client,
    ds_uid: &str,
    node: &mut NodeFx,
    n: usize,
    shape: Shape,
    hash: &str,
) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let _ = pods.delete(&node.pod_name, &Default::default()).await;
    let mut spec = shape.containers();
    spec["nodeName"] = json!(node.name);
    spec["serviceAccountName"] = json!(CNI_SA);
    let pod = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": format!("kube-ovn-cni-{n}-"), "namespace": NS,
                         "labels": {"app": "kube-ovn-cni", "controller-revision-hash": hash},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                             "name": "kube-ovn-cni", "uid": ds_uid, "controller": true}]},
            "spec": spec}),
    )
    .await;
    let pod_name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let token = mint_token(admin, CNI_SA, Some((&pod_name, &pod_uid))).await;
    let client = server.client(&token).await.unwrap();
    node.pod_name = pod_name;
    node.pod_uid = pod_uid;
    node.token = token;
    node.client = client;
}

/// The kubelet's report of the `ipsec-cleanup` init container of Pod
/// `pod_name` (a `pods/status` write): terminated with `exit` when given,
/// running otherwise.
pub async fn set_cleanup_init_of(admin: &Client, pod_name: &str, exit: Option<i32>) {
    let state = match exit {
        Some(0) => json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
        Some(code) => json!({"terminated": {"exitCode": code, "reason": "Error",
                                            "message": "a foreign owner holds the lease's mark"}}),
        None => json!({"running": {}}),
    };
    let status = json!({"status": {"initContainerStatuses": [{
        "name": "ipsec-cleanup", "image": "kube-ovn", "imageID": "", "ready": exit == Some(0),
        "restartCount": 0, "state": state}]}});
    Api::<Pod>::namespaced(admin.clone(), NS)
        .patch_status(pod_name, &PatchParams::default(), &Patch::Merge(&status))
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
    Issued(Vec<u8>),
    Denied(String),
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
