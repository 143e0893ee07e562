//! HTTP handling: authentication, authorization, and the
//! get/list/watch/create/update/patch/delete verbs on the store.
//!
//! One fallback handler serves every path; what a path names comes from the
//! pure grammar in `routes`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use kube_ovn_ipsec_api::clock::Clock;

use crate::FutureWatch;
use crate::auth::{BoundObject, Identity, Tokens};
use crate::discovery;
use crate::error::ApiError;
use crate::objects::{self, certificate_changed, prepare_create, prepare_delete, prepare_update};
use crate::patch::{self, PatchKind};
use crate::protobuf;
use crate::rbac::{self, Attributes, Decision};
use crate::resources::{RESOURCES, ResourceDef, Storage, idx};
use crate::routes::{ResourcePath, Route, parse_route, query_map};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::serviceaccount;
use crate::store::{Store, Write};
use crate::validation;
use crate::watch::{self, WatchSpec};

/// Largest request body accepted, as the real server's limit (3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// State shared by every request.
#[derive(Debug)]
pub struct Shared {
    /// The objects.
    pub store: Arc<Store>,
    /// Bearer tokens.
    pub tokens: Arc<Tokens>,
    /// Enforce RBAC (otherwise every authenticated request is allowed).
    pub rbac: bool,
    /// The bound address, for `/api`'s serverAddressByClientCIDRs.
    pub addr: SocketAddr,
    /// Ends watches: on shutdown, and when the store is reset.
    pub shutdown: CancellationToken,
    /// How often watches with `allowWatchBookmarks` get a bookmark.
    pub bookmark_interval: Duration,
    /// How a watch from a resourceVersion not issued yet is answered.
    pub future_watch: FutureWatch,
    /// Wall time, for token issuance and expiry.
    pub clock: Arc<dyn Clock>,
    /// Faults a test drives in.
    pub faults: Arc<crate::faults::Faults>,
}

/// The [`Shared`] state requests are served with, replaced whole when the
/// store is reset under open connections.
#[derive(Debug)]
pub struct Current(std::sync::RwLock<Arc<Shared>>);

impl Current {
    /// Serves `shared` from now on.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self(std::sync::RwLock::new(shared))
    }

    /// The state of this moment (a request keeps the one it started with).
    pub fn get(&self) -> Arc<Shared> {
        // Only ever swapped whole: a poisoned lock still holds a complete state.
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `shared` from now on; returns the state it replaces.
    pub fn replace(&self, shared: Arc<Shared>) -> Arc<Shared> {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *current, shared)
    }
}

/// The axum router: everything goes through [`handle`].
pub fn router(current: Arc<Current>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(current)
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    // Serialising a Value cannot fail (its map keys are strings).
    let json = serde_json::to_vec(body).unwrap_or_default();
    bytes_response(code, Bytes::from(json), "application/json")
}

/// The answer to a write: the stored object, serialised once with its event.
fn written_response(code: StatusCode, written: &crate::store::Written) -> Response {
    match &written.json {
        Some(json) => bytes_response(code, json.clone(), "application/json"),
        None => json_response(code, &written.object),
    }
}

fn bytes_response(code: StatusCode, body: Bytes, content_type: &'static str) -> Response {
    let mut resp = (code, body).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// The one entry point: turns every failure into a `Status`.
pub async fn handle(State(current): State<Arc<Current>>, req: Request) -> Response {
    let shared = current.get();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let resp = match serve(&shared, req).await {
        Ok(resp) => resp,
        Err(err) => err.into_response(),
    };
    tracing::debug!(%method, %path, status = resp.status().as_u16(), "apiserver request");
    resp
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            || e.to_string().contains("length limit");
        if too_large {
            ApiError::too_large(MAX_BODY)
        } else {
            ApiError::bad_request(format!("reading the request body: {e}"))
        }
    })
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Decodes a POST/PUT body: JSON, or the protobuf kubectl's typed clients send.
fn decode_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or("").trim();
    if base == "application/json" || base.is_empty() || base == "*/*" {
        parse_json(body)
    } else if base == protobuf::CONTENT_TYPE {
        protobuf::decode(body)
    } else {
        Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json (got {ct:?})"
        )))
    }
}

async fn serve(shared: &Shared, req: Request) -> Result<Response, ApiError> {
    let path = req.uri().path().to_string();
    let route = parse_route(&path);
    if route == Ok(Route::Health) {
        return Ok(bytes_response(
            StatusCode::OK,
            Bytes::from_static(b"ok"),
            "text/plain",
        ));
    }
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let now = shared.clock.now();
    let id = shared
        .tokens
        .authenticate(auth, now, |b| bound_object_exists(&shared.store, b))
        .ok_or_else(ApiError::unauthorized)?;
    let id = impersonate(shared, id, req.headers())?;
    let route = route?;
    let method = req.method().clone();
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let rp = match route {
        Route::Resource(rp) => rp,
        other => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed(method.as_str(), &path));
            }
            let attrs = Attributes {
                verb: "get".into(),
                path: Some(path.clone()),
                ..Default::default()
            };
            authorize(shared, &id, &attrs)?;
            return discovery_response(shared, other, &accept, &path);
        }
    };
    let query = query_map(req.uri().query());
    if query.get("dryRun").is_some_and(|v| !v.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the lab API server",
        ));
    }
    let def = &RESOURCES[rp.resource];
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    // The route grammar only lets `token` through under serviceaccounts.
    let token_sub = rp.subresource.as_deref() == Some("token");
    let verb = match (&method, rp.name.is_some()) {
        // The token subresource is create-only: `POST .../serviceaccounts/<name>/token`.
        (&Method::POST, true) if token_sub => "create",
        _ if token_sub => return Err(ApiError::method_not_allowed(method.as_str(), &path)),
        (&Method::GET, true) => "get",
        (&Method::GET, false) if is_watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return Err(ApiError::method_not_allowed(method.as_str(), &path)),
    };
    if def.storage == Storage::Review && verb != "create" {
        return Err(ApiError::method_not_allowed(method.as_str(), &path));
    }
    if rp.subresource.is_some() && !token_sub && !matches!(verb, "get" | "update" | "patch") {
        return Err(ApiError::method_not_allowed(method.as_str(), &path));
    }
    if def.namespaced && rp.namespace.is_none() && !matches!(verb, "list" | "watch") {
        return Err(ApiError::method_not_allowed(method.as_str(), &path));
    }
    let attrs = Attributes {
        verb: verb.into(),
        group: def.group.into(),
        resource: def.plural.into(),
        subresource: rp.subresource.clone().unwrap_or_default(),
        name: rp.name.clone().unwrap_or_default(),
        namespace: rp.namespace.clone().unwrap_or_default(),
        path: None,
    };
    authorize(shared, &id, &attrs)?;
    let ns = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    if let Some(fault) = shared.faults.take(verb, def.plural, &name) {
        return Err(fault);
    }
    match verb {
        "get" => {
            let obj = shared
                .store
                .get(rp.resource, &ns, &name)
                .ok_or_else(|| ApiError::not_found(def, &name))?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        "list" => list(shared, def, &rp, &query),
        "watch" => watch(shared, def, &rp, &query),
        "create" => {
            let headers = req.headers().clone();
            let body = read_body(req.into_body()).await?;
            let obj = decode_body(&headers, &body)?;
            if token_sub {
                return token_request(shared, &ns, &name, obj);
            }
            match (def.storage, def.kind) {
                (Storage::Review, "SelfSubjectReview") => self_subject_review(def, &id, obj),
                (Storage::Review, _) => self_subject_access_review(shared, &id, obj),
                (Storage::Stored, _) => create(shared, def, rp.resource, &ns, obj, &id),
            }
        }
        "update" | "patch" => {
            let headers = req.headers().clone();
            let body = read_body(req.into_body()).await?;
            let patch_kind = if verb == "patch" {
                let ct = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let kind = PatchKind::from_content_type(ct)?;
                if kind == PatchKind::Strategic && !def.builtin {
                    return Err(ApiError::unsupported_media_type(
                        "strategic merge patch is not supported for custom resources; use a merge or JSON patch",
                    ));
                }
                Some(kind)
            } else {
                None
            };
            let new_body = if patch_kind.is_none() {
                Some(decode_body(&headers, &body)?)
            } else {
                None
            };
            update(shared, def, &rp, &id, patch_kind, new_body, &body)
        }
        "delete" => {
            let body = read_body(req.into_body()).await?;
            let options = if body.iter().all(u8::is_ascii_whitespace) {
                json!({})
            } else {
                parse_json(&body)?
            };
            let written = shared.store.write(rp.resource, &ns, &name, |cur| {
                let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
                prepare_delete(def, &name, old, &options)
            })?;
            Ok(json_response(StatusCode::OK, &written.object))
        }
        "deletecollection" => delete_collection(shared, def, &rp, &query),
        _ => Err(ApiError::method_not_allowed(method.as_str(), &path)),
    }
}

/// Whether an object a token is bound to is still stored with the UID it had.
fn bound_object_exists(store: &Store, bound: &BoundObject) -> bool {
    store
        .get(bound.resource, &bound.namespace, &bound.name)
        .is_some_and(|o| o.pointer("/metadata/uid").and_then(Value::as_str) == Some(&bound.uid))
}

/// `POST .../serviceaccounts/<name>/token`: mints a token and registers it.
fn token_request(shared: &Shared, ns: &str, name: &str, body: Value) -> Result<Response, ApiError> {
    let now = shared.clock.now();
    let issued = serviceaccount::token_request(&shared.store, now, ns, name, body)?;
    // Expired tokens never authenticate again: dropping them here keeps a
    // long-running lab whose kubelets refresh tokens from growing the table.
    shared.tokens.forget_expired(now);
    if let Some(credential) = issued.credential {
        shared.tokens.insert_credential(&issued.token, credential);
    }
    Ok(json_response(StatusCode::CREATED, &issued.response))
}

/// The header prefix of impersonated `extra` values.
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

/// Applies the `Impersonate-*` headers: the request then runs as the named
/// user, if the caller may `impersonate` each part (user or ServiceAccount,
/// each group, the UID, each extra value), as kube-apiserver's
/// impersonation filter checks.
fn impersonate(shared: &Shared, id: Identity, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let user = values("impersonate-user").into_iter().next();
    let groups = values("impersonate-group");
    let uid = values("impersonate-uid").into_iter().next();
    let mut extra = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(IMPERSONATE_EXTRA)
            && let Ok(v) = value.to_str()
        {
            let key = crate::routes::percent_decode(key);
            extra.entry(key).or_default().push(v.to_string());
        }
    }
    let Some(user) = user else {
        if groups.is_empty() && uid.is_none() && extra.is_empty() {
            return Ok(id);
        }
        return Err(ApiError::bad_request(
            "requested impersonation of groups, a UID or extra values without impersonating a user: add an Impersonate-User header",
        ));
    };
    let mut checks = Vec::new();
    let sa = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    checks.push(match sa {
        Some((ns, name)) => Attributes {
            verb: "impersonate".into(),
            resource: "serviceaccounts".into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        },
        None => Attributes {
            verb: "impersonate".into(),
            resource: "users".into(),
            name: user.clone(),
            ..Default::default()
        },
    });
    for g in &groups {
        checks.push(Attributes {
            verb: "impersonate".into(),
            resource: "groups".into(),
            name: g.clone(),
            ..Default::default()
        });
    }
    if let Some(uid) = &uid {
        checks.push(Attributes {
            verb: "impersonate".into(),
            group: "authentication.k8s.io".into(),
            resource: "uids".into(),
            name: uid.clone(),
            ..Default::default()
        });
    }
    for (key, vals) in &extra {
        for v in vals {
            checks.push(Attributes {
                verb: "impersonate".into(),
                group: "authentication.k8s.io".into(),
                resource: "userextras".into(),
                subresource: key.clone(),
                name: v.clone(),
                ..Default::default()
            });
        }
    }
    for attrs in &checks {
        authorize(shared, &id, attrs)?;
    }
    // A ServiceAccount impersonated without groups gets its own, as on the real server.
    let groups = match (sa, groups.is_empty()) {
        (Some((ns, name)), true) => Identity::service_account(ns, name).groups,
        _ => groups,
    };
    Ok(Identity {
        username: user,
        uid: uid.unwrap_or_default(),
        groups,
        extra,
    })
}

fn authorize(shared: &Shared, id: &Identity, attrs: &Attributes) -> Result<(), ApiError> {
    if !shared.rbac {
        return Ok(());
    }
    match rbac::authorize(&shared.store, id, attrs) {
        Decision::Allow(_) => Ok(()),
        Decision::Deny(reason) => Err(ApiError::forbidden(reason)),
    }
}

/// Whether the caller may `verb` (approve, sign) for a signer, checking the exact
/// name and the `<domain>/*` wildcard name like the real admission plugins.
fn signer_allowed(shared: &Shared, id: &Identity, verb: &str, signer: &str) -> bool {
    if !shared.rbac {
        return true;
    }
    let mut names = vec![signer.to_string()];
    if let Some((domain, _)) = signer.split_once('/') {
        names.push(format!("{domain}/*"));
    }
    names.iter().any(|n| {
        let attrs = Attributes {
            verb: verb.into(),
            group: "certificates.k8s.io".into(),
            resource: "signers".into(),
            name: n.clone(),
            ..Default::default()
        };
        rbac::authorize(&shared.store, id, &attrs).allowed()
    })
}

fn discovery_response(
    shared: &Shared,
    route: Route,
    accept: &str,
    path: &str,
) -> Result<Response, ApiError> {
    let aggregated = discovery::wants_aggregated(accept);
    let doc = match route {
        Route::Version => discovery::version(),
        Route::CoreVersions if aggregated => {
            return Ok(bytes_response(
                StatusCode::OK,
                Bytes::from(discovery::aggregated(true).to_string()),
                discovery::AGGREGATED_CONTENT_TYPE,
            ));
        }
        Route::Groups if aggregated => {
            return Ok(bytes_response(
                StatusCode::OK,
                Bytes::from(discovery::aggregated(false).to_string()),
                discovery::AGGREGATED_CONTENT_TYPE,
            ));
        }
        Route::CoreVersions => discovery::api_versions(&shared.addr.to_string()),
        Route::Groups => discovery::api_group_list(),
        Route::Group(g) => discovery::api_group(&g).ok_or_else(|| ApiError::no_route(path))?,
        Route::GroupVersion(g, v) => {
            discovery::api_resource_list(&g, &v).ok_or_else(|| ApiError::no_route(path))?
        }
        Route::OpenApiRoot => discovery::openapi_v3_root(),
        Route::OpenApi(g, v) => {
            discovery::openapi_v3_group_version(&g, &v).ok_or_else(|| ApiError::no_route(path))?
        }
        Route::Health | Route::Resource(_) => return Err(ApiError::no_route(path)),
    };
    Ok(json_response(StatusCode::OK, &doc))
}

fn selectors(
    def: &ResourceDef,
    query: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels =
        LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map(String::as_str).unwrap_or(""),
        def,
    )?;
    Ok((labels, fields))
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}")))
}

fn list(
    shared: &Shared,
    def: &ResourceDef,
    rp: &ResourcePath,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(def, query)?;
    let rv_param = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let exact = query.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
    let ns = rp.namespace.as_deref();
    let (items, rv) = match rv_param {
        "" | "0" if !exact => shared.store.list(rp.resource, ns),
        s => {
            let want = parse_rv(s)?;
            if exact {
                (shared.store.list_at(rp.resource, ns, want)?, want)
            } else {
                let (items, current) = shared.store.list(rp.resource, ns);
                if want > current {
                    return Err(ApiError::too_large_resource_version(want, current));
                }
                (items, current)
            }
        }
    };
    let mut buf = Vec::with_capacity(256 + items.len() * 512);
    let head = json!({"kind": def.list_kind(), "apiVersion": def.api_version(), "metadata": {"resourceVersion": rv.to_string()}})
        .to_string();
    // Items are appended by hand so each stored object is serialised straight from its Arc.
    buf.extend_from_slice(head.strip_suffix('}').unwrap_or(&head).as_bytes());
    buf.extend_from_slice(b",\"items\":[");
    let mut first = true;
    for obj in items
        .iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
    {
        if !first {
            buf.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut buf, &**obj).map_err(|e| ApiError::internal(e.to_string()))?;
    }
    buf.extend_from_slice(b"]}");
    Ok(bytes_response(
        StatusCode::OK,
        Bytes::from(buf),
        "application/json",
    ))
}

fn watch(
    shared: &Shared,
    def: &ResourceDef,
    rp: &ResourcePath,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(def, query)?;
    let rv_param = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or("");
    let send_initial = query.get("sendInitialEvents").map(String::as_str);
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    if send_initial == Some("true") {
        if query.get("resourceVersionMatch").map(String::as_str) != Some("NotOlderThan") {
            return Err(ApiError::invalid(
                def,
                "",
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(ApiError::invalid(
                def,
                "",
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks=true",
            ));
        }
    }
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => Duration::from_secs(1800),
    };
    let from = match (rv_param, send_initial) {
        (_, Some("true")) | ("" | "0", None) | ("", Some(_)) => None,
        ("0", Some(_)) => None,
        (s, _) => Some(parse_rv(s)?),
    };
    let spec = WatchSpec {
        resource: rp.resource,
        namespace: rp.namespace.clone(),
        labels,
        fields,
        bookmarks,
        initial_events_end: send_initial == Some("true"),
        timeout,
        bookmark_interval: shared.bookmark_interval,
    };
    // Every version a client holds came from this server, so one above the
    // newest is from before a store reset, and the events up to it would
    // never be sent: unless told to wait like kube-apiserver, a 410 makes
    // the client relist.
    let ns = rp.namespace.as_deref();
    let subscribed = match from {
        Some(rv) if shared.future_watch == FutureWatch::Expire => {
            shared.store.subscribe_issued(rp.resource, ns, rv)
        }
        _ => shared.store.subscribe(rp.resource, ns, from),
    };
    let body = match subscribed {
        Ok(mut sub) => {
            if send_initial == Some("false") {
                sub.initial.clear();
            }
            Body::from_stream(
                watch::stream(spec, shared.store.clone(), sub, shared.shutdown.clone())
                    .take_until(shared.faults.watch_dropped())
                    .map(Ok::<_, Infallible>),
            )
        }
        // Like the watch cache: 200 and an ERROR event, which makes clients relist.
        Err(err) => Body::from(watch::error_event(&err)),
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn create(
    shared: &Shared,
    def: &ResourceDef,
    resource: usize,
    ns: &str,
    body: Value,
    id: &Identity,
) -> Result<Response, ApiError> {
    let mut body = body;
    validation::decode(def, &mut body).map_err(|why| ApiError::undecodable(def, &why))?;
    let obj = prepare_create(def, ns, body, id)?;
    if def.namespaced && shared.store.get(idx::NAMESPACES, "", ns).is_none() {
        return Err(ApiError::not_found(&RESOURCES[idx::NAMESPACES], ns));
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let written = shared.store.write(resource, ns, &name, |cur| {
        if cur.is_some() {
            return Err(ApiError::already_exists(def, &name));
        }
        Ok(Write::Put(obj))
    })?;
    Ok(written_response(StatusCode::CREATED, &written))
}

fn update(
    shared: &Shared,
    def: &ResourceDef,
    rp: &ResourcePath,
    id: &Identity,
    patch_kind: Option<PatchKind>,
    new_body: Option<Value>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let ns = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let sub = rp.subresource.as_deref();
    // Admission for CSR approval and signing needs RBAC lookups, which read the
    // store: decide them before taking the store's write lock. The signer name
    // is immutable, so reading it first is safe.
    let is_csr = rp.resource == idx::CSRS;
    let signer = if is_csr && sub.is_some() {
        shared.store.get(rp.resource, &ns, &name).and_then(|o| {
            o.pointer("/spec/signerName")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
    } else {
        None
    };
    if let (Some("approval"), Some(signer)) = (sub, &signer)
        && !signer_allowed(shared, id, "approve", signer)
    {
        return Err(ApiError::forbidden(format!(
            "certificatesigningrequests.certificates.k8s.io \"{name}\" is forbidden: user not permitted to approve requests with signerName \"{signer}\""
        )));
    }
    let may_sign = match (sub, &signer) {
        (Some("status"), Some(signer)) => signer_allowed(shared, id, "sign", signer),
        _ => true,
    };
    // A body that does not decode is refused before the store is read (400);
    // a patch can only be judged once applied (422 on the field `patch`).
    let new_body = match new_body {
        Some(mut v) => {
            validation::decode(def, &mut v).map_err(|why| ApiError::undecodable(def, &why))?;
            Some(v)
        }
        None => None,
    };
    let written = shared.store.write(rp.resource, &ns, &name, |cur| {
        let old = cur.ok_or_else(|| ApiError::not_found(def, &name))?;
        let new = match (patch_kind, &new_body) {
            (Some(kind), _) => {
                let mut patched = patch::apply(kind, old, body)?;
                if let Err(why) = validation::decode(def, &mut patched) {
                    return Err(ApiError::invalid_patch(&patched, &why));
                }
                patched
            }
            (None, Some(v)) => v.clone(),
            (None, None) => return Err(ApiError::internal("update without a body")),
        };
        let decision = prepare_update(def, sub, &name, old, new)?;
        if is_csr && sub == Some("status") && !may_sign
            && let Write::Put(ref obj) = decision
                && certificate_changed(old, obj) {
                    return Err(ApiError::forbidden(format!(
                        "certificatesigningrequests.certificates.k8s.io \"{name}\" is forbidden: user not permitted to sign requests with signerName \"{}\"",
                        signer.as_deref().unwrap_or("")
                    )));
                }
        Ok(decision)
    })?;
    Ok(written_response(StatusCode::OK, &written))
}

fn delete_collection(
    shared: &Shared,
    def: &ResourceDef,
    rp: &ResourcePath,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(def, query)?;
    let (items, _) = shared.store.list(rp.resource, rp.namespace.as_deref());
    let mut deleted = Vec::new();
    for obj in items
        .iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
    {
        let (ns, name) = crate::store::key_of(obj);
        let res = shared
            .store
            .write(rp.resource, &ns, &name, |cur| match cur {
                Some(old) => prepare_delete(def, &name, old, &json!({})),
                None => Err(ApiError::not_found(def, &name)),
            });
        match res {
            Ok(w) => deleted.push((*w.object).clone()),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = shared.store.resource_version();
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": def.list_kind(), "apiVersion": def.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
    ))
}

/// `SelfSubjectReview` (`kubectl auth whoami`): who the caller is.
fn self_subject_review(
    def: &ResourceDef,
    id: &Identity,
    mut review: Value,
) -> Result<Response, ApiError> {
    objects::check_type(def, &mut review)?;
    let user = json!({
        "username": id.username, "uid": id.uid,
        "groups": id.effective_groups(), "extra": id.extra,
    });
    if let Some(m) = review.as_object_mut() {
        m.entry("metadata").or_insert_with(|| json!({}));
        m.insert("status".into(), json!({"userInfo": user}));
    }
    Ok(json_response(StatusCode::CREATED, &review))
}

fn self_subject_access_review(
    shared: &Shared,
    id: &Identity,
    mut review: Value,
) -> Result<Response, ApiError> {
    let def = &RESOURCES[crate::resources::find(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
    )
    .unwrap_or(0)];
    objects::check_type(def, &mut review)?;
    let s = |p: &str| {
        review
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let attrs = if review.pointer("/spec/resourceAttributes").is_some() {
        Attributes {
            verb: s("/spec/resourceAttributes/verb"),
            group: s("/spec/resourceAttributes/group"),
            resource: s("/spec/resourceAttributes/resource"),
            subresource: s("/spec/resourceAttributes/subresource"),
            name: s("/spec/resourceAttributes/name"),
            namespace: s("/spec/resourceAttributes/namespace"),
            path: None,
        }
    } else if review.pointer("/spec/nonResourceAttributes").is_some() {
        Attributes {
            verb: s("/spec/nonResourceAttributes/verb"),
            path: Some(s("/spec/nonResourceAttributes/path")),
            ..Default::default()
        }
    } else {
        return Err(ApiError::invalid(
            def,
            "",
            "spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    let decision = if shared.rbac {
        rbac::authorize(&shared.store, id, &attrs)
    } else {
        Decision::Allow("RBAC disabled".into())
    };
    let status = match decision {
        Decision::Allow(reason) => json!({"allowed": true, "reason": reason}),
        Decision::Deny(_) => json!({"allowed": false}),
    };
    if let Some(m) = review.as_object_mut() {
        m.insert("status".into(), status);
    }
    Ok(json_response(StatusCode::CREATED, &review))
}
