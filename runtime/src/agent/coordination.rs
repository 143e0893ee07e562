//! The node side of the cluster's coordination (SPEC §7): follows
//! ConfigMap `ovn-ipsec-coordination` into the node coordinator's
//! [`RecordView`], and signs and publishes its receipts on the Node.
//!
//! The agent only reads the record (RBAC: configmaps get/list/watch in the
//! controller's namespace) and patches its own Node's annotation — what
//! kube-ovn-cni's ServiceAccount may already do.

use std::path::Path;

use crate::node::{annotate_node, read_view, receipt_err, sign_receipt, view_of};
use actors::coordinator::ReceiptPort;
use actors::coordinator::plan::RecordView;
use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kube_ovn_ipsec_api::coordination::Receipt;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::Certificate;
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
