//! Every SPEC §6 check, from outside the way an operator would probe it:
//! requests written by `openssl req`, submitted with `kubectl create` under
//! ServiceAccount tokens that `kubectl create token --bound-object-kind Pod`
//! minted through `TokenRequest` (as the kubelet asks for them), judged by
//! the `kube-ovn-ipsec-controller` binary (built-in signer) authenticating
//! with its own minted token, RBAC on; outcomes read back with `kubectl get`.
//! One good request is signed, so every denial is the check's, not a broken
//! path's.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// kubectl and openssl are blocking processes against real servers in real
// time: the deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apiserver::ADMIN_TOKEN;
use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube_ovn_ipsec_api::pki::{PEM_CERTIFICATE_REQUEST, encode_pem, parse_pem};
use serde_json::json;

/// `kubectl` against the embedded server with one kubeconfig.
struct Kubectl {
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// Runs kubectl with `args` (and `token` instead of the kubeconfig's, if
    /// given); stdout on success, stderr on failure.
    fn run(&self, token: Option<&str>, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        let out = cmd
            .args(args)
            .output()
            .expect("kubectl is installed by scripts/install-deps.sh");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn ok(&self, token: Option<&str>, args: &[&str]) -> String {
        self.run(token, args)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// A token for ServiceAccount `sa` in [`NS`], bound to Pod `pod`.
    fn token(&self, sa: &str, pod: Option<(&str, &str)>) -> String {
        let mut args = vec!["create", "token", sa, "-n", NS, "--duration", "1h"];
        if let Some((name, uid)) = pod {
            args.extend([
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                name,
                "--bound-object-uid",
                uid,
            ]);
        }
        self.ok(None, &args).trim().to_owned()
    }

    /// `kubectl create -f` of `object` (JSON) as `token` (the admin's
    /// when `None`).
    fn create(&self, token: Option<&str>, dir: &Path, object: &serde_json::Value) {
        let name = object["metadata"]["name"].as_str().unwrap();
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, object.to_string()).unwrap();
        self.ok(token, &["create", "-f", file.to_str().unwrap()]);
    }

    /// The CSR's outcome once it has one (bounded).
    fn outcome(&self, name: &str) -> (Outcome, String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let csr: CertificateSigningRequest =
                serde_json::from_str(&self.ok(None, &["get", "csr", name, "-o", "json"])).unwrap();
            if let Some(o) = outcome(&csr) {
                let message = csr
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.message)
                    .collect::<Vec<_>>()
                    .join("; ");
                return (o, message);
            }
            assert!(Instant::now() < deadline, "CSR {name}: no outcome in 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How `openssl req` makes a request.
struct Req<'a> {
    key: &'a [&'a str],
    subject: String,
    sans: Vec<String>,
    ca: bool,
}

impl<'a> Req<'a> {
    /// A request the controller accepts for `chassis`: P-256, O=kube-ovn,
    /// CN and the one DNS SAN the chassis.
    fn good(chassis: &str) -> Self {
        Req {
            key: &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
            subject: format!("/O=kube-ovn/CN={chassis}"),
            sans: vec![format!("DNS:{chassis}")],
            ca: false,
        }
    }

    fn pem(&self, dir: &Path, name: &str) -> Vec<u8> {
        let out = dir.join(format!("{name}.csr"));
        let mut cmd = Command::new("openssl");
        cmd.args(["req", "-new", "-nodes", "-batch"])
            .args(self.key)
            .arg("-keyout")
            .arg(dir.join(format!("{name}.key")))
            .args(["-subj", &self.subject])
            .arg("-out")
            .arg(&out);
        if !self.sans.is_empty() {
            cmd.args([
                "-addext",
                &format!("subjectAltName={}", self.sans.join(",")),
            ]);
        }
        if self.ca {
            cmd.args(["-addext", "basicConstraints=critical,CA:TRUE"]);
        }
        let status = cmd.stderr(Stdio::null()).status().unwrap();
        assert!(status.success(), "openssl req for {name}");
        std::fs::read(out).unwrap()
    }
}

/// `pem` with the last byte of its signature flipped.
fn broken_signature(pem: &[u8]) -> Vec<u8> {
    let mut der = parse_pem(pem, PEM_CERTIFICATE_REQUEST).unwrap().remove(0);
    let last = der.len() - 1;
    der[last] ^= 0x01;
    encode_pem(PEM_CERTIFICATE_REQUEST, &der).into_bytes()
}

/// The CSR object as the agent writes it, as JSON for kubectl.
fn csr_json(name: &str, node: &NodeFx, pem: &[u8], lifetime: i32) -> serde_json::Value {
    let mut v = serde_json::to_value(csr_object(name, node, pem, lifetime)).unwrap();
    v["apiVersion"] = json!("certificates.k8s.io/v1");
    v["kind"] = json!("CertificateSigningRequest");
    v
}

/// The controller binary as its own ServiceAccount, with a minted token.
fn start_controller(dir: &Path, c: &Cluster, kubectl: &Kubectl) -> Child {
    let token = kubectl.token(CONTROLLER_SA, None);
    let kubeconfig = dir.join("controller.kubeconfig");
    c.server.write_kubeconfig(&kubeconfig, &token).unwrap();
    Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"))
        .args(["--namespace", NS, "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("controller.log")).unwrap())
        .spawn()
        .unwrap()
}

/// One request and what the controller must answer.
struct Case {
    what: &'static str,
    token: String,
    csr: serde_json::Value,
    expect: Expect,
}

#[derive(Debug)]
enum Expect {
    Issued,
    Denied(&'static str),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_denies_a_kubectl_request_with_its_reason() {
    let c = Cluster::start(4).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let admin = d.join("admin.kubeconfig");
    c.server.write_kubeconfig(&admin, ADMIN_TOKEN).unwrap();
    let k = Kubectl { kubeconfig: admin };
    let mut controller = start_controller(d, &c, &k);

    let (n0, n1, n2, n3) = (&c.nodes[0], &c.nodes[1], &c.nodes[2], &c.nodes[3]);
    let token_of = |n: &NodeFx| k.token(CNI_SA, Some((&n.pod_name, &n.pod_uid)));
    let t0 = token_of(n0);

    // A Pod of the CNI ServiceAccount on node-0, with the DaemonSet's labels
    // but not owned by it.
    k.create(
        None,
        d,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "not-kube-ovn-cni", "namespace": NS,
                         "labels": {"app": "kube-ovn-cni", "controller-revision-hash": HASH}},
            "spec": {"nodeName": n0.name, "serviceAccountName": CNI_SA,
                     "containers": [{"name": "x", "image": "x"}]}}),
    );
    let intruder: serde_json::Value = serde_json::from_str(&k.ok(
        None,
        &["get", "pod", "not-kube-ovn-cni", "-n", NS, "-o", "json"],
    ))
    .unwrap();
    let intruder_token = k.token(
        CNI_SA,
        Some((
            "not-kube-ovn-cni",
            intruder["metadata"]["uid"].as_str().unwrap(),
        )),
    );
    // node-2's Pod still runs the previous template.
    k.ok(
        None,
        &[
            "label",
            "pod",
            &n2.pod_name,
            "-n",
            NS,
            "--overwrite",
            "controller-revision-hash=oldhash",
        ],
    );

    let good = |name: &str| Req::good(&n0.chassis).pem(d, name);
    let with = |name: &'static str, req: Req<'_>| req.pem(d, name);
    let mut cases = vec![
        Case {
            what: "a good P-256 request",
            token: t0.clone(),
            csr: csr_json("ok-p256", n0, &good("ok-p256"), 86400),
            expect: Expect::Issued,
        },
        Case {
            what: "a good RSA-3072 request",
            token: token_of(n3),
            csr: csr_json(
                "ok-rsa",
                n3,
                &with(
                    "ok-rsa",
                    Req {
                        key: &["-newkey", "rsa:3072"],
                        ..Req::good(&n3.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Issued,
        },
        Case {
            what: "subject: CN of another chassis",
            token: t0.clone(),
            csr: csr_json(
                "subject",
                n0,
                &with(
                    "subject",
                    Req {
                        subject: format!("/O=kube-ovn/CN={}", n1.chassis),
                        ..Req::good(&n0.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Denied("SubjectMismatch"),
        },
        Case {
            what: "SAN: an extra name",
            token: t0.clone(),
            csr: csr_json(
                "san",
                n0,
                &with(
                    "san",
                    Req {
                        sans: vec![format!("DNS:{}", n0.chassis), "DNS:evil.example".into()],
                        ..Req::good(&n0.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Denied("SubjectAltNameMismatch"),
        },
        Case {
            what: "a CA request",
            token: t0.clone(),
            csr: csr_json(
                "ca",
                n0,
                &with(
                    "ca",
                    Req {
                        ca: true,
                        ..Req::good(&n0.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Denied("CARequested"),
        },
        Case {
            what: "key size: RSA-1024",
            token: t0.clone(),
            csr: csr_json(
                "rsa1024",
                n0,
                &with(
                    "rsa1024",
                    Req {
                        key: &["-newkey", "rsa:1024"],
                        ..Req::good(&n0.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Denied("KeySizeNotAllowed"),
        },
        Case {
            what: "key type: Ed25519",
            token: t0.clone(),
            csr: csr_json(
                "ed25519",
                n0,
                &with(
                    "ed25519",
                    Req {
                        key: &["-newkey", "ed25519"],
                        ..Req::good(&n0.chassis)
                    },
                ),
                86400,
            ),
            expect: Expect::Denied("UnsupportedKeyType"),
        },
        Case {
            what: "usages: client auth",
            token: t0.clone(),
            csr: {
                let mut v = csr_json("usages", n0, &good("usages"), 86400);
                v["spec"]["usages"] = json!(["client auth"]);
                v
            },
            expect: Expect::Denied("UsagesNotAllowed"),
        },
        Case {
            what: "lifetime: a year",
            token: t0.clone(),
            csr: csr_json("lifetime", n0, &good("lifetime"), 365 * 86400),
            expect: Expect::Denied("LifetimeOutOfBounds"),
        },
        Case {
            what: "Node UID: not the live Node's",
            token: t0.clone(),
            csr: {
                let mut v = csr_json("node-uid", n0, &good("node-uid"), 86400);
                v["metadata"]["annotations"]["kube-ovn.io/ipsec-node-uid"] =
                    json!("00000000-0000-4000-8000-000000000000");
                v
            },
            expect: Expect::Denied("NodeUIDMismatch"),
        },
        Case {
            what: "chassis: not the Node's",
            token: t0.clone(),
            csr: {
                let pem = Req::good("chassis-9").pem(d, "chassis");
                let mut v = csr_json("chassis", n0, &pem, 86400);
                v["metadata"]["annotations"]["kube-ovn.io/ipsec-chassis"] = json!("chassis-9");
                v
            },
            expect: Expect::Denied("ChassisMismatch"),
        },
        Case {
            what: "another Pod: not the DaemonSet's",
            token: intruder_token,
            csr: csr_json("other-pod", n0, &good("other-pod"), 86400),
            expect: Expect::Denied("PodNotOwnedByDaemonSet"),
        },
        Case {
            what: "another node: node-0's token, node-1's request",
            token: t0.clone(),
            csr: csr_json(
                "other-node",
                n1,
                &Req::good(&n1.chassis).pem(d, "other-node"),
                86400,
            ),
            expect: Expect::Denied("NodeBindingMismatch"),
        },
        Case {
            what: "a stale template",
            token: token_of(n2),
            csr: csr_json("stale", n2, &Req::good(&n2.chassis).pem(d, "stale"), 86400),
            expect: Expect::Denied("PodTemplateOutdated"),
        },
        Case {
            what: "a broken signature",
            token: t0.clone(),
            csr: csr_json(
                "signature",
                n0,
                &broken_signature(&good("signature")),
                86400,
            ),
            expect: Expect::Denied("SignatureInvalid"),
        },
    ];
    for case in &mut cases {
        let name = format!(
            "ovn-ipsec-{}",
            case.csr["metadata"]["name"].as_str().unwrap()
        );
        case.csr["metadata"]["name"] = json!(name);
        k.create(Some(&case.token), d, &case.csr);
    }
    let mut wrong = Vec::new();
    for case in &cases {
        let name = case.csr["metadata"]["name"].as_str().unwrap();
        let (got, message) = k.outcome(name);
        match (&case.expect, &got) {
            (Expect::Issued, Outcome::Issued(_)) => {}
            (Expect::Denied(want), Outcome::Denied(reason)) if reason == want => {
                assert!(
                    !message.is_empty(),
                    "{}: a denial without a message",
                    case.what
                );
            }
            _ => wrong.push(format!(
                "{}: expected {:?}, got {got:?} ({message})",
                case.what, case.expect
            )),
        }
    }
    let _ = controller.kill();
    let _ = controller.wait();
    assert!(
        wrong.is_empty(),
        "{}\ncontroller log:\n{}",
        wrong.join("\n"),
        std::fs::read_to_string(d.join("controller.log")).unwrap_or_default()
    );
    c.stop().await;
}
