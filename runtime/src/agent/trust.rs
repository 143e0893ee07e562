//! Follows ConfigMap `ovn-ipsec-trust` (key `ca.crt`, and the signing-CA
//! annotation of a rotation) into a watch channel the identity actor reads. A deleted ConfigMap or a missing key publishes
//! nothing: the actor keeps the trust it has (a garbage bundle is the
//! actor's to reject, with the reason in status).

use actors::identity::TrustSource;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kube_ovn_ipsec_api::names::k8s;
use tokio::sync::watch;

/// Watches `namespace/name` until `shutdown` fires, sending each new
/// `ca.crt` into `tx`. Watch errors are retried by kube-runtime's backoff.
pub async fn follow(
    client: Client,
    namespace: String,
    name: String,
    tx: watch::Sender<Option<TrustSource>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, config));
    futures::pin_mut!(stream);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ev = stream.next() => match ev {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, configmap = %name, "trust ConfigMap watch error; retrying"),
                Some(Ok(Event::Apply(cm) | Event::InitApply(cm))) => publish(&tx, &cm),
                Some(Ok(Event::Delete(_))) => tracing::warn!(configmap = %name, "trust ConfigMap deleted; keeping the current trust"),
                Some(Ok(Event::Init | Event::InitDone)) => {}
            }
        }
    }
}

fn publish(tx: &watch::Sender<Option<TrustSource>>, cm: &ConfigMap) {
    let Some(bundle) = cm
        .data
        .as_ref()
        .and_then(|d| d.get(k8s::TRUST_CONFIGMAP_KEY))
    else {
        tracing::warn!(
            key = k8s::TRUST_CONFIGMAP_KEY,
            "trust ConfigMap has no bundle key; keeping the current trust"
        );
        return;
    };
    let source = TrustSource {
        bundle_pem: bundle.as_bytes().to_vec(),
        signing_ca: cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k8s::SIGNING_CA_ANNOTATION))
            .cloned(),
    };
    // Only real changes wake the actor (a resync re-sends the same data).
    tx.send_if_modified(|cur| {
        if cur.as_ref() == Some(&source) {
            false
        } else {
            *cur = Some(source);
            true
        }
    });
}
