//! No PEM and no token reaches the agent's log: the agent's own logger
//! ([`kube_ovn_ipsec_runtime::cli::log_layer`]) at TRACE for every target, installed for
//! this whole process, while the agent's Kubernetes paths meet broken
//! objects on the embedded API server — the trust ConfigMap with its
//! bundle where a map belongs, a CSR whose issued certificate has the
//! wrong type — through a client the agent builds from a kubeconfig with a
//! token file (the in-cluster ServiceAccount's mechanism), and with token
//! files the API server does not know or no header can carry. Every line
//! is checked for `-----BEGIN`, the PEM's base64 and the tokens; the trust
//! watch's warning still names the ConfigMap.
//!
//! The broken objects are written into the server's store below its
//! validation, which refuses them as kube-apiserver does.
//!
//! And the agent's client configuration ([`kube_ovn_ipsec_runtime::k8s_client`])
//! refuses a kubeconfig whose static token breaks its YAML or no header can
//! carry, naming the file and not the token.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A real server in real time: wall-clock waits.
#![allow(clippy::disallowed_methods)]

use kube_ovn_ipsec_api::logsafe::LogCapture;
use std::path::{Path, PathBuf};
use std::time::Duration;

use actors::ports::CsrApi as _;
use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerHandle, kube_ovn};
use k8s_openapi::ByteString;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_runtime::agent::config::NodeArgs;
use kube_ovn_ipsec_runtime::agent::kube_csr::KubeCsrApi;
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Base64 as the API stores bytes.
fn b64(bytes: &[u8]) -> String {
    serde_json::to_value(ByteString(bytes.to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// Writes `object` into the store as it is (resource of kind `kind`).
fn store(server: &ApiServerHandle, kind: &str, namespace: &str, name: &str, object: Value) {
    let i = apiserver::RESOURCES
        .iter()
        .position(|d| d.kind == kind)
        .unwrap();
    server
        .store()
        .write(i, namespace, name, |_| Ok(apiserver::Write::Put(object)))
        .unwrap();
}

/// A kubeconfig whose user reads its token from `token_file`.
fn kubeconfig(dir: &Path, name: &str, server: &ApiServerHandle, token_file: &Path) -> PathBuf {
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server.url(),
            "certificate-authority-data": b64(server.ca_pem().as_bytes())}}],
        "users": [{"name": "u", "user": {"tokenFile": token_file}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    });
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

fn node_args(kubeconfig: PathBuf) -> NodeArgs {
    NodeArgs {
        node_name: "node-0".into(),
        pod_name: "kube-ovn-cni-0".into(),
        pod_namespace: kube_ovn::NS.into(),
        pod_uid: "uid".into(),
        key_dir: PathBuf::from("/nonexistent"),
        ovsdb: "unix:/nonexistent".into(),
        trust_namespace: kube_ovn::NS.into(),
        coordination_namespace: None,
        pod_template_hash: None,
        kubeconfig: Some(kubeconfig),
        ike_rundir: PathBuf::from("/nonexistent"),
        xfrm_netns: None,
    }
}

/// Follows the trust ConfigMap with `client` for `for_how_long`, as the
/// agent does.
async fn follow_trust(client: kube::Client, for_how_long: Duration) {
    let (tx, _rx) = tokio::sync::watch::channel(None);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(kube_ovn_ipsec_runtime::agent::trust::follow(
        client,
        kube_ovn::NS.into(),
        k8s::TRUST_CONFIGMAP.into(),
        tx,
        stopped,
    ));
    tokio::time::sleep(for_how_long).await;
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_objects_and_tokens_leave_no_pem_and_no_token_in_the_agents_log() {
    harness::use_agent_binary!();
    let capture = LogCapture::default();
    let writer = capture.clone();
    tracing_subscriber::registry()
        .with(kube_ovn_ipsec_runtime::cli::log_layer(
            tracing_subscriber::EnvFilter::new("trace"),
            move || writer.clone(),
        ))
        .init();

    let server = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = server.client(ADMIN_TOKEN).await.unwrap();
    let (nodes, _) = kube_ovn::populate(&server, &admin, 1).await.unwrap();
    let node = &nodes[0];

    let ca = kube_ovn_ipsec_api::test_util::TestCa::p256("ipsec-test-ca");
    let pem = ca.cert_pem();
    store(
        &server,
        "ConfigMap",
        kube_ovn::NS,
        k8s::TRUST_CONFIGMAP,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": k8s::TRUST_CONFIGMAP, "namespace": kube_ovn::NS},
               "data": pem}),
    );
    let csr = "ovn-ipsec-broken";
    store(
        &server,
        "CertificateSigningRequest",
        "",
        csr,
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"name": csr},
               "spec": {"request": b64(pem.as_bytes()), "signerName": "kubeovn.io/signer",
                        "usages": ["ipsec tunnel"]},
               "status": {"certificate": {"pem": b64(pem.as_bytes())}}}),
    );

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &node.token).unwrap();
    let args = node_args(kubeconfig(dir.path(), "good", &server, &token_file));
    let client = kube_ovn_ipsec_runtime::agent::run::kube_client(&args)
        .await
        .unwrap();
    follow_trust(client.clone(), Duration::from_secs(2)).await;
    let waited = KubeCsrApi::new(client)
        .wait(csr, Duration::from_secs(2))
        .await;
    println!("CSR wait: {waited:?}");

    let unknown = format!("{}x", &node.token[..node.token.len() - 1]);
    let unsendable = "broken-agent-token-77\u{1}";
    for (name, token) in [("unknown", unknown.as_str()), ("unsendable", unsendable)] {
        let file = dir.path().join(format!("{name}-token"));
        std::fs::write(&file, token).unwrap();
        let args = node_args(kubeconfig(dir.path(), name, &server, &file));
        let client = kube_ovn_ipsec_runtime::agent::run::kube_client(&args)
            .await
            .unwrap();
        follow_trust(client, Duration::from_secs(1)).await;
    }
    server.shutdown().await;

    let text = capture.text();
    assert!(
        text.contains("\"level\":\"TRACE\""),
        "captured nothing at TRACE"
    );
    let trust_warning = text
        .lines()
        .find(|l| l.contains("trust ConfigMap watch error"))
        .unwrap_or_else(|| panic!("no trust watch warning:\n{text}"));
    assert!(
        trust_warning.contains(k8s::TRUST_CONFIGMAP),
        "{trust_warning}"
    );
    let encoded = b64(pem.as_bytes());
    let mut forbidden = vec![
        "-----BEGIN".to_owned(),
        node.token.clone(),
        unknown,
        "broken-agent-token-77".to_owned(),
    ];
    forbidden.extend(
        pem.lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            .map(str::to_owned),
    );
    forbidden.extend(
        encoded
            .as_bytes()
            .chunks(20)
            .filter(|c| c.len() == 20)
            .map(|c| String::from_utf8(c.to_vec()).unwrap()),
    );
    for f in forbidden {
        if let Some(line) = text.lines().find(|l| l.contains(&f)) {
            panic!("the agent's log holds {f:?}:\n{line}");
        }
    }
}

/// A kubeconfig with static token `token`.
fn static_token_kubeconfig(dir: &Path, name: &str, token: &str) -> PathBuf {
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    });
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

/// The agent's client configuration refuses a kubeconfig that does not
/// parse and a token no header can carry with an error that names the
/// file and not the token (kube-rs' own would quote it, or panic).
#[tokio::test]
async fn a_broken_kubeconfig_token_is_refused_without_quoting_it() {
    harness::use_agent_binary!();
    let dir = tempfile::tempdir().unwrap();
    for (name, token, expected) in [
        (
            "yaml",
            "agent-secret-token-1\u{7f}",
            "is not valid YAML (the parser's message is not shown",
        ),
        (
            "header",
            "agent-secret-token-2\nsecond-line",
            "is not a valid HTTP header value",
        ),
    ] {
        let path = static_token_kubeconfig(dir.path(), name, token);
        // The agent's own client builder (`run` and `cleanup` use it).
        let err = kube_ovn_ipsec_runtime::agent::run::kube_client(&node_args(path.clone()))
            .await
            .err()
            .unwrap_or_else(|| panic!("{name}: a client was built"))
            .to_string();
        assert!(err.contains(expected), "{name}: {err}");
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
        assert!(!err.contains("agent-secret-token"), "{name}: {err}");
    }
    let fine = static_token_kubeconfig(dir.path(), "fine", "a-valid-token");
    kube_ovn_ipsec_runtime::agent::run::kube_client(&node_args(fine))
        .await
        .unwrap();
}
