//! What the agent (`run`) and the cleanup share about their node: the
//! flags that say who and where it is, the coordination record as the node
//! reads it (judged, never trusted), and the node's signed receipts
//! published on its Node. Neither mode reaches into the other's module
//! for these.

use std::path::{Path, PathBuf};

use actors::coordinator::plan::RecordView;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_ovn_ipsec_api::coordination::CoordinationRecord;
use kube_ovn_ipsec_api::names::{defaults, host, k8s};
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_api::signed::{self, SignedPayload, SigningKey};

/// Flags `run` and `cleanup` share: who and where this node is, and where
/// the state the agent keeps lives.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// This node's name (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// This Pod's name (downward API `metadata.name`).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// This Pod's namespace (downward API `metadata.namespace`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: String,
    /// This Pod's UID (downward API `metadata.uid`); part of the CSR name.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: String,
    /// Key directory. Hosts with a read-only `/etc` (Talos) use
    /// `/var/lib/ovs_ipsec_keys`.
    #[arg(long, env = host::ENV_KEY_DIR, default_value = host::DEFAULT_KEY_DIR)]
    pub key_dir: PathBuf,
    /// The local Open_vSwitch database.
    #[arg(
        long,
        env = "OVSDB_REMOTE",
        default_value = "unix:/run/openvswitch/db.sock"
    )]
    pub ovsdb: String,
    /// Namespace of ConfigMap `ovn-ipsec-trust` (the controller's).
    #[arg(long, env = "OVN_IPSEC_TRUST_NAMESPACE", default_value = "kube-system")]
    pub trust_namespace: String,
    /// Namespace of ConfigMap `ovn-ipsec-coordination` (the controller's;
    /// default: the trust namespace).
    #[arg(long, env = "OVN_IPSEC_COORDINATION_NAMESPACE")]
    pub coordination_namespace: Option<String>,
    /// This Pod's template hash (downward API
    /// `metadata.labels['controller-revision-hash']`): a receipt names it
    /// and the controller checks it against the frozen template.
    #[arg(long, env = "POD_TEMPLATE_HASH")]
    pub pod_template_hash: Option<String>,
    /// A kubeconfig to use instead of the in-cluster ServiceAccount (the lab
    /// and tests).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// strongSwan's run directory as the agent sees it (stale
    /// `charon.pid` / `starter.charon.pid` of a killed daemon are removed
    /// from it before a restart).
    #[arg(long, default_value = "/var/run")]
    pub ike_rundir: PathBuf,
    /// Open the XFRM socket in this named network namespace
    /// (`/run/netns/<name>`) instead of the agent's own. Lab and tests.
    #[arg(long)]
    pub xfrm_netns: Option<String>,
}

impl NodeArgs {
    /// The coordination record's namespace: `--coordination-namespace`, or
    /// the trust namespace.
    pub fn coordination_namespace(&self) -> String {
        self.coordination_namespace
            .clone()
            .unwrap_or_else(|| self.trust_namespace.clone())
    }

    /// The IKE daemon's pidfiles in `--ike-rundir`.
    pub fn ike_pidfiles(&self) -> Vec<PathBuf> {
        vec![
            self.ike_rundir.join("charon.pid"),
            self.ike_rundir.join("starter.charon.pid"),
        ]
    }
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

/// A receipt failure: what was being done, and why.
pub(crate) fn receipt_err(what: &str, e: impl std::fmt::Display) -> actors::Error {
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
    use kube_ovn_ipsec_api::coordination::Receipt;
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
