//! The `kube-ovn-ipsec-lab apiserver` subcommand: prints its address, writes a
//! kubeconfig that kubectl and kube-rs accept, and stops on SIGTERM.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use tokio::io::AsyncBufReadExt;

#[tokio::test]
async fn serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-lab"))
        .args(["apiserver", "--listen", "127.0.0.1:0", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("https://{addr}/"));
    let nss: Api<Namespace> = Api::all(kube::Client::try_from(config).unwrap());
    assert!(nss.list(&ListParams::default()).await.unwrap().items.len() >= 4);

    let kubectl = testbed::require_program("kubectl").expect("kubectl is required for this test");
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .args(["get", "ns", "kube-system", "-o", "name"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "namespace/kube-system"
    );

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}
