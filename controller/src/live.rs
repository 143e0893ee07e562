//! Kube glue for validation: API objects to the pure views of
//! [`crate::validate`], and the live reads behind a [`LiveContext`].
//!
//! Every read is a direct GET/LIST against the API server at reconcile time
//! (no informer cache): "live Pod" and "current template" mean what the API
//! server says now, not what a watch delivered a moment ago.

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::error::Result;
use crate::names;
use crate::validate::{CsrView, DaemonSetView, LiveContext, NodeView, PodView, Policy};

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
pub fn current_template_hash(ds: &DaemonSet, revisions: &[ControllerRevision]) -> Option<String> {
    let uid = ds.metadata.uid.as_deref()?;
    revisions
        .iter()
        .filter(|r| {
            r.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.controller == Some(true) && o.uid == uid))
        })
        .max_by_key(|r| r.revision)
        .and_then(|r| r.labels().get(names::TEMPLATE_HASH_LABEL).cloned())
}

/// Reads the live objects a CSR's validation needs. Reads nothing for a
/// requester that is not the CNI ServiceAccount or for a CSR without a token
/// binding: validation denies those before it looks at live state.
pub async fn fetch_live(
    client: &Client,
    csr: &CsrView,
    policy: &Policy,
    daemon_set: &str,
) -> Result<LiveContext> {
    let mut ctx = LiveContext::default();
    if csr.username != policy.requester() {
        return Ok(ctx);
    }
    let one = |key: &str| match csr.extra.get(key).map(Vec::as_slice) {
        Some([v]) if !v.is_empty() => Some(v.clone()),
        _ => None,
    };
    let (Some(pod_name), Some(node_name)) =
        (one(names::EXTRA_POD_NAME), one(names::EXTRA_NODE_NAME))
    else {
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
        let mut lp = ListParams::default();
        if let Some(labels) = ds
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
        {
            let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            lp = lp.labels(&selector.join(","));
        }
        let list = revisions.list(&lp).await?;
        ctx.daemon_set = Some(DaemonSetView {
            uid: ds.metadata.uid.clone().unwrap_or_default(),
            current_template_hash: current_template_hash(&ds, &list.items),
        });
    }
    Ok(ctx)
}
