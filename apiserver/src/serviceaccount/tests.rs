use super::*;
use crate::auth::{EXTRA_POD_NAME, EXTRA_POD_UID};
use crate::store::Write;

fn store() -> Store {
    let store = Store::new(100);
    let put = |res: usize, ns: &str, obj: Value| {
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        store
            .write(res, ns, &name, |_| Ok(Write::Put(obj)))
            .unwrap();
    };
    put(
        idx::SERVICE_ACCOUNTS,
        "ns",
        json!({"metadata": {"name": "sa", "namespace": "ns", "uid": "sa-uid"}}),
    );
    put(
        idx::NODES,
        "",
        json!({"metadata": {"name": "n1", "uid": "node-uid"}}),
    );
    put(
        idx::PODS,
        "ns",
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
               "spec": {"serviceAccountName": "sa", "nodeName": "n1"}}),
    );
    put(
        idx::PODS,
        "ns",
        json!({"metadata": {"name": "other", "namespace": "ns", "uid": "o-uid"}, "spec": {}}),
    );
    store
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

#[test]
fn an_unbound_token_defaults_to_an_hour_for_the_api_audience() {
    let issued = token_request(&store(), now(), "ns", "sa", json!({})).unwrap();
    let cred = issued.credential.unwrap();
    assert_eq!(cred.identity.username, "system:serviceaccount:ns:sa");
    assert_eq!(cred.identity.uid, "sa-uid");
    assert_eq!(cred.expires, Some(now() + Duration::from_secs(3600)));
    assert_eq!(cred.bound.len(), 1);
    assert!(cred.identity.extra.contains_key(EXTRA_CREDENTIAL_ID));
    assert!(!cred.identity.extra.contains_key(EXTRA_POD_NAME));
    let r = &issued.response;
    assert_eq!(r["status"]["token"], issued.token.as_str());
    assert_eq!(r["status"]["expirationTimestamp"], "2027-01-15T09:00:00Z");
    assert_eq!(r["spec"]["audiences"], json!([API_AUDIENCE]));
    assert_eq!(r["metadata"]["name"], "sa");
    // JWT-shaped, with the claims kube-apiserver puts in.
    let payload = issued.token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["sub"], "system:serviceaccount:ns:sa");
    assert_eq!(claims["exp"], 1_800_003_600u64);
    assert_eq!(
        cred.identity.extra[EXTRA_CREDENTIAL_ID],
        vec![format!("JTI={}", claims["jti"].as_str().unwrap())]
    );
}

#[test]
fn a_pod_bound_token_carries_the_pod_and_node_extras() {
    let body = json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"},
                               "expirationSeconds": 600}});
    let issued = token_request(&store(), now(), "ns", "sa", body).unwrap();
    let cred = issued.credential.unwrap();
    let extra = &cred.identity.extra;
    assert_eq!(extra[EXTRA_POD_NAME], vec!["p".to_string()]);
    assert_eq!(extra[EXTRA_POD_UID], vec!["pod-uid".to_string()]);
    assert_eq!(extra[EXTRA_NODE_NAME], vec!["n1".to_string()]);
    assert_eq!(extra[EXTRA_NODE_UID], vec!["node-uid".to_string()]);
    assert_eq!(cred.bound[1].uid, "pod-uid");
    assert_eq!(cred.expires, Some(now() + Duration::from_secs(600)));
    assert_eq!(issued.response["spec"]["boundObjectRef"]["name"], "p");
}

#[test]
fn token_for_pod_and_token_request_mint_the_same_identity() {
    let s = store();
    let pod = s.get(idx::PODS, "ns", "p").unwrap();
    let (mut direct, _) = pod_bound_identity(&s, "ns", &pod);
    let body =
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}});
    let mut requested = token_request(&s, now(), "ns", "sa", body)
        .unwrap()
        .credential
        .unwrap()
        .identity;
    direct.extra.remove(EXTRA_CREDENTIAL_ID);
    requested.extra.remove(EXTRA_CREDENTIAL_ID);
    assert_eq!(direct, requested);
}

#[test]
fn refusals_name_their_reason() {
    let s = store();
    let err = |sa: &str, body: Value| token_request(&s, now(), "ns", sa, body).unwrap_err();
    let e = err("missing", json!({}));
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "serviceaccounts \"missing\" not found")
    );
    let pod = |name: &str| json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": name}}});
    let e = err("sa", pod("other"));
    assert_eq!(e.code, 400);
    assert_eq!(
        e.message,
        "cannot bind token for serviceaccount \"sa\" to pod running with different serviceaccount name."
    );
    assert_eq!(err("sa", pod("gone")).code, 404);
    let e = err(
        "sa",
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "stale"}}}),
    );
    assert_eq!(e.code, 409);
    assert!(
        e.message.contains("does not match the UID in record"),
        "{e}"
    );
    let e = err("sa", json!({"spec": {"expirationSeconds": 60}}));
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"
    );
    assert_eq!(
        err("sa", json!({"spec": {"expirationSeconds": 1i64 << 33}})).code,
        422
    );
    let e = err(
        "sa",
        json!({"spec": {"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "x"}}}),
    );
    assert_eq!(
        e.message,
        "cannot bind token to object of type /v1, Kind=ConfigMap"
    );
    assert_eq!(err("sa", json!({"metadata": {"name": "other"}})).code, 422);
    assert_eq!(err("sa", json!({"kind": "Pod"})).code, 400);
}

#[test]
fn a_token_for_another_audience_is_issued_but_not_registered() {
    let body = json!({"spec": {"audiences": ["vault"]}});
    let issued = token_request(&store(), now(), "ns", "sa", body).unwrap();
    assert!(issued.credential.is_none());
    assert!(!issued.token.is_empty());
}
