//! Bad requests: each is answered with a Kubernetes `Status` and the right
//! code, and leaves the store unchanged.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use apiserver::{ADMIN_TOKEN, ApiServerHandle, MAX_BODY};
use axum::http::{Method, Request};
use common::server;
use http_body_util::BodyExt;
use serde_json::{Value, json};

async fn send(
    s: &ApiServerHandle,
    method: Method,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let client = s.client(ADMIN_TOKEN).await.unwrap();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Sends a request that must fail with `code`/`reason`, and checks the store did not move.
async fn rejected(
    s: &ApiServerHandle,
    method: Method,
    path: &str,
    ct: &str,
    body: Vec<u8>,
    code: u16,
    reason: &str,
) {
    let before = s.store().resource_version();
    let (got, status) = send(s, method.clone(), path, ct, body).await;
    assert_eq!(got, code, "{method} {path}: {status}");
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["code"], code);
    assert_eq!(status["reason"], reason, "{status}");
    assert_eq!(
        s.store().resource_version(),
        before,
        "store changed by a rejected {method} {path}"
    );
}

const JSON: &str = "application/json";

#[tokio::test]
async fn rejected_requests_leave_the_store_unchanged() {
    let s = server(false, &[]).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1"}});
    let (code, _) = send(&s, Method::POST, cms, JSON, ok.to_string().into_bytes()).await;
    assert_eq!(code, 201);

    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        b"{not json".to_vec(),
        400,
        "BadRequest",
    )
    .await;
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        b"[1,2]".to_vec(),
        400,
        "BadRequest",
    )
    .await;
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "y"}});
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        wrong_kind.to_string().into_bytes(),
        400,
        "BadRequest",
    )
    .await;
    let wrong_version =
        json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "y"}});
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        wrong_version.to_string().into_bytes(),
        400,
        "BadRequest",
    )
    .await;
    let wrong_ns = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y", "namespace": "kube-system"}});
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        wrong_ns.to_string().into_bytes(),
        400,
        "BadRequest",
    )
    .await;
    let no_name = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}});
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        no_name.to_string().into_bytes(),
        422,
        "Invalid",
    )
    .await;
    let bad_name =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_Valid"}});
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        bad_name.to_string().into_bytes(),
        422,
        "Invalid",
    )
    .await;
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        ok.to_string().into_bytes(),
        409,
        "AlreadyExists",
    )
    .await;
    let mut huge = ok.clone();
    huge["metadata"]["name"] = json!("huge");
    huge["data"]["big"] = json!("x".repeat(MAX_BODY + 1));
    rejected(
        &s,
        Method::POST,
        cms,
        JSON,
        huge.to_string().into_bytes(),
        413,
        "RequestEntityTooLarge",
    )
    .await;
    rejected(
        &s,
        Method::POST,
        "/api/v1/namespaces/nope/configmaps",
        JSON,
        ok.to_string().into_bytes(),
        404,
        "NotFound",
    )
    .await;

    rejected(
        &s,
        Method::GET,
        "/api/v1/namespaces/default/widgets",
        JSON,
        vec![],
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        "/apis/example.com/v1/things",
        JSON,
        vec![],
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        "/api/v1/namespaces/default/configmaps/missing",
        JSON,
        vec![],
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        "/api/v1/namespaces/default/pods/p/exec",
        JSON,
        vec![],
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::PUT,
        cms,
        JSON,
        ok.to_string().into_bytes(),
        405,
        "MethodNotAllowed",
    )
    .await;
    rejected(
        &s,
        Method::POST,
        &format!("{cms}/x"),
        JSON,
        ok.to_string().into_bytes(),
        405,
        "MethodNotAllowed",
    )
    .await;
    rejected(
        &s,
        Method::POST,
        "/api/v1/configmaps",
        JSON,
        ok.to_string().into_bytes(),
        405,
        "MethodNotAllowed",
    )
    .await;

    let x = format!("{cms}/x");
    let mut stale = ok.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    rejected(
        &s,
        Method::PUT,
        &x,
        JSON,
        stale.to_string().into_bytes(),
        409,
        "Conflict",
    )
    .await;
    let mut renamed = ok.clone();
    renamed["metadata"]["name"] = json!("other");
    rejected(
        &s,
        Method::PUT,
        &x,
        JSON,
        renamed.to_string().into_bytes(),
        400,
        "BadRequest",
    )
    .await;
    rejected(&s, Method::PUT, &x, JSON, b"{".to_vec(), 400, "BadRequest").await;
    rejected(
        &s,
        Method::PUT,
        &x,
        "application/yaml",
        ok.to_string().into_bytes(),
        415,
        "UnsupportedMediaType",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &x,
        "application/apply-patch+yaml",
        b"data: {}".to_vec(),
        415,
        "UnsupportedMediaType",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &x,
        "text/plain",
        b"{}".to_vec(),
        415,
        "UnsupportedMediaType",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &x,
        "application/merge-patch+json",
        b"{oops".to_vec(),
        400,
        "BadRequest",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &x,
        "application/json-patch+json",
        br#"[{"op":"test","path":"/data/a","value":"2"}]"#.to_vec(),
        422,
        "Invalid",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &x,
        "application/merge-patch+json",
        br#"{"kind":"Secret"}"#.to_vec(),
        400,
        "BadRequest",
    )
    .await;
    rejected(
        &s,
        Method::PATCH,
        &format!("{cms}/missing"),
        "application/merge-patch+json",
        b"{}".to_vec(),
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::DELETE,
        &format!("{cms}/missing"),
        JSON,
        vec![],
        404,
        "NotFound",
    )
    .await;
    rejected(
        &s,
        Method::DELETE,
        &x,
        JSON,
        br#"{"preconditions":{"uid":"nope"}}"#.to_vec(),
        409,
        "Conflict",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        &format!("{cms}?labelSelector=a%20in%20b"),
        JSON,
        vec![],
        400,
        "BadRequest",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        &format!("{cms}?fieldSelector=spec.bogus%3D1"),
        JSON,
        vec![],
        400,
        "BadRequest",
    )
    .await;
    rejected(
        &s,
        Method::GET,
        &format!("{cms}?resourceVersion=abc&resourceVersionMatch=Exact"),
        JSON,
        vec![],
        400,
        "BadRequest",
    )
    .await;
    let cr = "/apis/cert-manager.io/v1/namespaces/default/certificaterequests";
    let (code, _) = send(&s, Method::POST, cr, JSON, json!({"apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest", "metadata": {"name": "r"}, "spec": {}}).to_string().into_bytes()).await;
    assert_eq!(code, 201);
    rejected(
        &s,
        Method::PATCH,
        &format!("{cr}/r"),
        "application/strategic-merge-patch+json",
        b"{}".to_vec(),
        415,
        "UnsupportedMediaType",
    )
    .await;

    // Unauthenticated.
    let client = kube::Client::try_from({
        let mut c = s.kube_config(ADMIN_TOKEN).await.unwrap();
        c.auth_info.token = Some("wrong".to_string().into());
        c
    })
    .unwrap();
    let resp = client
        .send(
            Request::builder()
                .uri(cms)
                .body(kube::client::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    s.shutdown().await;
}
