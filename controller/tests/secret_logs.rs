//! No secret reaches the controller's log, on any error path: the
//! controller binary runs at `RUST_LOG=trace` (every target, every level)
//! against the embedded API server serving a broken CA Secret — base64
//! that does not decode, values and `data` of the wrong type, a body cut
//! short (through a proxy: no API server stores one), a `tls.key` that is
//! not a key, a `tls.crt` that is not PEM — and with broken tokens. Every
//! line it prints, stdout and stderr, is checked for the CA key's PEM lines
//! and base64, `-----BEGIN` and the token; the error still names the
//! Secret and the field. The same at run time: the CA reload meeting a
//! Secret broken under a running controller.
//!
//! In process: kube-rs' own `Client::request` warning (the response body
//! at WARN) on a typed read of such a Secret is kept out by the
//! controller's logger — and, as the control, written by a plain one.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Real processes in real time: wall-clock deadlines.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use kube_ovn_ipsec_api::logsafe::LogCapture;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube_ovn_ipsec_api::names::k8s;
use serde_json::{Value, json};

/// The controller binary.
const CONTROLLER: &str = env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller");

/// What must never be printed: the CA's key and a token.
struct Material {
    key_pem: String,
    cert_pem: String,
    token: String,
}

impl Material {
    fn new(token: String) -> Self {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Material {
            key_pem: key.serialize_pem(),
            cert_pem: cert.pem(),
            token,
        }
    }

    /// Every string whose appearance in the output is a leak: the armor,
    /// each line of the key's body, the base64 of the key's PEM in pieces
    /// (as a Secret's `data` holds it), and the token.
    fn forbidden(&self) -> Vec<String> {
        let mut out = vec!["-----BEGIN".to_owned()];
        if !self.token.is_empty() {
            out.push(self.token.clone());
        }
        out.extend(
            self.key_pem
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(str::to_owned),
        );
        let encoded = b64(&self.key_pem);
        out.extend(
            encoded
                .as_bytes()
                .chunks(20)
                .filter(|c| c.len() == 20)
                .map(|c| String::from_utf8(c.to_vec()).unwrap()),
        );
        out
    }

    fn assert_clean(&self, what: &str, output: &str) {
        for f in self.forbidden() {
            assert!(
                !output.contains(&f),
                "{what}: the output contains {f:?}:\n{output}"
            );
        }
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The CA Secret with `data` (and more fields from `extra`) as stored.
fn ca_secret(data: Value, extra: Value) -> Value {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": k8s::CA_SECRET, "namespace": NS},
        "type": "kubernetes.io/tls",
        "data": data,
    });
    if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
        v.extend(extra);
    }
    v
}

/// Stores `secret` as the CA Secret, as it is. The API refuses such a
/// Secret (as kube-apiserver does), so it goes into the store below the
/// API: what a server serves from a store that holds it anyway (an object
/// written before a validation existed, or restored from a damaged backup).
fn put_secret(server: &apiserver::ApiServerHandle, secret: Value) {
    let secrets = apiserver::RESOURCES
        .iter()
        .position(|d| d.kind == "Secret")
        .unwrap();
    server
        .store()
        .write(secrets, NS, k8s::CA_SECRET, |_| {
            Ok(apiserver::Write::Put(secret))
        })
        .unwrap();
}

/// A kubeconfig for `server` (`https://…` with the embedded server's CA,
/// or a plain `http://…` proxy) with bearer `token`, written whatever the
/// token holds.
fn kubeconfig(dir: &Path, name: &str, server: &str, ca_pem: &str, token: &str) -> PathBuf {
    let mut cluster = json!({"server": server});
    if server.starts_with("https") {
        cluster["certificate-authority-data"] = json!(b64(ca_pem));
    }
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    });
    let path = dir.join(name);
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

/// A controller process, every line of its stdout and stderr collected.
struct Controller {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Controller {
    fn start(kubeconfig: &Path, extra: &[&str]) -> Controller {
        let mut child = Command::new(CONTROLLER)
            .args(["--namespace", NS, "--metrics-addr", "127.0.0.1:0"])
            .args(["--live-cache", "false"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "trace")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Controller { child, lines }
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits (bounded) until some line contains `text`.
    async fn wait_for(&self, text: &str, within: Duration) {
        let t = Instant::now();
        while !self.output().contains(text) {
            assert!(
                t.elapsed() < within,
                "no line with {text:?} within {within:?}:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) for the process to exit on its own: whether it
    /// succeeded, and everything it printed.
    async fn exit(mut self, within: Duration) -> (bool, String) {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader threads drain what is left in the pipes.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return (status.success(), self.output());
            }
            if t.elapsed() > within {
                self.child.kill().unwrap();
                panic!(
                    "the controller did not exit within {within:?}:\n{}",
                    self.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process: everything it printed.
    async fn stop(mut self) -> String {
        self.child.kill().unwrap();
        let _ = self.child.wait();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.output()
    }
}

/// The broken CA Secrets the API server can store, each with the words
/// the error must name it by.
fn broken_secrets(m: &Material) -> Vec<(&'static str, Value, &'static str)> {
    let crt = b64(&m.cert_pem);
    let key = b64(&m.key_pem);
    // A key with its body cut: the armor and most lines of the real key.
    let mut not_a_key = m.key_pem.clone();
    let keep = not_a_key.len() * 2 / 3;
    not_a_key.truncate(keep);
    not_a_key.push_str("\n-----END PRIVATE KEY-----\n");
    vec![
        (
            "base64 that does not decode",
            ca_secret(
                json!({"tls.crt": crt, "tls.key": format!("{key}!*")}),
                json!({}),
            ),
            "data[tls.key] is not valid base64",
        ),
        (
            "a value of the wrong type",
            ca_secret(json!({"tls.crt": crt, "tls.key": {"pem": key}}), json!({})),
            "data[tls.key] is an object, not string",
        ),
        (
            "data of the wrong type",
            ca_secret(json!(m.key_pem), json!({})),
            "data is a string, not object",
        ),
        (
            "a type of the wrong type, the data in kubectl's annotation",
            ca_secret(
                json!({"tls.crt": crt, "tls.key": key}),
                json!({"type": 7, "metadata": {"name": k8s::CA_SECRET, "namespace": NS,
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                        json!({"data": {"tls.key": key}, "stringData": {"tls.key": m.key_pem}})
                            .to_string()}}}),
            ),
            "type is a number, not string",
        ),
        (
            "a tls.key that is not a key",
            ca_secret(
                json!({"tls.crt": crt, "tls.key": b64(&not_a_key)}),
                json!({}),
            ),
            "data[tls.key] is not a PEM private key",
        ),
        (
            "a tls.crt that is not PEM",
            ca_secret(
                json!({"tls.crt": b64("MIIBkTCB+wIJAKHHIG not a certificate"), "tls.key": key}),
                json!({}),
            ),
            "data[tls.crt] is not a PEM certificate",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_ca_secrets_and_tokens_at_start_name_the_field_and_leak_nothing() {
    let c = Cluster::start(1).await;
    let token = mint_token(&c.admin, CONTROLLER_SA, None).await;
    let m = Material::new(token.clone());
    let dir = tempfile::tempdir().unwrap();
    let url = c.server.url();
    let ca = c.server.ca_pem().to_owned();
    let good = kubeconfig(dir.path(), "controller", &url, &ca, &token);

    for (what, secret, field) in broken_secrets(&m) {
        put_secret(&c.server, secret);
        let (ok, out) = Controller::start(&good, &[])
            .exit(Duration::from_secs(30))
            .await;
        println!("--- {what}: {} lines", out.lines().count());
        assert!(
            !ok,
            "{what}: the controller started on a broken CA Secret:\n{out}"
        );
        assert!(
            out.contains(&format!("{NS}/{}", k8s::CA_SECRET)) && out.contains(field),
            "{what}: the error does not name the Secret and {field:?}:\n{out}"
        );
        m.assert_clean(what, &out);
    }

    // A body cut short in the middle of tls.key's base64.
    put_secret(
        &c.server,
        ca_secret(
            json!({"tls.crt": b64(&m.cert_pem), "tls.key": b64(&m.key_pem)}),
            json!({}),
        ),
    );
    let upstream = c.server.client(&token).await.unwrap();
    let proxy = proxy::start(upstream).await;
    let cut = kubeconfig(dir.path(), "cut", &format!("http://{proxy}"), &ca, &token);
    let (ok, out) = Controller::start(&cut, &[])
        .exit(Duration::from_secs(30))
        .await;
    assert!(!ok, "started on a truncated Secret:\n{out}");
    assert!(
        out.contains("does not decode: the response is not JSON: it ends early"),
        "{out}"
    );
    m.assert_clean("a truncated body", &out);

    // Broken tokens: one the API server does not know (a well-formed JWT),
    // one that is no valid header value at all.
    let unknown = format!("{}x", &token[..token.len() - 1]);
    for (what, t, telltale, expected) in [
        (
            "an unknown token",
            unknown.as_str(),
            unknown.as_str(),
            "Unauthorized",
        ),
        (
            "a token the kubeconfig's YAML cannot hold",
            "broken-token-3f9c0d1e\u{7f}",
            "broken-token-3f9c0d1e",
            "the kubeconfig is not valid YAML",
        ),
        (
            "a token no header can carry",
            "broken-token-5a7b\nsecond-line",
            "broken-token-5a7b",
            "the kubeconfig's token is not a valid HTTP header value",
        ),
    ] {
        let path = kubeconfig(dir.path(), "token", &url, &ca, t);
        let (ok, out) = Controller::start(&path, &[])
            .exit(Duration::from_secs(30))
            .await;
        assert!(!ok, "{what}: the controller started:\n{out}");
        assert!(!out.contains("panicked"), "{what}:\n{out}");
        assert!(out.contains(expected), "{what}: no {expected:?}:\n{out}");
        let m = Material {
            token: telltale.to_owned(),
            ..Material::new(String::new())
        };
        m.assert_clean(what, &out);
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_secret_broken_under_a_running_controller_is_reported_without_its_data() {
    let c = Cluster::start(1).await;
    let token = mint_token(&c.admin, CONTROLLER_SA, None).await;
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), "c", &c.server.url(), c.server.ca_pem(), &token);
    let running = Controller::start(&path, &["--ca-reload", "1s"]);
    running
        .wait_for(
            "kube-ovn-ipsec-controller starting",
            Duration::from_secs(30),
        )
        .await;
    // The CA it generated, with its key, now stored with data of the
    // wrong type: kube-rs' decoder would quote it.
    let stored = Api::<Secret>::namespaced(c.admin.clone(), NS)
        .get(k8s::CA_SECRET)
        .await
        .unwrap();
    let data = stored.data.unwrap();
    let m = Material {
        key_pem: String::from_utf8(data["tls.key"].0.clone()).unwrap(),
        cert_pem: String::from_utf8(data["tls.crt"].0.clone()).unwrap(),
        token,
    };
    put_secret(&c.server, ca_secret(json!(m.key_pem), json!({})));
    running
        .wait_for("could not reload the CA", Duration::from_secs(10))
        .await;
    let out = running.stop().await;
    let reload = out
        .lines()
        .find(|l| l.contains("could not reload the CA"))
        .unwrap();
    assert!(
        reload.contains("ovn-ipsec-ca does not decode: data is a string, not object"),
        "{reload}"
    );
    m.assert_clean("the reload", &out);
    c.stop().await;
}

/// kube-rs' `Client::request` logs the body it could not decode at WARN:
/// a typed read of the broken Secret writes the key through a plain
/// logger, and nothing through the controller's.
#[tokio::test]
async fn the_loggers_guards_keep_kube_rs_body_echo_out() {
    let c = Cluster::start(1).await;
    let m = Material::new("no-token-here".into());
    put_secret(
        &c.server,
        ca_secret(json!({"tls.key": {"pem": b64(&m.key_pem)}}), json!({})),
    );
    let read = || async {
        let secrets: Api<Secret> = Api::namespaced(c.admin.clone(), NS);
        assert!(secrets.get(k8s::CA_SECRET).await.is_err());
    };

    let plain = LogCapture::default();
    {
        let writer = plain.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_env_filter("trace")
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        read().await;
    }
    assert!(
        plain.text().contains(&b64(&m.key_pem)[20..60]),
        "the control: kube-rs no longer echoes the body, so this test shows nothing"
    );

    let guarded = LogCapture::default();
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        let writer = guarded.clone();
        let layer =
            controller::logging::layer(tracing_subscriber::EnvFilter::new("trace"), move || {
                writer.clone()
            });
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        read().await;
    }
    let text = guarded.text();
    assert!(
        text.contains("\"level\":\"TRACE\""),
        "captured nothing at TRACE:\n{text}"
    );
    m.assert_clean("the controller's logger", &text);
    c.stop().await;
}

/// A plain-HTTP proxy to the embedded API server that cuts the CA
/// Secret's body in half: the answer of a server or network that fails
/// mid-body.
mod proxy {
    use std::convert::Infallible;
    use std::net::SocketAddr;

    use http_body_util::{BodyExt as _, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    /// Serves on a free port until the test ends; returns its address.
    pub async fn start(upstream: kube::Client) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| forward(upstream.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    async fn forward(
        upstream: kube::Client,
        req: hyper::Request<Incoming>,
    ) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let mut out = http::Request::builder()
            .method(parts.method.clone())
            .uri(&path);
        if let Some(t) = parts.headers.get(http::header::CONTENT_TYPE) {
            out = out.header(http::header::CONTENT_TYPE, t);
        }
        let out = out.body(body.to_vec()).unwrap();
        let res = upstream
            .send(out.map(kube::client::Body::from))
            .await
            .unwrap();
        let status = res.status();
        let mut bytes = res.into_body().collect_bytes().await.unwrap().to_vec();
        if parts.method == http::Method::GET && path.contains("/secrets/ovn-ipsec-ca") {
            bytes.truncate(bytes.len() / 2);
        }
        Ok(hyper::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap())
    }
}
