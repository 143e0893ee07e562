//! The node side of the cluster's coordination (SPEC §7): follows
//! ConfigMap `ovn-ipsec-coordination` into the node coordinator's
//! [`RecordView`], and signs and publishes its receipts on the Node.
//!
//! The agent only reads the record (RBAC: configmaps get/list/watch in the
//! controller's namespace) and patches its own Node's annotation — what
//! kube-ovn-cni's ServiceAccount may already do.

use std::path::Path;

use actors::coordinator::ReceiptPort;
use actors::coordinator::plan::RecordView;
use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kube_ovn_ipsec_api::coordination::{CoordinationRecord, Receipt};
use kube_ovn_ipsec_api::names::{defaults, k8s};
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_api::signed::{self, SignedPayload, SigningKey};
use tokio::sync::watch;

/// Watches the coordination ConfigMap `namespace/name` until `shutdown`
/// fires, sending what it holds into `tx`. Watch errors are retried by
/// kube-runtime's backoff and keep the last view.
pub async fn follow(
    client: Client,
    namespace: String,
    name: String,
    tx: watch::Sender<RecordView>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, config));
    futures::pin_mut!(stream);
    // Until the initial list completes, "no event" means "not read yet".
    let mut seen = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ev = stream.next() => match ev {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, configmap = %name, "coordination ConfigMap watch error; retrying"),
                Some(Ok(Event::Apply(cm) | Event::InitApply(cm))) => {
                    seen = true;
                    send(&tx, view_of(&cm));
                }
                Some(Ok(Event::Delete(_))) => send(&tx, RecordView::Absent),
                Some(Ok(Event::InitDone)) if !seen => send(&tx, RecordView::Absent),
                Some(Ok(Event::Init)) => seen = false,
                Some(Ok(Event::InitDone)) => {}
            }
        }
    }
}

fn send(tx: &watch::Sender<RecordView>, view: RecordView) {
    tx.send_if_modified(|cur| {
        let changed = *cur != view;
        if changed {
            if let RecordView::Invalid(why) = &view {
                tracing::warn!(reason = %why, "the coordination record is unusable; this node waits");
            }
            *cur = view;
        }
        changed
    });
}

/// What a coordination ConfigMap says, judged without trusting it.
pub fn view_of(cm: &ConfigMap) -> RecordView {
    let Some(state) = cm
        .data
        .as_ref()
        .and_then(|d| d.get(k8s::COORDINATION_CONFIGMAP_KEY))
    else {
        return RecordView::Absent;
    };
    if state.len() > defaults::COORDINATION_MAX_BYTES {
        return RecordView::Invalid(format!(
            "key {} is {} bytes, over the {} byte cap",
            k8s::COORDINATION_CONFIGMAP_KEY,
            state.len(),
            defaults::COORDINATION_MAX_BYTES
        ));
    }
    match CoordinationRecord::decode(state.as_bytes()) {
        Ok(r) => RecordView::Present(Box::new(r)),
        Err(e) => RecordView::Invalid(format!(
            "key {} does not decode: {e}",
            k8s::COORDINATION_CONFIGMAP_KEY
        )),
    }
}

/// A fresh read of the coordination ConfigMap `name` (not a watch):
/// `Absent` when it does not exist.
pub async fn read_view(maps: &Api<ConfigMap>, name: &str) -> Result<RecordView, kube::Error> {
    Ok(match maps.get_opt(name).await? {
        Some(cm) => view_of(&cm),
        None => RecordView::Absent,
    })
}

/// [`ReceiptPort`] on the Kubernetes API: this Node's
/// `kube-ovn.io/ipsec-receipt`, written with the Node's resourceVersion;
/// the record read from ConfigMap `namespace/configmap`.
#[derive(Debug, Clone)]
pub struct KubeReceipts {
    nodes: Api<Node>,
    node_name: String,
    maps: Api<ConfigMap>,
    configmap: String,
}

impl KubeReceipts {
    /// Publishes on Node `node_name`; reads the record from
    /// `namespace/configmap`.
    pub fn new(client: Client, node_name: &str, namespace: &str, configmap: &str) -> Self {
        KubeReceipts {
            nodes: Api::all(client.clone()),
            node_name: node_name.to_owned(),
            maps: Api::namespaced(client, namespace),
            configmap: configmap.to_owned(),
        }
    }
}

fn receipt_err(what: &str, e: impl std::fmt::Display) -> actors::Error {
    actors::Error::Receipt(format!("{what}: {e}"))
}

/// Signs `receipt` (a [`Receipt`] or a release receipt) with the PEM
/// private key in `key`, refusing a key that is not `certificate`'s; the
/// annotation value, size-capped.
pub fn sign_receipt<T: SignedPayload>(
    receipt: &T,
    key: &Path,
    certificate: &Certificate,
) -> actors::Result<String> {
    let pem = std::fs::read(key).map_err(|e| receipt_err("reading the private key", e))?;
    let key =
        SigningKey::from_pkcs8_pem(&pem).map_err(|e| receipt_err("loading the private key", e))?;
    if !key.matches_certificate(certificate) {
        return Err(actors::Error::Receipt(
            "the private key does not belong to the certificate the receipt names".into(),
        ));
    }
    let annotation = signed::sign(receipt, &key).map_err(|e| receipt_err("signing", e))?;
    if annotation.len() > defaults::RECEIPT_MAX_BYTES {
        return Err(actors::Error::Receipt(format!(
            "the signed receipt is {} bytes, over the {} byte cap",
            annotation.len(),
            defaults::RECEIPT_MAX_BYTES
        )));
    }
    Ok(annotation)
}

#[async_trait]
impl ReceiptPort for KubeReceipts {
    async fn publish(
        &self,
        receipt: &Receipt,
        key: &Path,
        certificate: &Certificate,
    ) -> actors::Result<()> {
        let (receipt, key, certificate) = (receipt.clone(), key.to_owned(), certificate.clone());
        let annotation =
            tokio::task::spawn_blocking(move || sign_receipt(&receipt, &key, &certificate))
                .await
                .map_err(|e| actors::Error::BlockingTask(e.to_string()))??;
        annotate_node(
            &self.nodes,
            &self.node_name,
            k8s::ANNOTATION_RECEIPT,
            &annotation,
        )
        .await
    }

    async fn current_record(&self) -> actors::Result<RecordView> {
        read_view(&self.maps, &self.configmap)
            .await
            .map_err(|e| receipt_err("reading the coordination record", e))
    }
}

/// Sets annotation `key` of Node `name` to `value`, conditionally on the
/// Node as read: the resourceVersion makes a concurrent writer's change
/// fail the patch (409) instead of being overwritten blindly; the caller
/// reads again and retries.
pub async fn annotate_node(
    nodes: &Api<Node>,
    name: &str,
    key: &str,
    value: &str,
) -> actors::Result<()> {
    let node = nodes
        .get(name)
        .await
        .map_err(|e| receipt_err("reading the Node", e))?;
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": { key: value },
        }
    });
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| receipt_err("patching the Node", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cm(state: Option<&str>) -> ConfigMap {
        ConfigMap {
            data: state.map(|s| BTreeMap::from([("state".to_owned(), s.to_owned())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_configmap_is_judged_without_trusting_it() {
        assert_eq!(view_of(&cm(None)), RecordView::Absent);
        let RecordView::Invalid(why) = view_of(&cm(Some("{not json"))) else {
            panic!("garbage accepted")
        };
        assert!(why.contains("does not decode"), "{why}");
        let big = "x".repeat(defaults::COORDINATION_MAX_BYTES + 1);
        let RecordView::Invalid(why) = view_of(&cm(Some(&big))) else {
            panic!("oversized accepted")
        };
        assert!(why.contains("cap"), "{why}");
        let r = CoordinationRecord::initial();
        assert_eq!(
            view_of(&cm(Some(&r.encode().unwrap()))),
            RecordView::Present(Box::new(r))
        );
    }

    #[test]
    fn a_receipt_is_signed_only_with_the_key_of_the_certificate_it_names() {
        use kube_ovn_ipsec_api::test_util::TestCa;
        let dir = tempfile::tempdir().unwrap();
        let (mine, other) = (TestCa::p256("mine"), TestCa::p256("other"));
        let key = dir.path().join("key.pem");
        std::fs::write(&key, mine.key_pem()).unwrap();
        let cert = Certificate::from_pem(mine.cert_pem().as_bytes()).unwrap();
        let receipt: Receipt = serde_json::from_value(serde_json::json!({
            "generation": 1, "epoch": 2, "phase": "Prepare", "nodeName": "n1",
            "nodeUID": "0b0e6a3c-1111-4222-8333-444455556601",
            "podUID": "0b0e6a3c-1111-4222-8333-444455556602",
            "csrName": "ovn-ipsec-x", "csrUID": "0b0e6a3c-1111-4222-8333-444455556603",
            "templateHash": "h", "trustHash": cert.digest().to_hex(),
            "observed": "2026-12-02T00:00:00Z",
            "status": {"identityReady": true, "capabilityVerified": true,
                       "protectionArmed": false, "configurationApplied": false,
                       "runtimeHealthy": false, "certificateDigest": cert.digest().to_hex()}
        }))
        .unwrap();
        let annotation = sign_receipt(&receipt, &key, &cert).unwrap();
        let back: Receipt = signed::verify(&annotation, &cert).unwrap();
        assert_eq!(back, receipt);
        let theirs = Certificate::from_pem(other.cert_pem().as_bytes()).unwrap();
        let e = sign_receipt(&receipt, &key, &theirs).unwrap_err();
        assert!(e.to_string().contains("does not belong"), "{e}");
        let e = sign_receipt(&receipt, &dir.path().join("missing.pem"), &cert).unwrap_err();
        assert!(e.to_string().contains("reading the private key"), "{e}");
    }
}
