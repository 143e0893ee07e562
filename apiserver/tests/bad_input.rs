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

/// Sends a write the real server refuses: answered `code` with a `Status`
/// whose causes name `field` (for a 422), and neither the store's version
/// nor the object at `object` moves.
#[allow(clippy::too_many_arguments)]
async fn refused(
    s: &ApiServerHandle,
    method: Method,
    path: &str,
    ct: &str,
    body: Value,
    code: u16,
    field: &str,
    object: &str,
) -> Value {
    let (_, before) = send(s, Method::GET, object, JSON, vec![]).await;
    let rv = s.store().resource_version();
    let (got, status) = send(s, method.clone(), path, ct, body.to_string().into_bytes()).await;
    assert_eq!(got, code, "{method} {path} {body}: {status}");
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["code"], code);
    if code == 422 {
        assert_eq!(status["reason"], "Invalid", "{status}");
        let causes = status["details"]["causes"].as_array().expect("causes");
        assert!(
            causes.iter().any(|c| c["field"] == field),
            "{method} {path} {body}: no cause for {field}: {status}"
        );
    } else {
        assert_eq!(status["reason"], "BadRequest", "{status}");
    }
    assert_eq!(s.store().resource_version(), rv, "the store moved");
    let (_, after) = send(s, Method::GET, object, JSON, vec![]).await;
    assert_eq!(after, before, "{method} {path} changed the object");
    status
}

const JSON_PATCH: &str = "application/json-patch+json";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";

#[tokio::test]
async fn configmap_and_secret_payloads_are_typed_as_on_a_real_server() {
    let s = server(false, &[]).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = format!("{cms}/cm");
    let body = json!({"metadata": {"name": "cm"}, "data": {"a": "1"}});
    let (code, _) = send(&s, Method::POST, cms, JSON, body.to_string().into_bytes()).await;
    assert_eq!(code, 201);

    // A patch whose result does not decode: 422 on the field `patch`.
    for (ct, patch) in [
        (
            JSON_PATCH,
            json!([{"op": "add", "path": "/data/b", "value": {"x": 1}}]),
        ),
        (
            JSON_PATCH,
            json!([{"op": "replace", "path": "/data/a", "value": 5}]),
        ),
        (MERGE, json!({"data": {"a": {"nested": true}}})),
        (STRATEGIC, json!({"data": {"a": [1]}})),
        (MERGE, json!({"binaryData": {"b": "not base64"}})),
        (MERGE, json!({"metadata": {"labels": {"x": 1}}})),
    ] {
        let status = refused(&s, Method::PATCH, &cm, ct, patch, 422, "patch", &cm).await;
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("into Go struct field")
                || status["message"]
                    .as_str()
                    .unwrap()
                    .contains("illegal base64"),
            "{status}"
        );
    }
    // A body that does not decode: 400, naming the kind.
    let status = refused(
        &s,
        Method::PUT,
        &cm,
        JSON,
        json!({"metadata": {"name": "cm"}, "data": {"a": 1}}),
        400,
        "",
        &cm,
    )
    .await;
    assert_eq!(
        status["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string"
    );
    refused(
        &s,
        Method::POST,
        cms,
        JSON,
        json!({"metadata": {"name": "other"}, "data": {"a": []}}),
        400,
        "",
        &format!("{cms}/other"),
    )
    .await;
    // Decoded, but invalid: 422 naming the field.
    for (patch, field) in [
        (json!({"data": {"bad key": "v"}}), "data[bad key]"),
        (json!({"binaryData": {"a": "MQ=="}}), "data[a]"),
        (
            json!({"metadata": {"labels": {"x": "not valid!"}}}),
            "metadata.labels",
        ),
        (
            json!({"metadata": {"annotations": {"a/b/c": ""}}}),
            "metadata.annotations",
        ),
        (
            json!({"metadata": {"finalizers": ["no spaces"]}}),
            "metadata.finalizers",
        ),
        (json!({"data": {"big": "x".repeat(1024 * 1024)}}), ""),
    ] {
        let status = refused(&s, Method::PATCH, &cm, MERGE, patch, 422, field, &cm).await;
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .starts_with("ConfigMap \"cm\" is invalid: "),
            "{status}"
        );
        assert_eq!(status["details"]["kind"], "ConfigMap");
        assert_eq!(status["details"]["name"], "cm");
    }

    let secrets = "/api/v1/namespaces/default/secrets";
    let secret = format!("{secrets}/s");
    let body = json!({"metadata": {"name": "s"}, "data": {"k": "dmFsdWU="}});
    let (code, _) = send(
        &s,
        Method::POST,
        secrets,
        JSON,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 201);
    for (ct, patch) in [
        (
            JSON_PATCH,
            json!([{"op": "add", "path": "/data/k2", "value": {"x": 1}}]),
        ),
        (MERGE, json!({"data": {"k": "not base64"}})),
        (MERGE, json!({"stringData": {"k": 1}})),
    ] {
        refused(&s, Method::PATCH, &secret, ct, patch, 422, "patch", &secret).await;
    }
    refused(
        &s,
        Method::PATCH,
        &secret,
        MERGE,
        json!({"type": "kubernetes.io/tls"}),
        422,
        "type",
        &secret,
    )
    .await;
    let status = refused(
        &s,
        Method::POST,
        secrets,
        JSON,
        json!({"metadata": {"name": "t"}, "data": {"k": "%%%"}}),
        400,
        "",
        &format!("{secrets}/t"),
    )
    .await;
    assert_eq!(
        status["message"],
        "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 0"
    );
    refused(
        &s,
        Method::POST,
        secrets,
        JSON,
        json!({"metadata": {"name": "t"}, "type": "kubernetes.io/tls", "data": {"tls.crt": ""}}),
        422,
        "data[tls.key]",
        &format!("{secrets}/t"),
    )
    .await;
    s.shutdown().await;
}

#[tokio::test]
async fn names_csrs_and_leases_are_validated_as_on_a_real_server() {
    let s = server(false, &[]).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    for name in ["a..b", "a.-b", "-a"] {
        refused(
            &s,
            Method::POST,
            cms,
            JSON,
            json!({"metadata": {"name": name}}),
            422,
            "metadata.name",
            &format!("{cms}/{name}"),
        )
        .await;
    }
    let status = refused(
        &s,
        Method::POST,
        "/api/v1/namespaces",
        JSON,
        json!({"metadata": {"name": "a.b"}}),
        422,
        "metadata.name",
        "/api/v1/namespaces/a.b",
    )
    .await;
    assert_eq!(
        status["message"],
        "Namespace \"a.b\" is invalid: metadata.name: Invalid value: \"a.b\": must not contain dots"
    );

    let csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    for (spec, field) in [
        (
            json!({"signerName": "kubeovn.io/signer "}),
            "spec.signerName",
        ),
        (json!({"signerName": "kubeovn/signer"}), "spec.signerName"),
        (
            json!({"signerName": "kubernetes.io/legacy-unknown"}),
            "spec.signerName",
        ),
        (
            json!({"usages": ["ipsec tunnel", "nope"]}),
            "spec.usages[1]",
        ),
        (
            json!({"usages": ["ipsec tunnel", "ipsec tunnel"]}),
            "spec.usages[1]",
        ),
    ] {
        let mut body = common::csr("c", "node-1");
        for (k, v) in spec.as_object().unwrap() {
            body["spec"][k] = v.clone();
        }
        let status = refused(
            &s,
            Method::POST,
            csrs,
            JSON,
            body,
            422,
            field,
            &format!("{csrs}/c"),
        )
        .await;
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .starts_with("CertificateSigningRequest.certificates.k8s.io \"c\" is invalid: "),
            "{status}"
        );
    }
    let mut body = common::csr("c", "node-1");
    body["spec"]["request"] = json!(1);
    refused(
        &s,
        Method::POST,
        csrs,
        JSON,
        body,
        400,
        "",
        &format!("{csrs}/c"),
    )
    .await;
    let (code, status) = send(
        &s,
        Method::POST,
        csrs,
        JSON,
        common::csr("node-csr-Ab_9", "node-1")
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 201, "a CSR may be called anything: {status}");

    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease = format!("{leases}/l");
    refused(
        &s,
        Method::POST,
        leases,
        JSON,
        json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}}),
        422,
        "spec.leaseDurationSeconds",
        &lease,
    )
    .await;
    let body = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 3}});
    let (code, _) = send(
        &s,
        Method::POST,
        leases,
        JSON,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 201);
    refused(
        &s,
        Method::PATCH,
        &lease,
        MERGE,
        json!({"spec": {"leaseDurationSeconds": "3"}}),
        422,
        "patch",
        &lease,
    )
    .await;
    refused(
        &s,
        Method::PATCH,
        &lease,
        MERGE,
        json!({"spec": {"leaseTransitions": -1}}),
        422,
        "spec.leaseTransitions",
        &lease,
    )
    .await;
    s.shutdown().await;
}
