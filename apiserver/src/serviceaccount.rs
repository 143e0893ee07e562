//! ServiceAccount tokens: the `serviceaccounts/<name>/token` subresource
//! (`authentication.k8s.io/v1` TokenRequest, what the kubelet and `kubectl
//! create token` ask), and the Pod-bound identity it shares with
//! [`ApiServerHandle::token_for_pod`](crate::ApiServerHandle::token_for_pod).
//!
//! Pure apart from reading the store: the caller passes the time in and
//! registers the returned credential.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::auth::{
    BoundObject, Credential, EXTRA_CREDENTIAL_ID, EXTRA_NODE_NAME, EXTRA_NODE_UID, Identity,
};
use crate::error::ApiError;
use crate::resources::{RESOURCES, idx};
use crate::store::Store;

/// The audience of tokens this server accepts, and the default audience of
/// a TokenRequest (kube-apiserver's `--api-audiences`, which defaults to its
/// issuer). A token minted for other audiences is issued but refused here.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Lifetime of a token whose request names none (the `v1` default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// Shortest lifetime a TokenRequest may ask for (kube-apiserver validation).
const MIN_EXPIRATION_SECONDS: i64 = 600;

/// Longest lifetime a TokenRequest may ask for (kube-apiserver validation).
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

const GROUP_KIND: &str = "TokenRequest.authentication.k8s.io";

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The ServiceAccount a Pod runs as: `default` when the spec names none, as
/// the ServiceAccount admission plugin fills it in on the real server.
fn pod_service_account(pod: &Value) -> &str {
    match str_at(pod, "/spec/serviceAccountName") {
        "" => "default",
        sa => sa,
    }
}

/// The identity of a token bound to a stored Pod, as kube-apiserver derives
/// it: the Pod's ServiceAccount (its UID when the ServiceAccount is stored),
/// the Pod's name and UID, and, when the Pod is scheduled, its Node's name and
/// (if the Node is stored) UID, all in `extra`. Also the Pod as the object
/// the token is bound to.
pub(crate) fn pod_bound_identity(
    store: &Store,
    namespace: &str,
    pod: &Value,
) -> (Identity, BoundObject) {
    let sa = pod_service_account(pod);
    let mut identity = Identity::service_account(namespace, sa);
    if let Some(sa_obj) = store.get(idx::SERVICE_ACCOUNTS, namespace, sa) {
        let uid = str_at(&sa_obj, "/metadata/uid");
        if !uid.is_empty() {
            identity = identity.with_uid(uid);
        }
    }
    let node = str_at(pod, "/spec/nodeName");
    let node_uid = store
        .get(idx::NODES, "", node)
        .map(|n| str_at(&n, "/metadata/uid").to_string())
        .unwrap_or_default();
    let (name, uid) = (str_at(pod, "/metadata/name"), str_at(pod, "/metadata/uid"));
    let identity = identity.bound_to_pod(name, uid, node, &node_uid);
    let bound = BoundObject {
        resource: idx::PODS,
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    };
    (identity, bound)
}

/// An issued token: the TokenRequest answer, and the credential to register
/// (`None` when the token's audiences do not include [`API_AUDIENCE`]: the
/// real server would refuse such a token too).
#[derive(Debug)]
pub(crate) struct Issued {
    /// The bearer token (`status.token`).
    pub token: String,
    /// What the token authenticates as, if it is meant for this server.
    pub credential: Option<Credential>,
    /// The TokenRequest with `status` filled in.
    pub response: Value,
}

fn invalid(name: &str, why: impl AsRef<str>) -> ApiError {
    ApiError::invalid_kind(GROUP_KIND, name, why)
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Answers `POST /api/v1/namespaces/<namespace>/serviceaccounts/<sa>/token`
/// with `body` (a TokenRequest) at `now`, with kube-apiserver's checks: the
/// ServiceAccount must exist (404); a bound Pod must exist (404), run as
/// that ServiceAccount (400) and match a given UID (409); a bound Secret or
/// Node must exist; expirationSeconds within [10 min, 2^32 s] (422).
pub(crate) fn token_request(
    store: &Store,
    now: SystemTime,
    namespace: &str,
    sa_name: &str,
    mut body: Value,
) -> Result<Issued, ApiError> {
    check_type(&mut body)?;
    let meta_name = str_at(&body, "/metadata/name");
    if !meta_name.is_empty() && meta_name != sa_name {
        return Err(invalid(
            sa_name,
            format!(
                "metadata.name: Invalid value: \"{meta_name}\": must match the service account name if specified"
            ),
        ));
    }
    let meta_ns = str_at(&body, "/metadata/namespace");
    if !meta_ns.is_empty() && meta_ns != namespace {
        return Err(invalid(
            sa_name,
            format!(
                "metadata.namespace: Invalid value: \"{meta_ns}\": must match the service account namespace if specified"
            ),
        ));
    }
    let sa = store
        .get(idx::SERVICE_ACCOUNTS, namespace, sa_name)
        .ok_or_else(|| ApiError::not_found(&RESOURCES[idx::SERVICE_ACCOUNTS], sa_name))?;
    let sa_uid = str_at(&sa, "/metadata/uid").to_string();

    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let mut audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences.push(API_AUDIENCE.into());
    }
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| {
            invalid(
                "",
                format!("spec.expirationSeconds: Invalid value: {v}: must be an integer"),
            )
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            format!(
                "spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration less than 10 minutes"
            ),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            "",
            format!(
                "spec.expirationSeconds: Invalid value: {expiration}: may not specify a duration larger than 2^32 seconds"
            ),
        ));
    }

    let mut identity = Identity::service_account(namespace, sa_name).with_uid(&sa_uid);
    let mut bound = vec![BoundObject {
        resource: idx::SERVICE_ACCOUNTS,
        namespace: namespace.into(),
        name: sa_name.into(),
        uid: sa_uid.clone(),
    }];
    let mut claims_bound = serde_json::Map::new();
    let bound_ref = spec.get("boundObjectRef").filter(|r| !r.is_null());
    if let Some(r) = bound_ref {
        let (kind, api_version) = (str_at(r, "/kind"), str_at(r, "/apiVersion"));
        let (name, want_uid) = (str_at(r, "/name"), str_at(r, "/uid"));
        let core = api_version.is_empty() || api_version == "v1";
        let (object, uid) = match kind {
            "Pod" if core => {
                let pod = store
                    .get(idx::PODS, namespace, name)
                    .ok_or_else(|| ApiError::not_found(&RESOURCES[idx::PODS], name))?;
                if pod_service_account(&pod) != sa_name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount \"{sa_name}\" to pod running with different serviceaccount name."
                    )));
                }
                let (pod_identity, object) = pod_bound_identity(store, namespace, &pod);
                identity.extra = pod_identity.extra;
                claims_bound.insert("pod".into(), json!({"name": name, "uid": object.uid}));
                if let Some(node) = identity.extra.get(EXTRA_NODE_NAME).and_then(|v| v.first()) {
                    let node_uid = identity
                        .extra
                        .get(EXTRA_NODE_UID)
                        .and_then(|v| v.first())
                        .cloned()
                        .unwrap_or_default();
                    claims_bound.insert("node".into(), json!({"name": node, "uid": node_uid}));
                }
                let uid = object.uid.clone();
                (object, uid)
            }
            "Node" if core => {
                let node = store
                    .get(idx::NODES, "", name)
                    .ok_or_else(|| ApiError::not_found(&RESOURCES[idx::NODES], name))?;
                let uid = str_at(&node, "/metadata/uid").to_string();
                identity
                    .extra
                    .insert(EXTRA_NODE_NAME.into(), vec![name.into()]);
                identity
                    .extra
                    .insert(EXTRA_NODE_UID.into(), vec![uid.clone()]);
                claims_bound.insert("node".into(), json!({"name": name, "uid": uid}));
                let object = BoundObject {
                    resource: idx::NODES,
                    namespace: String::new(),
                    name: name.into(),
                    uid: uid.clone(),
                };
                (object, uid)
            }
            "Secret" if core => {
                let secret = store
                    .get(idx::SECRETS, namespace, name)
                    .ok_or_else(|| ApiError::not_found(&RESOURCES[idx::SECRETS], name))?;
                let uid = str_at(&secret, "/metadata/uid").to_string();
                claims_bound.insert("secret".into(), json!({"name": name, "uid": uid}));
                let object = BoundObject {
                    resource: idx::SECRETS,
                    namespace: namespace.into(),
                    name: name.into(),
                    uid: uid.clone(),
                };
                (object, uid)
            }
            _ => {
                // Go's GroupVersionKind.String() form, as kube-apiserver words it.
                let gv = if api_version.contains('/') {
                    api_version.to_string()
                } else {
                    format!("/{api_version}")
                };
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {gv}, Kind={kind}"
                )));
            }
        };
        if !want_uid.is_empty() && want_uid != uid {
            return Err(ApiError::conflict_on(
                kind,
                name,
                &format!(
                    "the UID in the bound object reference ({want_uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        bound.push(object);
    }

    // The credential id names this token's JWT ID, as in the real server's audit log.
    let jti = uuid::Uuid::new_v4().to_string();
    identity
        .extra
        .insert(EXTRA_CREDENTIAL_ID.into(), vec![format!("JTI={jti}")]);
    let expires = now + Duration::from_secs(expiration.unsigned_abs());
    let mut k8s_claims = json!({
        "namespace": namespace,
        "serviceaccount": {"name": sa_name, "uid": sa_uid},
    });
    if let Some(m) = k8s_claims.as_object_mut() {
        m.extend(claims_bound);
    }
    let claims = json!({
        "aud": audiences, "exp": unix(expires), "iat": unix(now), "nbf": unix(now),
        "iss": API_AUDIENCE, "jti": jti, "sub": identity.username,
        "kubernetes.io": k8s_claims,
    });
    let token = jwt(&claims);
    let credential = audiences
        .iter()
        .any(|a| a == API_AUDIENCE)
        .then_some(Credential {
            identity,
            expires: Some(expires),
            bound,
        });
    let mut out_spec = json!({"audiences": audiences, "expirationSeconds": expiration});
    if let (Some(r), Some(m)) = (bound_ref, out_spec.as_object_mut()) {
        m.insert("boundObjectRef".into(), r.clone());
    }
    let response = json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa_name, "namespace": namespace, "creationTimestamp": rfc3339(now)},
        "spec": out_spec,
        "status": {"token": token, "expirationTimestamp": rfc3339(expires)},
    });
    Ok(Issued {
        token,
        credential,
        response,
    })
}

/// `apiVersion`/`kind` of a TokenRequest body, filled in when absent.
fn check_type(body: &mut Value) -> Result<(), ApiError> {
    let map = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    for (field, want) in [
        ("apiVersion", "authentication.k8s.io/v1"),
        ("kind", "TokenRequest"),
    ] {
        match map.get(field).and_then(Value::as_str) {
            None | Some("") => drop(map.insert(field.into(), Value::String(want.into()))),
            Some(got) if got == want => {}
            Some(got) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({got}) does not match the expected {field} ({want}): serviceaccounts/token takes an authentication.k8s.io/v1 TokenRequest"
                )));
            }
        }
    }
    Ok(())
}

/// A JWT-shaped token carrying the claims kube-apiserver puts in one, so a
/// client that reads its own token's expiry or binding can. The signature
/// is random bytes: this server does not serve a JWKS, and it looks tokens up
/// instead of verifying them.
fn jwt(claims: &Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = json!({"alg": "RS256", "kid": "kube-ovn-ipsec-lab"});
    let signature = [
        uuid::Uuid::new_v4().into_bytes(),
        uuid::Uuid::new_v4().into_bytes(),
    ]
    .concat();
    format!(
        "{}.{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string()),
        b64.encode(signature)
    )
}

#[cfg(test)]
mod tests;
