//! kubectl, a real independent client, against the embedded API server.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use apiserver::{ADMIN_TOKEN, ApiServerHandle, Identity};
use common::{csr, server};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(server: &ApiServerHandle, token: &str) -> Self {
        let bin = testbed::require_program("kubectl").expect("kubectl is required for these tests");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, token).unwrap();
        Kubectl {
            bin,
            kubeconfig,
            dir,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env("HOME", self.dir.path())
            .stdin(Stdio::null());
        c
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut c = tokio::process::Command::from(self.cmd(args));
        tokio::time::timeout(Duration::from_secs(30), c.output())
            .await
            .expect("kubectl timed out")
            .unwrap()
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn write(&self, name: &str, value: &serde_json::Value) -> String {
        let path: PathBuf = self.dir.path().join(name);
        std::fs::write(&path, serde_json::to_string_pretty(value).unwrap()).unwrap();
        path_str(&path)
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

#[tokio::test]
async fn get_create_apply_patch_delete() {
    let s = server(false, &[]).await;
    let k = Kubectl::new(&s, ADMIN_TOKEN);
    let out = k.ok(&["get", "namespaces"]).await;
    assert!(
        out.contains("kube-system") && out.contains("default"),
        "{out}"
    );
    let out = k.ok(&["version", "-o", "json"]).await;
    assert!(out.contains("serverVersion"), "{out}");

    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "k1", "namespace": "default"}, "data": {"a": "1"}});
    let file = k.write("cm.json", &manifest);
    let out = k.ok(&["create", "-f", &file]).await;
    assert!(out.contains("configmap/k1 created"), "{out}");
    let out = k.ok(&["get", "configmap", "k1", "-o", "json"]).await;
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["data"]["a"], "1");

    // Client-side apply: creates with the last-applied annotation, then sends a strategic merge patch.
    let mut applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "k2", "namespace": "default"}, "data": {"a": "1", "b": "2"}});
    let file = k.write("apply.json", &applied);
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(out.contains("configmap/k2 created"), "{out}");
    applied["data"] = json!({"a": "9"});
    let file = k.write("apply.json", &applied);
    let out = k.ok(&["apply", "-f", &file]).await;
    assert!(out.contains("configmap/k2 configured"), "{out}");
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let k2 = cms.get("k2").await.unwrap();
    assert_eq!(
        k2.data.unwrap(),
        [("a".to_string(), "9".to_string())].into()
    );
    assert!(
        k2.metadata
            .annotations
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );

    let out = k
        .ok(&["patch", "configmap", "k1", "-p", r#"{"data":{"b":"2"}}"#])
        .await;
    assert!(out.contains("patched"), "{out}");
    k.ok(&[
        "patch",
        "configmap",
        "k1",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"c":"3"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "configmap",
        "k1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/data/a"}]"#,
    ])
    .await;
    let data = cms.get("k1").await.unwrap().data.unwrap();
    assert_eq!(
        data,
        [
            ("b".to_string(), "2".to_string()),
            ("c".to_string(), "3".to_string())
        ]
        .into()
    );

    let out = k.ok(&["label", "configmap", "k1", "tier=x"]).await;
    assert!(out.contains("labeled"), "{out}");
    let out = k
        .ok(&["get", "configmaps", "-l", "tier=x", "-o", "name"])
        .await;
    assert_eq!(out.trim(), "configmap/k1");

    let out = k.ok(&["delete", "configmap", "k1"]).await;
    assert!(out.contains("deleted"), "{out}");
    let out = k.run(&["get", "configmap", "k1"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.shutdown().await;
}

#[tokio::test]
async fn get_watch_prints_a_change() {
    let s = server(false, &[]).await;
    let k = Kubectl::new(&s, ADMIN_TOKEN);
    let cms: Api<ConfigMap> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "w0"}})).unwrap(),
    )
    .await
    .unwrap();
    let mut child =
        tokio::process::Command::from(k.cmd(&["get", "configmaps", "-w", "--request-timeout=20s"]))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            if line.contains("w-new") {
                break;
            }
        }
        seen
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "w-new"}})).unwrap(),
    )
    .await
    .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(15), reader)
        .await
        .expect("kubectl get -w printed nothing")
        .unwrap();
    assert!(seen.iter().any(|l| l.contains("w0")), "{seen:?}");
    assert!(seen.iter().any(|l| l.contains("w-new")), "{seen:?}");
    let _ = child.kill().await;
    s.shutdown().await;
}

#[tokio::test]
async fn certificate_approve_and_auth_can_i() {
    let cni = Identity::service_account("kube-system", "kube-ovn-cni");
    let s = server(true, &[("cni", cni)]).await;
    let admin = Kubectl::new(&s, ADMIN_TOKEN);
    let file = admin.write("csr.json", &csr("node1-ipsec", "node1"));
    admin.ok(&["create", "-f", &file]).await;
    let out = admin.ok(&["certificate", "approve", "node1-ipsec"]).await;
    assert!(out.contains("approved"), "{out}");
    let out = admin
        .ok(&[
            "get",
            "csr",
            "node1-ipsec",
            "-o",
            "jsonpath={.status.conditions[0].type}",
        ])
        .await;
    assert_eq!(out, "Approved");
    let file = admin.write("csr2.json", &csr("node1-deny", "node1"));
    admin.ok(&["create", "-f", &file]).await;
    let out = admin.ok(&["certificate", "deny", "node1-deny"]).await;
    assert!(out.contains("denied"), "{out}");

    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "node-patch"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "cni-node-patch"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-patch"},
        "subjects": [{"kind": "ServiceAccount", "name": "kube-ovn-cni", "namespace": "kube-system"}]});
    admin
        .ok(&["create", "-f", &admin.write("role.json", &role)])
        .await;
    admin
        .ok(&["create", "-f", &admin.write("binding.json", &binding)])
        .await;

    let k = Kubectl::new(&s, "cni");
    assert_eq!(
        k.ok(&["auth", "can-i", "patch", "nodes"]).await.trim(),
        "yes"
    );
    let out = k.run(&["auth", "can-i", "delete", "nodes"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    assert!(!out.status.success());
    let out = k.run(&["certificate", "approve", "node1-deny"]).await;
    assert!(!out.status.success(), "the CNI cannot approve");
    let out = k.run(&["get", "secrets", "-n", "kube-system"]).await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Forbidden"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        admin.ok(&["auth", "can-i", "delete", "nodes"]).await.trim(),
        "yes"
    );

    // The patched node is visible to a kube-rs client too.
    let nodes: Api<k8s_openapi::api::core::v1::Node> =
        Api::all(s.client(ADMIN_TOKEN).await.unwrap());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).unwrap(),
        )
        .await
        .unwrap();
    k.ok(&["annotate", "node", "node1", "kube-ovn.io/ipsec-chassis=abc"])
        .await;
    let n = nodes.get("node1").await.unwrap();
    assert_eq!(
        n.metadata.annotations.unwrap()["kube-ovn.io/ipsec-chassis"],
        "abc"
    );
    nodes
        .patch(
            "node1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    s.shutdown().await;
}

/// `kubectl create namespace|configmap|secret generic` send protobuf
/// (kubectl's typed clients); the objects arrive whole.
#[tokio::test]
async fn imperative_creates_send_protobuf_and_arrive_whole() {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    let s = server(false, &[]).await;
    let k = Kubectl::new(&s, ADMIN_TOKEN);
    let out = k.ok(&["create", "namespace", "imp"]).await;
    assert!(out.contains("namespace/imp created"), "{out}");
    k.ok(&[
        "-n",
        "imp",
        "create",
        "configmap",
        "c1",
        "--from-literal=a=1",
        "--from-literal=b=two words",
    ])
    .await;
    k.ok(&[
        "-n",
        "imp",
        "create",
        "secret",
        "generic",
        "s1",
        "--from-literal=k=s3cr3t",
    ])
    .await;
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let ns = Api::<Namespace>::all(client.clone())
        .get("imp")
        .await
        .unwrap();
    assert!(ns.metadata.uid.is_some());
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "imp")
        .get("c1")
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap(),
        [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "two words".to_string())
        ]
        .into()
    );
    let secret = Api::<Secret>::namespaced(client, "imp")
        .get("s1")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(secret.data.unwrap()["k"].0, b"s3cr3t");
}

/// A Secret's `stringData` is merged into `data` and an empty type is
/// `Opaque`, on create and on update, as the real server does.
#[tokio::test]
async fn secret_string_data_is_merged_into_data() {
    use k8s_openapi::api::core::v1::Secret;
    let s = server(false, &[]).await;
    let secrets: Api<Secret> = Api::namespaced(s.client(ADMIN_TOKEN).await.unwrap(), "default");
    let created: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"a": "YQ==", "b": "Yg=="}, "stringData": {"b": "B", "c": "C"}
    }))
    .unwrap();
    let got = secrets
        .create(&PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(got.type_.as_deref(), Some("Opaque"));
    assert!(got.string_data.is_none());
    let data = got.data.unwrap();
    let plain: Vec<(&str, &[u8])> = data.iter().map(|(k, v)| (k.as_str(), &v.0[..])).collect();
    assert_eq!(plain, [("a", &b"a"[..]), ("b", b"B"), ("c", b"C")]);
    let patch = json!({"stringData": {"a": "updated"}});
    let got = secrets
        .patch("s", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert!(got.string_data.is_none());
    assert_eq!(got.data.unwrap()["a"].0, b"updated");
}

/// `kubectl create serviceaccount` and `kubectl create token --bound-object-kind
/// Pod` (both protobuf bodies) mint a token that `kubectl auth whoami` shows as
/// the ServiceAccount with the Pod's and Node's extras, as the kubelet's
/// projected token would be: the CSR checks are reachable from kubectl.
#[tokio::test]
async fn create_token_bound_to_a_pod_and_whoami() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let s = server(true, &[]).await;
    let admin = Kubectl::new(&s, ADMIN_TOKEN);
    let out = admin
        .ok(&[
            "create",
            "serviceaccount",
            "kube-ovn-cni",
            "-n",
            "kube-system",
        ])
        .await;
    assert!(out.contains("serviceaccount/kube-ovn-cni created"), "{out}");
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let node = Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node1"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client, "kube-system");
    let pod = |name: &str, sa: &str| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"serviceAccountName": sa, "nodeName": "node1",
                     "containers": [{"name": "c", "image": "kube-ovn"}]}}))
        .unwrap()
    };
    let cni_pod = pods
        .create(
            &PostParams::default(),
            &pod("kube-ovn-cni-abcde", "kube-ovn-cni"),
        )
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("other", "default"))
        .await
        .unwrap();

    let out = admin
        .ok(&[
            "create",
            "token",
            "kube-ovn-cni",
            "-n",
            "kube-system",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "kube-ovn-cni-abcde",
            "--duration",
            "20m",
            "-o",
            "json",
        ])
        .await;
    let request: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(request["kind"], "TokenRequest", "{request}");
    assert_eq!(request["spec"]["expirationSeconds"], 1200, "{request}");
    assert_eq!(
        request["spec"]["boundObjectRef"]["name"],
        "kube-ovn-cni-abcde"
    );
    let token = request["status"]["token"].as_str().unwrap().to_string();
    assert!(request["status"]["expirationTimestamp"].is_string());

    let cni = Kubectl::new(&s, &token);
    let out = cni.ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"], "system:serviceaccount:kube-system:kube-ovn-cni",
        "{review}"
    );
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_str())
        .collect();
    assert_eq!(
        groups,
        [
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ]
    );
    let extra = &user["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        json!(["kube-ovn-cni-abcde"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        json!([cni_pod.metadata.uid.unwrap()])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        json!(["node1"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-uid"],
        json!([node.metadata.uid.unwrap()])
    );
    // RBAC applies to the minted identity: nothing is granted to it.
    let out = cni
        .run(&["auth", "can-i", "create", "certificatesigningrequests"])
        .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");

    // A Pod running as another ServiceAccount is refused, with the reason.
    let out = admin
        .run(&[
            "create",
            "token",
            "kube-ovn-cni",
            "-n",
            "kube-system",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "other",
        ])
        .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot bind token for serviceaccount \"kube-ovn-cni\" to pod running with different serviceaccount name"),
        "{stderr}"
    );
    // An unbound token, default lifetime.
    let out = admin
        .ok(&["create", "token", "kube-ovn-cni", "-n", "kube-system"])
        .await;
    let plain = Kubectl::new(&s, out.trim());
    let out = plain.ok(&["auth", "whoami", "-o", "json"]).await;
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        review["status"]["userInfo"]["extra"]
            .get("authentication.kubernetes.io/pod-name")
            .is_none(),
        "{review}"
    );
    s.shutdown().await;
}

/// The RBAC objects and ServiceAccounts of the chart's committed default
/// render (helm/rendered/, kept equal to a fresh render by CI), as one
/// multi-document YAML: what `kubectl create -f` gets. The Deployment and
/// DaemonSet are left out (this server serves no Deployments; neither
/// carries a permission).
fn chart_rbac_yaml() -> String {
    let rendered =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/rendered/kube-ovn-ipsec.yaml");
    let text = std::fs::read_to_string(&rendered)
        .unwrap_or_else(|e| panic!("{}: {e}", rendered.display()));
    let kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let docs: Vec<&str> = text
        .split("\n---\n")
        .filter(|d| {
            d.lines()
                .any(|l| kinds.iter().any(|k| l == format!("kind: {k}")))
        })
        .collect();
    assert_eq!(
        docs.len(),
        10,
        "the chart's 2 ServiceAccounts and 8 RBAC objects"
    );
    docs.join("\n---\n")
}

#[tokio::test]
async fn chart_rbac_holds_for_the_cni_and_the_controller() {
    let s = server(true, &[]).await;
    let admin = Kubectl::new(&s, ADMIN_TOKEN);
    let path = admin.dir.path().join("chart-rbac.yaml");
    std::fs::write(&path, chart_rbac_yaml()).unwrap();
    admin.ok(&["create", "-f", &path_str(&path)]).await;
    let token = |sa: &'static str| {
        let admin = &admin;
        async move {
            admin
                .ok(&["create", "token", sa, "-n", "kube-system"])
                .await
                .trim()
                .to_string()
        }
    };
    let cni = Kubectl::new(&s, &token("kube-ovn-cni").await);
    let controller = Kubectl::new(&s, &token("kube-ovn-ipsec-controller").await);
    let forbidden = |out: &Output, what: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("Forbidden"),
            "{what}: expected Forbidden, got {}: {stderr}",
            out.status
        );
    };

    // The CNI ServiceAccount: its CSR is created ...
    let file = cni.write("csr.json", &csr("ovn-ipsec-node1", "node1"));
    cni.ok(&["create", "-f", &file]).await;
    // ... a cert-manager CertificateRequest is not, in any namespace.
    let request = json!({"apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
        "metadata": {"name": "node1", "namespace": "kube-system"},
        "spec": {"request": common::csr_request("node1"),
                 "issuerRef": {"name": "kube-ovn", "kind": "ClusterIssuer", "group": "cert-manager.io"}}});
    let file = cni.write("cr.json", &request);
    forbidden(
        &cni.run(&["create", "-f", &file]).await,
        "the CNI creating a CertificateRequest",
    );
    forbidden(
        &cni.run(&["get", "secrets", "-n", "kube-system"]).await,
        "the CNI reading Secrets",
    );
    forbidden(
        &cni.run(&["certificate", "approve", "ovn-ipsec-node1"])
            .await,
        "the CNI approving its own CSR",
    );

    // The controller: its CA Secret (not there yet: NotFound, not
    // Forbidden) and CertificateRequests in its namespace ...
    let out = controller
        .run(&["get", "secret", "ovn-ipsec-ca", "-n", "kube-system"])
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NotFound"), "{stderr}");
    let file = controller.write("cr.json", &request);
    controller.ok(&["create", "-f", &file]).await;
    // ... and nowhere else.
    forbidden(
        &controller
            .run(&["get", "secret", "ovn-ipsec-ca", "-n", "default"])
            .await,
        "the controller reading Secrets outside its namespace",
    );
    let mut elsewhere = request.clone();
    elsewhere["metadata"]["namespace"] = json!("default");
    let file = controller.write("cr-default.json", &elsewhere);
    forbidden(
        &controller.run(&["create", "-f", &file]).await,
        "the controller creating a CertificateRequest outside its namespace",
    );
    // It approves CSRs of its signer.
    let out = controller
        .ok(&["certificate", "approve", "ovn-ipsec-node1"])
        .await;
    assert!(out.contains("approved"), "{out}");
    s.shutdown().await;
}
