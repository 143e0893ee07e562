//! Warning Events on the objects the controller judges (CSRs, Nodes, the
//! coordination ConfigMap): in the object's namespace, or in `default`
//! where Events of cluster-scoped objects go. Best effort: an Event that
//! cannot be written never changes an outcome.

use kube::{Api, Client};

/// The object an Event is about.
#[derive(Debug, Clone, Copy)]
pub struct Involved<'a> {
    /// `apiVersion`, e.g. `v1`.
    pub api_version: &'a str,
    /// `kind`, e.g. `Node`.
    pub kind: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.namespace`; `None` for a cluster-scoped object.
    pub namespace: Option<&'a str>,
    /// `metadata.uid`, if known.
    pub uid: Option<&'a str>,
}

/// Publishes a core/v1 Warning Event about `on` (message capped at 1000
/// characters).
pub async fn warning(
    client: &Client,
    component: &str,
    on: Involved<'_>,
    reason: &str,
    message: &str,
) {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let namespace = on.namespace.unwrap_or("default");
    let event = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": { "generateName": format!("{}.", on.name), "namespace": namespace },
        "involvedObject": {
            "apiVersion": on.api_version,
            "kind": on.kind,
            "name": on.name,
            "namespace": on.namespace,
            "uid": on.uid,
        },
        "type": "Warning",
        "reason": reason,
        "message": message.chars().take(1000).collect::<String>(),
        "source": { "component": component },
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let Ok(event) = serde_json::from_value::<k8s_openapi::api::core::v1::Event>(event) else {
        return;
    };
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), namespace);
    if let Err(e) = events
        .create(&kube::api::PostParams::default(), &event)
        .await
    {
        tracing::debug!(error = %e, reason, "could not publish an Event");
    }
}
