//! Shared fixtures for the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use apiserver::{ApiServer, ApiServerHandle, Identity};
use base64::Engine as _;
use serde_json::{Value, json};

/// Starts a server with RBAC on or off and extra tokens.
pub async fn server(rbac: bool, tokens: &[(&str, Identity)]) -> ApiServerHandle {
    let mut b = ApiServer::builder().rbac(rbac);
    for (t, id) in tokens {
        b = b.token(t, id.clone());
    }
    b.start().await.unwrap()
}

/// A real PKCS#10 request, base64 of its PEM, as `spec.request` carries it.
pub fn csr_request(cn: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// A self-signed certificate, base64 of its PEM, as `status.certificate` carries it.
pub fn certificate(cn: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![cn.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(cert.pem())
}

/// A CSR object for the project's signer.
pub fn csr(name: &str, cn: &str) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": csr_request(cn), "signerName": "kubeovn.io/signer",
                 "usages": ["ipsec tunnel"], "expirationSeconds": 3600}
    })
}

/// Polls `f` every 20 ms for up to 5 s.
pub async fn eventually<F: FnMut() -> bool>(what: &str, mut f: F) {
    for _ in 0..250 {
        if f() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}
