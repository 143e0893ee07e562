//! TokenRequest (`POST .../serviceaccounts/<name>/token`) over HTTPS: what a
//! minted token authenticates as, what is refused and why, when it stops
//! working; and `Impersonate-*` headers under RBAC.

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerHandle, Identity};
use axum::http::{Method, Request};
use http_body_util::BodyExt;
use kube_ovn_ipsec_api::clock::Clock;
use serde_json::{Value, json};

/// A wall clock the test moves (a TokenRequest lasts at least ten minutes).
#[derive(Debug)]
struct TestClock(Mutex<SystemTime>);

impl TestClock {
    fn new() -> Arc<Self> {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        Arc::new(TestClock(Mutex::new(start)))
    }

    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

struct Req<'a> {
    method: Method,
    path: &'a str,
    content_type: &'a str,
    body: Vec<u8>,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> Req<'a> {
    fn new(method: Method, path: &'a str) -> Self {
        Req {
            method,
            path,
            content_type: "application/json",
            body: Vec::new(),
            headers: Vec::new(),
        }
    }

    fn json(mut self, body: &Value) -> Self {
        self.body = body.to_string().into_bytes();
        self
    }

    fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }

    async fn send(self, s: &ApiServerHandle, token: &str) -> (u16, Value) {
        let client = s.client(token).await.unwrap();
        let mut b = Request::builder()
            .method(self.method)
            .uri(self.path)
            .header("content-type", self.content_type);
        for (k, v) in self.headers {
            b = b.header(k, v);
        }
        let req = b.body(kube::client::Body::from(self.body)).unwrap();
        let resp = client.send(req).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

const TOKEN: &str = "/api/v1/namespaces/kube-system/serviceaccounts/kube-ovn-cni/token";
const WHOAMI: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

async fn post(s: &ApiServerHandle, token: &str, path: &str, body: Value) -> (u16, Value) {
    Req::new(Method::POST, path)
        .json(&body)
        .send(s, token)
        .await
}

/// `SelfSubjectReview` as `token`: (HTTP code, userInfo).
async fn whoami(s: &ApiServerHandle, token: &str) -> (u16, Value) {
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (code, review) = post(s, token, WHOAMI, body).await;
    (code, review["status"]["userInfo"].clone())
}

async fn created(s: &ApiServerHandle, path: &str, body: Value) -> Value {
    let (code, obj) = post(s, ADMIN_TOKEN, path, body).await;
    assert_eq!(code, 201, "{path}: {obj}");
    obj
}

/// A server with RBAC, the `kube-ovn-cni` ServiceAccount, a Node, and two
/// Pods on it: one running as `kube-ovn-cni`, one as `default`.
async fn cluster(clock: Arc<TestClock>) -> (ApiServerHandle, Value, Value, Value) {
    let s = ApiServer::builder()
        .rbac(true)
        .clock(clock)
        .start()
        .await
        .unwrap();
    let sa = created(
        &s,
        "/api/v1/namespaces/kube-system/serviceaccounts",
        json!({"metadata": {"name": "kube-ovn-cni"}}),
    )
    .await;
    let node = created(&s, "/api/v1/nodes", json!({"metadata": {"name": "node1"}})).await;
    let pods = "/api/v1/namespaces/kube-system/pods";
    let pod = |name: &str, sa: &str| {
        json!({"metadata": {"name": name}, "spec": {"serviceAccountName": sa, "nodeName": "node1",
               "containers": [{"name": "c", "image": "x"}]}})
    };
    let cni = created(&s, pods, pod("kube-ovn-cni-abcde", "kube-ovn-cni")).await;
    created(&s, pods, pod("other", "default")).await;
    let uid = |o: &Value| o["metadata"]["uid"].clone();
    let uids = (uid(&sa), uid(&node), uid(&cni));
    (s, uids.0, uids.1, uids.2)
}

#[tokio::test]
async fn a_pod_bound_token_authenticates_as_the_service_account_with_the_pod_extras() {
    let clock = TestClock::new();
    let (s, sa_uid, node_uid, pod_uid) = cluster(clock.clone()).await;
    // As the kubelet asks for a projected token: Pod name and UID, 3607 s.
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [apiserver::API_AUDIENCE], "expirationSeconds": 3607,
                 "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "kube-ovn-cni-abcde", "uid": pod_uid}}});
    let (code, resp) = post(&s, ADMIN_TOKEN, TOKEN, req).await;
    assert_eq!(code, 201, "{resp}");
    assert_eq!(resp["kind"], "TokenRequest");
    assert_eq!(
        resp["status"]["expirationTimestamp"],
        "2027-01-15T09:00:07Z"
    );
    let token = resp["status"]["token"].as_str().unwrap().to_string();

    let (code, user) = whoami(&s, &token).await;
    assert_eq!(code, 201, "{user}");
    assert_eq!(
        user["username"],
        "system:serviceaccount:kube-system:kube-ovn-cni"
    );
    assert_eq!(user["uid"], sa_uid);
    assert_eq!(
        user["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ])
    );
    let extra = &user["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        json!(["kube-ovn-cni-abcde"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        json!([pod_uid])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        json!(["node1"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-uid"],
        json!([node_uid])
    );
    assert!(
        extra["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .unwrap()
            .starts_with("JTI=")
    );

    // RBAC sees the ServiceAccount: nothing granted yet.
    let (code, status) = Req::new(Method::GET, "/api/v1/nodes")
        .send(&s, &token)
        .await;
    assert_eq!(code, 403, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:kube-system:kube-ovn-cni"),
        "{status}"
    );

    // Valid until its expiry, not after.
    clock.advance(Duration::from_secs(3606));
    assert_eq!(whoami(&s, &token).await.0, 201);
    clock.advance(Duration::from_secs(1));
    let (code, _) = whoami(&s, &token).await;
    assert_eq!(code, 401, "an expired token must not authenticate");
    s.shutdown().await;
}

#[tokio::test]
async fn an_unbound_token_lasts_an_hour_and_dies_with_its_service_account() {
    let clock = TestClock::new();
    let (s, ..) = cluster(clock.clone()).await;
    let (code, resp) = post(&s, ADMIN_TOKEN, TOKEN, json!({"spec": {}})).await;
    assert_eq!(code, 201, "{resp}");
    assert_eq!(resp["spec"]["expirationSeconds"], 3600);
    assert_eq!(resp["spec"]["audiences"], json!([apiserver::API_AUDIENCE]));
    let token = resp["status"]["token"].as_str().unwrap().to_string();
    let (code, user) = whoami(&s, &token).await;
    assert_eq!(code, 201);
    assert_eq!(
        user["username"],
        "system:serviceaccount:kube-system:kube-ovn-cni"
    );
    assert!(
        user["extra"]
            .get("authentication.kubernetes.io/pod-name")
            .is_none()
    );
    // Deleting the ServiceAccount revokes its tokens, as on the real server.
    let (code, _) = Req::new(
        Method::DELETE,
        "/api/v1/namespaces/kube-system/serviceaccounts/kube-ovn-cni",
    )
    .send(&s, ADMIN_TOKEN)
    .await;
    assert_eq!(code, 200);
    assert_eq!(whoami(&s, &token).await.0, 401);
    s.shutdown().await;
}

#[tokio::test]
async fn deleting_the_bound_pod_revokes_its_token() {
    let (s, ..) = cluster(TestClock::new()).await;
    let req = json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "kube-ovn-cni-abcde"}}});
    let (_, resp) = post(&s, ADMIN_TOKEN, TOKEN, req).await;
    let token = resp["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(whoami(&s, &token).await.0, 201);
    let (code, _) = Req::new(
        Method::DELETE,
        "/api/v1/namespaces/kube-system/pods/kube-ovn-cni-abcde",
    )
    .send(&s, ADMIN_TOKEN)
    .await;
    assert_eq!(code, 200);
    assert_eq!(whoami(&s, &token).await.0, 401);
    s.shutdown().await;
}

#[tokio::test]
async fn refused_token_requests_say_why() {
    let (s, ..) = cluster(TestClock::new()).await;
    let bound = |name: &str| json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name}}});
    let cases = [
        (
            "/api/v1/namespaces/kube-system/serviceaccounts/nobody/token",
            json!({}),
            404,
            "serviceaccounts \"nobody\" not found",
        ),
        (
            TOKEN,
            bound("other"),
            400,
            "cannot bind token for serviceaccount \"kube-ovn-cni\" to pod running with different serviceaccount name.",
        ),
        (TOKEN, bound("gone"), 404, "pods \"gone\" not found"),
        (
            TOKEN,
            json!({"spec": {"expirationSeconds": 60}}),
            422,
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes",
        ),
        (
            TOKEN,
            json!({"spec": {"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "x"}}}),
            400,
            "cannot bind token to object of type /v1, Kind=ConfigMap",
        ),
    ];
    for (path, body, code, message) in cases {
        let before = s.store().resource_version();
        let (got, status) = post(&s, ADMIN_TOKEN, path, body).await;
        assert_eq!(
            (got, status["message"].as_str()),
            (code, Some(message)),
            "{status}"
        );
        assert_eq!(status["kind"], "Status");
        assert_eq!(s.store().resource_version(), before);
    }
    // Create-only: reading or writing the subresource is 405.
    let (code, _) = Req::new(Method::GET, TOKEN).send(&s, ADMIN_TOKEN).await;
    assert_eq!(code, 405);
    // A protobuf body of a kind the server cannot read is 415 naming it; garbage is 400.
    let mut pb = b"k8s\0".to_vec();
    let type_meta = [&[0x0a, 2][..], b"v1", &[0x12, 3], b"Pod"].concat();
    pb.extend_from_slice(&[0x0a, type_meta.len() as u8]);
    pb.extend_from_slice(&type_meta);
    let mut req = Req::new(Method::POST, TOKEN);
    req.content_type = "application/vnd.kubernetes.protobuf";
    req.body = pb;
    let (code, status) = req.send(&s, ADMIN_TOKEN).await;
    assert_eq!(code, 415, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("kind \"Pod\""),
        "{status}"
    );
    let mut req = Req::new(Method::POST, TOKEN);
    req.content_type = "application/vnd.kubernetes.protobuf";
    req.body = b"k8s\0\x0a\x09ab".to_vec();
    assert_eq!(req.send(&s, ADMIN_TOKEN).await.0, 400);
    s.shutdown().await;
}

/// Minting a token is `create` on `serviceaccounts/token`.
#[tokio::test]
async fn minting_needs_create_on_serviceaccounts_token() {
    let (s, ..) = cluster(TestClock::new()).await;
    s.add_token("minter", Identity::user("minter"));
    let (code, status) = post(&s, "minter", TOKEN, json!({})).await;
    assert_eq!(code, 403, "{status}");
    assert_eq!(
        status["message"],
        "serviceaccounts \"kube-ovn-cni\" is forbidden: User \"minter\" cannot create resource \"serviceaccounts/token\" in the namespace \"kube-system\""
    );
    created(
        &s,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles",
        json!({"metadata": {"name": "mint"},
               "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}]}),
    )
    .await;
    created(
        &s,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
        json!({"metadata": {"name": "mint"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mint"},
               "subjects": [{"kind": "User", "name": "minter"}]}),
    )
    .await;
    let (code, resp) = post(&s, "minter", TOKEN, json!({})).await;
    assert_eq!(code, 201, "{resp}");
    s.shutdown().await;
}

/// `Impersonate-User`/`-Group`/`-Extra-*` need the `impersonate` verb on
/// each part; the request then runs as the impersonated user.
#[tokio::test]
async fn impersonation_needs_the_impersonate_verb() {
    let (s, ..) = cluster(TestClock::new()).await;
    s.add_token("tester", Identity::user("tester"));
    let sa = "system:serviceaccount:kube-system:kube-ovn-cni";
    let (code, status) = Req::new(Method::POST, WHOAMI)
        .json(&json!({}))
        .header("Impersonate-User", sa)
        .send(&s, "tester")
        .await;
    assert_eq!(code, 403, "{status}");
    assert_eq!(
        status["message"],
        "serviceaccounts \"kube-ovn-cni\" is forbidden: User \"tester\" cannot impersonate resource \"serviceaccounts\" in the namespace \"kube-system\""
    );
    created(
        &s,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "impersonator"}, "rules": [
            {"apiGroups": [""], "resources": ["serviceaccounts", "groups"], "verbs": ["impersonate"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/authentication.kubernetes.io/pod-name"], "verbs": ["impersonate"]}]}),
    )
    .await;
    created(
        &s,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "impersonator"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "impersonator"},
               "subjects": [{"kind": "User", "name": "tester"}]}),
    )
    .await;
    // A ServiceAccount impersonated without groups gets its own.
    let (code, review) = Req::new(Method::POST, WHOAMI)
        .json(&json!({}))
        .header("Impersonate-User", sa)
        .header(
            "Impersonate-Extra-authentication.kubernetes.io%2fpod-name",
            "kube-ovn-cni-abcde",
        )
        .send(&s, "tester")
        .await;
    assert_eq!(code, 201, "{review}");
    let user = &review["status"]["userInfo"];
    assert_eq!(user["username"], sa);
    assert_eq!(
        user["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ])
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["kube-ovn-cni-abcde"])
    );
    // A user (not a ServiceAccount) needs `impersonate` on users.
    let (code, _) = Req::new(Method::POST, WHOAMI)
        .json(&json!({}))
        .header("Impersonate-User", "alice")
        .send(&s, "tester")
        .await;
    assert_eq!(code, 403);
    // Groups without a user are refused with the reason.
    let (code, status) = Req::new(Method::POST, WHOAMI)
        .json(&json!({}))
        .header("Impersonate-Group", "system:masters")
        .send(&s, "tester")
        .await;
    assert_eq!(code, 400, "{status}");
    // The impersonated identity is what RBAC judges.
    let (code, _) = Req::new(Method::GET, "/api/v1/nodes")
        .header("Impersonate-User", sa)
        .send(&s, ADMIN_TOKEN)
        .await;
    assert_eq!(code, 403, "an impersonated ServiceAccount has no grants");
    s.shutdown().await;
}

/// Discovery lists `serviceaccounts/token` as a create-only TokenRequest and
/// serves `selfsubjectreviews`, as kube-apiserver's does.
#[tokio::test]
async fn discovery_lists_the_token_subresource_and_self_subject_reviews() {
    let s = common::server(false, &[]).await;
    let (code, core) = Req::new(Method::GET, "/api/v1").send(&s, ADMIN_TOKEN).await;
    assert_eq!(code, 200);
    let token = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .cloned()
        .unwrap();
    assert_eq!(token["kind"], "TokenRequest");
    assert_eq!(token["verbs"], json!(["create"]));
    let (code, authn) = Req::new(Method::GET, "/apis/authentication.k8s.io/v1")
        .send(&s, ADMIN_TOKEN)
        .await;
    assert_eq!(code, 200);
    assert_eq!(authn["resources"][0]["name"], "selfsubjectreviews");
    s.shutdown().await;
}
