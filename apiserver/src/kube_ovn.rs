//! A Kube-OVN-shaped cluster on the embedded API server, for the tests,
//! the benches and the lab: the chart's ServiceAccounts and RBAC (the
//! controller's and the CNI's, from [`chart`]), the chart's `kube-ovn-cni`
//! DaemonSet with its ControllerRevisions, Nodes with
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
use crate::chart;

/// The namespace of the CNI DaemonSet and the controller.
pub const NS: &str = "kube-system";
/// The controller's ServiceAccount.
pub const CONTROLLER_SA: &str = "kube-ovn-ipsec-controller";
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
    /// The CNI Pod's template hash (its `controller-revision-hash` label).
    pub template_hash: String,
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
            .field("template_hash", &self.template_hash)
            .finish_non_exhaustive()
    }
}

impl CniNode {
    /// What the downward API gives a container of this node's CNI Pod.
    pub fn pod_fields(&self) -> chart::PodFields<'_> {
        chart::PodFields {
            node_name: &self.name,
            pod_name: &self.pod_name,
            namespace: NS,
            pod_uid: &self.pod_uid,
            template_hash: &self.template_hash,
        }
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

/// The chart's ServiceAccounts and RBAC objects (the same in every
/// render), as `kubectl apply` of the chart would create them.
fn rbac() -> Result<Vec<Value>> {
    let rendered =
        chart::Rendered::of(Shape::Ipsec).map_err(|e| ClusterError::Unexpected(e.to_string()))?;
    Ok(rendered.rbac())
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
    for obj in rbac()? {
        create(admin, obj).await?;
    }
    // The chart's DaemonSet with IPsec on, as applied (a DaemonSet
    // controller's status is not simulated).
    let mut ds = chart::Rendered::of(Shape::Ipsec)
        .and_then(|r| r.find("DaemonSet", DAEMON_SET))
        .cloned()
        .map_err(|e| ClusterError::Unexpected(e.to_string()))?;
    ds["metadata"]["namespace"] = json!(NS);
    let ds = create(admin, ds).await?;
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
    let mut pod_spec = Shape::Ipsec.pod_spec()?;
    pod_spec["nodeName"] = json!(name);
    let pod = create(
        admin,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": NS,
                         "labels": {"app": DAEMON_SET, "controller-revision-hash": HASH},
                         "ownerReferences": owned_by(ds_uid)},
            "spec": pod_spec}),
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
        template_hash: HASH.to_owned(),
        token,
        client,
    })
}

pub use crate::chart::Shape;

impl Shape {
    /// The Pod spec of this shape, as the chart renders it
    /// ([`chart::Rendered::of`]).
    pub fn pod_spec(self) -> Result<Value> {
        chart::Rendered::of(self)
            .and_then(chart::Rendered::daemon_set_pod_spec)
            .cloned()
            .map_err(|e| ClusterError::Unexpected(e.to_string()))
    }

    /// The DaemonSet template patch that makes this shape the template: a
    /// merge patch replaces lists whole, and a list this shape does not
    /// have (the other shape's `initContainers`) is removed.
    fn template_patch(self) -> Result<Value> {
        let mut spec = self.pod_spec()?;
        if spec.get("initContainers").is_none() {
            spec["initContainers"] = Value::Null;
        }
        Ok(json!({"spec": {"template": {"spec": spec}}}))
    }
}

/// Makes `shape` under template hash `hash` the DaemonSet's Pod template,
/// as applying the chart does: the template, and the ControllerRevision
/// `kube-ovn-cni-<hash>` made the newest (an existing one, as for a
/// template reverted to, gets the next revision number). The Pods are
/// rolled separately ([`replace_pod`]).
pub async fn set_template(admin: &Client, ds_uid: &str, shape: Shape, hash: &str) -> Result<()> {
    let sets: Api<DaemonSet> = Api::namespaced(admin.clone(), NS);
    let template = shape.template_patch()?;
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
    let mut spec = shape.pod_spec()?;
    spec["nodeName"] = json!(node.name);
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
    node.template_hash = hash.to_owned();
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
