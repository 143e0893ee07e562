//! A Kube-OVN-shaped cluster on the embedded API server, for the tests,
//! the benches and the lab: the RBAC of docs/controller.md (the
//! controller's ServiceAccount and the agent's, the CNI ServiceAccount),
//! the `kube-ovn-cni` DaemonSet with its ControllerRevisions, Nodes with
//! chassis annotations, one CNI Pod per Node and a token bound to that
//! Pod — minted through `TokenRequest`, as the kubelet asks for a Pod's
//! projected token.
//!
//! No DaemonSet controller or kubelet runs on the embedded server, so this
//! module also plays their part when the chart changes the Pod template:
//! [`set_template`] (the template and its newest ControllerRevision),
//! [`replace_pod`] (one node's Pod deleted and recreated: what a rolling
//! update does per node) and [`set_cleanup_init`] (the kubelet's report of
//! the `ipsec-cleanup` init container). Every object gets real UIDs and
//! resourceVersions from the server.

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::ApiServerHandle;

/// The namespace of the CNI DaemonSet and the controller.
pub const NS: &str = "kube-system";
/// The controller's ServiceAccount.
pub const CONTROLLER_SA: &str = "ovn";
/// The CNI Pods' ServiceAccount: the agent's identity.
pub const CNI_SA: &str = "kube-ovn-cni";
/// The DaemonSet's name.
pub const DAEMON_SET: &str = "kube-ovn-cni";
/// The template hash [`populate`] starts the DaemonSet with.
pub const HASH: &str = "6d8f9c7b5";
/// The chassis annotation on a Node (Kube-OVN's).
pub const CHASSIS_ANNOTATION: &str = "ovn.kubernetes.io/chassis";

/// Why a cluster object could not be created or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The server answered with something this module cannot use.
    #[error("{0}")]
    Unexpected(String),
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, ClusterError>;

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| ClusterError::Api { what, source }
}

/// One node: its Node, its CNI Pod and the Pod-bound token.
#[derive(Clone)]
pub struct CniNode {
    /// The Node's name (`node-<i>`).
    pub name: String,
    /// The Node's UID.
    pub uid: String,
    /// Its chassis (`chassis-<i>`), as annotated on the Node.
    pub chassis: String,
    /// The CNI Pod's name.
    pub pod_name: String,
    /// The CNI Pod's UID.
    pub pod_uid: String,
    /// The Pod-bound ServiceAccount token `client` authenticates with.
    pub token: String,
    /// A client with that token.
    pub client: Client,
}

impl std::fmt::Debug for CniNode {
    // The token is a credential: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CniNode")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("chassis", &self.chassis)
            .field("pod_name", &self.pod_name)
            .field("pod_uid", &self.pod_uid)
            .finish_non_exhaustive()
    }
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Result<&'v str> {
    let mut at = v;
    for key in path {
        at = &at[*key];
    }
    at.as_str()
        .ok_or_else(|| ClusterError::Unexpected(format!("no {} in {v}", path.join("."))))
}

/// Creates `v` (any kind this module uses) as the admin; returns the
/// created object.
async fn create(admin: &Client, v: Value) -> Result<Value> {
    let kind = str_at(&v, &["kind"])?.to_owned();
    let obj: kube::api::DynamicObject = serde_json::from_value(v.clone())
        .map_err(|e| ClusterError::Unexpected(format!("{kind}: {e}")))?;
    let api_version = str_at(&v, &["apiVersion"])?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, &kind);
    let plural = match kind.as_str() {
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
        other => return Err(ClusterError::Unexpected(format!("no plural for {other}"))),
    };
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api_of: Api<kube::api::DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    let created = api_of
        .create(&PostParams::default(), &obj)
        .await
        .map_err(api(format!("creating a {kind}")))?;
    serde_json::to_value(created).map_err(|e| ClusterError::Unexpected(e.to_string()))
}

/// The RBAC objects and ServiceAccounts of docs/controller.md.
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
        // ConfigMap and the coordination record.
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
pub async fn mint_token(admin: &Client, sa: &str, pod: Option<(&str, &str)>) -> Result<String> {
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
        .map_err(api(format!("a TokenRequest for {sa}")))?;
    answer
        .status
        .map(|s| s.token)
        .ok_or_else(|| ClusterError::Unexpected("a TokenRequest without a status".into()))
}

/// The DaemonSet `ds_uid` as the controlling owner of an object.
fn owned_by(ds_uid: &str) -> Value {
    json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": DAEMON_SET,
            "uid": ds_uid, "controller": true}])
}

/// Creates the ServiceAccounts, the RBAC objects, the DaemonSet and its
/// revisions ([`HASH`] the newest), and `nodes` nodes with their Pods and
/// Pod-bound tokens ([`add_node`]). Returns the nodes and the DaemonSet's
/// UID.
pub async fn populate(
    server: &ApiServerHandle,
    admin: &Client,
    nodes: usize,
) -> Result<(Vec<CniNode>, String)> {
    for obj in rbac() {
        create(admin, obj).await?;
    }
    let labels = json!({"app": DAEMON_SET});
    let ds = create(admin, json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DAEMON_SET, "namespace": NS},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "cni-server", "image": "kube-ovn"}]}}}}))
        .await?;
    let ds_uid = str_at(&ds, &["metadata", "uid"])?.to_owned();
    for (hash, revision) in [(HASH, 2), ("oldhash", 1)] {
        create(
            admin,
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": format!("{DAEMON_SET}-{hash}"), "namespace": NS,
                             "labels": {"app": DAEMON_SET, "controller-revision-hash": hash},
                             "ownerReferences": owned_by(&ds_uid)},
                "revision": revision}),
        )
        .await?;
    }
    let mut fxs = Vec::new();
    for i in 0..nodes {
        fxs.push(add_node(server, admin, &ds_uid, i).await?);
    }
    Ok((fxs, ds_uid))
}

/// Node `node-<i>` (chassis `chassis-<i>`) with its CNI Pod of template
/// [`HASH`], owned by the DaemonSet `ds_uid`, and a token bound to that
/// Pod: what the DaemonSet scheduling to a new node amounts to.
pub async fn add_node(
    server: &ApiServerHandle,
    admin: &Client,
    ds_uid: &str,
    i: usize,
) -> Result<CniNode> {
    let name = format!("node-{i}");
    let chassis = format!("chassis-{i}");
    let node = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {CHASSIS_ANNOTATION: chassis}}}),
    )
    .await?;
    let uid = str_at(&node, &["metadata", "uid"])?.to_owned();
    let pod_name = format!("{DAEMON_SET}-{i}");
    let pod = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": NS,
                         "labels": {"app": DAEMON_SET, "controller-revision-hash": HASH},
                         "ownerReferences": owned_by(ds_uid)},
            "spec": {"nodeName": name, "serviceAccountName": CNI_SA,
                     "containers": [{"name": "cni-server", "image": "kube-ovn"}]}}),
    )
    .await?;
    let pod_uid = str_at(&pod, &["metadata", "uid"])?.to_owned();
    let token = mint_token(admin, CNI_SA, Some((&pod_name, &pod_uid))).await?;
    let client = server
        .client(&token)
        .await
        .map_err(|e| ClusterError::Unexpected(format!("a client for {name}: {e}")))?;
    Ok(CniNode {
        name,
        uid,
        chassis,
        pod_name,
        pod_uid,
        token,
        client,
    })
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
pub async fn set_template(admin: &Client, ds_uid: &str, shape: Shape, hash: &str) -> Result<()> {
    let sets: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let template = json!({"spec": {"template": {"spec": shape.containers()}}});
    sets.patch(
        DAEMON_SET,
        &PatchParams::default(),
        &Patch::Merge(&template),
    )
    .await
    .map_err(api("patching the DaemonSet's template"))?;
    let revisions: Api<ControllerRevision> = Api::namespaced(admin.clone(), NS);
    let newest = revisions
        .list(&Default::default())
        .await
        .map_err(api("listing ControllerRevisions"))?
        .items
        .iter()
        .map(|r| r.revision)
        .max()
        .unwrap_or(0)
        + 1;
    let name = format!("{DAEMON_SET}-{hash}");
    let existing = revisions
        .get_opt(&name)
        .await
        .map_err(api(format!("reading ControllerRevision {name}")))?;
    if existing.is_some() {
        let bump = json!({"revision": newest});
        revisions
            .patch(&name, &PatchParams::default(), &Patch::Merge(&bump))
            .await
            .map_err(api(format!("making {name} the newest revision")))?;
    } else {
        create(
            admin,
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": NS,
                             "labels": {"app": DAEMON_SET, "controller-revision-hash": hash},
                             "ownerReferences": owned_by(ds_uid)},
                "revision": newest}),
        )
        .await?;
    }
    Ok(())
}

/// Deletes `node`'s CNI Pod (node number `n`) and creates a new one of
/// template `hash` in `shape` (what deleting a Pod under the DaemonSet
/// controller amounts to), with a token bound to it: `node` then names the
/// new Pod.
pub async fn replace_pod(
    server: &ApiServerHandle,
    admin: &Client,
    ds_uid: &str,
    node: &mut CniNode,
    n: usize,
    shape: Shape,
    hash: &str,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    // Already gone is what a delete wants.
    let _ = pods.delete(&node.pod_name, &Default::default()).await;
    let mut spec = shape.containers();
    spec["nodeName"] = json!(node.name);
    spec["serviceAccountName"] = json!(CNI_SA);
    let pod = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": format!("{DAEMON_SET}-{n}-"), "namespace": NS,
                         "labels": {"app": DAEMON_SET, "controller-revision-hash": hash},
                         "ownerReferences": owned_by(ds_uid)},
            "spec": spec}),
    )
    .await?;
    let pod_name = str_at(&pod, &["metadata", "name"])?.to_owned();
    let pod_uid = str_at(&pod, &["metadata", "uid"])?.to_owned();
    let token = mint_token(admin, CNI_SA, Some((&pod_name, &pod_uid))).await?;
    let client = server
        .client(&token)
        .await
        .map_err(|e| ClusterError::Unexpected(format!("a client for {pod_name}: {e}")))?;
    node.pod_name = pod_name;
    node.pod_uid = pod_uid;
    node.token = token;
    node.client = client;
    Ok(())
}

/// What the kubelet reports of an init container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitReport<'a> {
    /// Started, not finished.
    Running,
    /// Finished with this exit code; `message` is its termination message
    /// (the end of its output, with `FallbackToLogsOnError`).
    Terminated {
        /// The exit code.
        exit_code: i32,
        /// The termination message.
        message: &'a str,
    },
}

/// The kubelet's report of the `ipsec-cleanup` init container of Pod
/// `pod_name` (a `pods/status` write).
pub async fn set_cleanup_init(
    admin: &Client,
    pod_name: &str,
    report: InitReport<'_>,
) -> Result<()> {
    let state = match report {
        InitReport::Terminated { exit_code: 0, .. } => {
            json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
        }
        InitReport::Terminated { exit_code, message } => {
            json!({"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}})
        }
        InitReport::Running => json!({"running": {}}),
    };
    let ready = matches!(report, InitReport::Terminated { exit_code: 0, .. });
    let status = json!({"status": {"initContainerStatuses": [{
        "name": "ipsec-cleanup", "image": "kube-ovn", "imageID": "", "ready": ready,
        "restartCount": 0, "state": state}]}});
    Api::<Pod>::namespaced(admin.clone(), NS)
        .patch_status(pod_name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(api(format!("reporting {pod_name}'s init container")))?;
    Ok(())
}
