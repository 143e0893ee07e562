//! Kube glue for validation: API objects to the pure views of
//! [`crate::validate`], and the live reads behind a [`LiveContext`].
//!
//! Two sources, one meaning ("what the API server says now"):
//! - [`fetch_live`]: direct GETs/LIST at reconcile time;
//! - [`LiveCache`]: watch-fed reflector stores of the CNI Pods, the Nodes,
//!   the DaemonSet and its ControllerRevisions. A store lags the API server
//!   by the watch delivery delay, so the reconciler uses it to *approve* and
//!   re-reads with [`fetch_live`] before it *denies* (a lagging cache can
//!   cost an extra GET, never a wrongful denial). docs/controller.md
//!   ("Live state") has the staleness reasoning.

use std::future::Future;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::error::Result;
use crate::names;
use crate::policy::Policy;
use crate::resync::resyncing;
use crate::validate::{CsrView, DaemonSetView, LiveContext, NodeView, PodView};

/// The pure view of a CSR object.
pub fn csr_view(csr: &CertificateSigningRequest) -> CsrView {
    let spec = &csr.spec;
    CsrView {
        name: csr.name_any(),
        signer_name: spec.signer_name.clone(),
        username: spec.username.clone().unwrap_or_default(),
        extra: spec.extra.clone().unwrap_or_default(),
        usages: spec.usages.clone().unwrap_or_default(),
        expiration_seconds: spec.expiration_seconds.map(i64::from),
        annotations: csr.metadata.annotations.clone().unwrap_or_default(),
        request: spec.request.0.clone(),
    }
}

/// The pure view of a Pod.
pub fn pod_view(pod: &Pod) -> PodView {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|refs| refs.iter().find(|r| r.controller == Some(true)))
        .filter(|r| r.kind == "DaemonSet" && r.api_version == "apps/v1")
        .map(|r| r.uid.clone());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodView {
        name: pod.name_any(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        owner_daemon_set_uid: owner,
        template_hash: pod.labels().get(names::TEMPLATE_HASH_LABEL).cloned(),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        finished: matches!(phase, Some("Succeeded") | Some("Failed")),
    }
}

/// The pure view of a Node.
pub fn node_view(node: &Node) -> NodeView {
    NodeView {
        name: node.name_any(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        chassis: node
            .annotations()
            .get(names::NODE_CHASSIS_ANNOTATION)
            .cloned(),
    }
}

/// The current template hash of a DaemonSet: the `controller-revision-hash`
/// of the newest ControllerRevision it controls.
pub fn current_template_hash<'a>(
    ds: &DaemonSet,
    revisions: impl IntoIterator<Item = &'a ControllerRevision>,
) -> Option<String> {
    let uid = ds.metadata.uid.as_deref()?;
    revisions
        .into_iter()
        .filter(|r| {
            r.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.controller == Some(true) && o.uid == uid))
        })
        .max_by_key(|r| r.revision)
        .and_then(|r| r.labels().get(names::TEMPLATE_HASH_LABEL).cloned())
}

/// A list of what `ds`'s `matchLabels` select (its Pods and
/// ControllerRevisions); everything when it has none.
pub fn selected_by(ds: &DaemonSet) -> ListParams {
    let mut lp = ListParams::default();
    if let Some(labels) = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
    {
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lp = lp.labels(&selector.join(","));
    }
    lp
}

/// The token-bound Pod and Node names, when the requester is the CNI
/// ServiceAccount and the binding is complete. `None` means validation denies
/// before it looks at live state, so nothing needs to be read.
fn binding(csr: &CsrView, policy: &Policy) -> Option<(String, String)> {
    if csr.username != policy.requester() {
        return None;
    }
    let one = |key: &str| match csr.extra.get(key).map(Vec::as_slice) {
        Some([v]) if !v.is_empty() => Some(v.clone()),
        _ => None,
    };
    Some((one(names::EXTRA_POD_NAME)?, one(names::EXTRA_NODE_NAME)?))
}

/// Reads the live objects a CSR's validation needs with direct GETs/LIST.
/// Reads nothing for a requester that is not the CNI ServiceAccount or for a
/// CSR without a token binding: validation denies those before it looks at
/// live state.
pub async fn fetch_live(
    client: &Client,
    csr: &CsrView,
    policy: &Policy,
    daemon_set: &str,
) -> Result<LiveContext> {
    let mut ctx = LiveContext::default();
    let Some((pod_name, node_name)) = binding(csr, policy) else {
        return Ok(ctx);
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &policy.cni_namespace);
    let nodes: Api<Node> = Api::all(client.clone());
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), &policy.cni_namespace);
    let (pod, node, ds) = tokio::try_join!(
        pods.get_opt(&pod_name),
        nodes.get_opt(&node_name),
        sets.get_opt(daemon_set)
    )?;
    ctx.pod = pod.as_ref().map(pod_view);
    ctx.node = node.as_ref().map(node_view);
    if let Some(ds) = ds {
        let revisions: Api<ControllerRevision> =
            Api::namespaced(client.clone(), &policy.cni_namespace);
        let list = revisions.list(&selected_by(&ds)).await?;
        ctx.daemon_set = Some(DaemonSetView {
            uid: ds.metadata.uid.clone().unwrap_or_default(),
            current_template_hash: current_template_hash(&ds, &list.items),
        });
    }
    Ok(ctx)
}

/// Watch-fed stores of everything [`fetch_live`] reads: the Pods, DaemonSets
/// and ControllerRevisions of the CNI namespace, and the Nodes. Cheap to
/// clone (the stores are shared).
#[derive(Clone)]
pub struct LiveCache {
    pods: Store<Pod>,
    nodes: Store<Node>,
    daemon_sets: Store<DaemonSet>,
    revisions: Store<ControllerRevision>,
    namespace: String,
}

impl LiveCache {
    /// Creates the stores and the future that keeps them fed (four watches,
    /// each relisting at least every `resync` and, with backoff, after an
    /// error: see [`crate::resync`]). Drive the future for as long as the
    /// cache is used; the stores are empty and not ready until each watch
    /// has delivered its initial list.
    pub fn start(
        client: &Client,
        namespace: &str,
        resync: std::time::Duration,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (pods, pods_w) = reflector::store();
        let (nodes, nodes_w) = reflector::store();
        let (daemon_sets, daemon_sets_w) = reflector::store();
        let (revisions, revisions_w) = reflector::store();
        let feed = futures::future::join4(
            drive(reflector::reflector(
                pods_w,
                relisting(
                    "pods",
                    Api::<Pod>::namespaced(client.clone(), namespace),
                    resync,
                ),
            )),
            drive(reflector::reflector(
                nodes_w,
                relisting("nodes", Api::<Node>::all(client.clone()), resync),
            )),
            drive(reflector::reflector(
                daemon_sets_w,
                relisting(
                    "daemonsets",
                    Api::<DaemonSet>::namespaced(client.clone(), namespace),
                    resync,
                ),
            )),
            drive(reflector::reflector(
                revisions_w,
                relisting(
                    "controllerrevisions",
                    Api::<ControllerRevision>::namespaced(client.clone(), namespace),
                    resync,
                ),
            )),
        )
        .map(drop);
        let cache = Self {
            pods,
            nodes,
            daemon_sets,
            revisions,
            namespace: namespace.to_owned(),
        };
        (cache, feed)
    }

    /// Waits until every store holds its initial list.
    pub async fn ready(&self) {
        let _ = futures::future::join4(
            self.pods.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.daemon_sets.wait_until_ready(),
            self.revisions.wait_until_ready(),
        )
        .await;
    }

    fn is_ready(&self) -> bool {
        self.ready().now_or_never().is_some()
    }

    /// The live context from the stores, as [`fetch_live`] would build it
    /// from direct reads; `None` while a store has not received its initial
    /// list (the caller then reads directly).
    pub fn lookup(&self, csr: &CsrView, policy: &Policy, daemon_set: &str) -> Option<LiveContext> {
        if !self.is_ready() {
            return None;
        }
        let mut ctx = LiveContext::default();
        let Some((pod_name, node_name)) = binding(csr, policy) else {
            return Some(ctx);
        };
        ctx.pod = self
            .pods
            .get(&ObjectRef::new(&pod_name).within(&self.namespace))
            .map(|p| pod_view(&p));
        ctx.node = self
            .nodes
            .get(&ObjectRef::new(&node_name))
            .map(|n| node_view(&n));
        ctx.daemon_set = self
            .daemon_sets
            .get(&ObjectRef::new(daemon_set).within(&self.namespace))
            .map(|ds| {
                // current_template_hash keeps only the revisions the
                // DaemonSet controls (owner UID), like the labelled LIST.
                let revisions = self.revisions.state();
                DaemonSetView {
                    uid: ds.metadata.uid.clone().unwrap_or_default(),
                    current_template_hash: current_template_hash(
                        &ds,
                        revisions.iter().map(|r| &**r),
                    ),
                }
            });
        Some(ctx)
    }
}

async fn drive<K, S>(stream: S)
where
    S: futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send,
{
    // The error was logged where the watch starts over (crate::resync).
    stream.default_backoff().for_each(|_| async {}).await;
}

/// One relisting watch of `api`: a new watcher (a new LIST) each time the
/// resync period passes or a watch fails.
fn relisting<K>(
    what: &'static str,
    api: Api<K>,
    resync: std::time::Duration,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    resyncing(
        what,
        move || watcher(api.clone(), watcher::Config::default()),
        resync,
    )
}
