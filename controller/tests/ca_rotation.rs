//! `kube-ovn-ipsec-controller ca rotate` and `ca retire`, the binary's
//! subcommands run as the operator against the embedded API server (RBAC
//! on), with the controller running: the new CA joins the bundle, the
//! running controller switches to it and announces it on the trust
//! ConfigMap, new leaves come from it; retirement refuses a digest the
//! nodes did not acknowledge and then leaves only the new CA.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A blocking CLI against a real server in real time: wall-clock deadlines.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use apiserver::ADMIN_TOKEN;
use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};

/// Runs the controller binary's `ca` subcommand `args` with `kubeconfig`.
fn ca(kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"))
        .args(["--namespace", NS, "ca"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

async fn trust(c: &Cluster) -> (TrustBundle, Option<String>) {
    let cm = Api::<ConfigMap>::namespaced(c.admin.clone(), NS)
        .get(k8s::TRUST_CONFIGMAP)
        .await
        .unwrap();
    let bundle =
        TrustBundle::from_pem(cm.data.unwrap()[k8s::TRUST_CONFIGMAP_KEY].as_bytes()).unwrap();
    let signing = cm
        .metadata
        .annotations
        .and_then(|a| a.get(k8s::SIGNING_CA_ANNOTATION).cloned());
    (bundle, signing)
}

async fn active_ca(c: &Cluster) -> Certificate {
    let s = Api::<Secret>::namespaced(c.admin.clone(), NS)
        .get(k8s::CA_SECRET)
        .await
        .unwrap();
    Certificate::from_pem(&s.data.unwrap()["tls.crt"].0).unwrap()
}

async fn issue(c: &Cluster, name: &str) -> Certificate {
    let node = &c.nodes[0];
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    Api::<CertificateSigningRequest>::all(node.client.clone())
        .create(
            &PostParams::default(),
            &csr_object(name, node, &request_pem(&key, &node.chassis), 86400),
        )
        .await
        .unwrap();
    match wait_outcome(&c.admin, name).await {
        Outcome::Issued(pem) => Certificate::from_pem(&pem).unwrap(),
        other => panic!("{name}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotate_then_retire_through_the_cli() {
    let mut c = Cluster::start(1).await;
    let config = c.config_with(&["--ca-reload", "1s"]);
    c.start_controller(config).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin.kubeconfig");
    c.server.write_kubeconfig(&admin, ADMIN_TOKEN).unwrap();

    // At start: the controller's CA, announced.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Ok(cm) = Api::<ConfigMap>::namespaced(c.admin.clone(), NS)
            .get(k8s::TRUST_CONFIGMAP)
            .await
            && cm.metadata.annotations.is_some()
        {
            break active_ca(&c).await;
        }
        assert!(Instant::now() < deadline, "no trust bundle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (bundle, signing) = trust(&c).await;
    assert_eq!(bundle.certificates().len(), 1);
    assert_eq!(signing, Some(first.digest().to_hex()));
    issue(&c, "ovn-ipsec-before")
        .await
        .verify_issued_by(&first)
        .unwrap();

    let out = ca(&admin, &["rotate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let second = active_ca(&c).await;
    assert_ne!(second.der(), first.der());
    let (both, _) = trust(&c).await;
    assert_eq!(both.certificates().len(), 2);
    assert!(both.contains(first.der()) && both.contains(second.der()));
    assert!(
        stdout.contains(&format!("new trust digest: {}", both.digest().to_hex())),
        "{stdout}"
    );
    // The running controller switches, then announces.
    let deadline = Instant::now() + Duration::from_secs(10);
    while trust(&c).await.1 != Some(second.digest().to_hex()) {
        assert!(Instant::now() < deadline, "the new CA was not announced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    issue(&c, "ovn-ipsec-after")
        .await
        .verify_issued_by(&second)
        .unwrap();

    // A digest the nodes did not acknowledge: refused, nothing changes.
    let out = ca(
        &admin,
        &["retire", "--acknowledged-digest", &"0".repeat(64)],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not the acknowledged"), "{stderr}");
    assert_eq!(trust(&c).await.0, both);

    let digest = both.digest().to_hex();
    let out = ca(&admin, &["retire", "--acknowledged-digest", &digest]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (retired, signing) = trust(&c).await;
    assert_eq!(retired.certificates().len(), 1);
    assert!(retired.contains(second.der()));
    assert_eq!(signing, Some(second.digest().to_hex()));
    // Only the active CA left: a second retirement is refused.
    let out = ca(
        &admin,
        &[
            "retire",
            "--acknowledged-digest",
            &retired.digest().to_hex(),
        ],
    );
    assert!(!out.status.success());
    c.stop().await;
}
