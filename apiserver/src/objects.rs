//! Object semantics shared by every resource: identity and metadata on create,
//! optimistic concurrency and status separation on update, finalizers on
//! delete, and the few per-kind rules (CSR and cert-manager
//! CertificateRequest identity stamping, CSR approval, status on create) the
//! project relies on. Pure functions: the handlers call
//! them inside [`Store::write`](crate::store::Store::write).

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::auth::Identity;
use crate::error::ApiError;
use crate::resources::{RESOURCES, ResourceDef, idx};
use crate::store::Write;
use crate::validation::{self, FieldError};

/// Current time as the API's RFC 3339 second-precision timestamp.
pub fn now() -> String {
    // Formatting costs more than a write's other metadata together; the text
    // changes once a second.
    thread_local! {
        static LAST: std::cell::RefCell<(i64, String)> = const { std::cell::RefCell::new((i64::MIN, String::new())) };
    }
    let t = chrono::Utc::now();
    LAST.with_borrow_mut(|(secs, text)| {
        if *secs != t.timestamp() {
            *secs = t.timestamp();
            *text = t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
        }
        text.clone()
    })
}

fn is_csr(def: &ResourceDef) -> bool {
    std::ptr::eq(def, &RESOURCES[idx::CSRS])
}

/// Whether objects of this kind carry `metadata.generation`, as on the
/// real server: the workload kinds with a spec a controller acts on (Pod
/// since 1.33, DaemonSet) and every custom resource; not ConfigMaps,
/// Secrets, Nodes, Leases, CSRs or RBAC objects. A client that reads the
/// field where the real server has none would pass here and fail there.
fn tracks_generation(def: &ResourceDef) -> bool {
    !def.builtin || matches!(def.kind, "Pod" | "DaemonSet")
}

/// Checks `apiVersion`/`kind` against the path (filling them in if absent) and
/// that the body is an object with an object `metadata`.
pub fn check_type(def: &ResourceDef, body: &mut Value) -> Result<(), ApiError> {
    let map = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let want_av = def.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), Value::String(want_av));
        }
        Some(av) if av == want_av => {}
        Some(av) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), Value::String(def.kind.into()));
        }
        Some(k) if k == def.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
    }
    match map.get("metadata") {
        None | Some(Value::Null) => {
            map.insert("metadata".into(), Value::Object(Map::new()));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
    }
    Ok(())
}

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    obj.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn random_suffix() -> String {
    // The real server's alphabet: no vowels (no words), no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::new_v4();
    id.as_bytes()
        .iter()
        .take(5)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// Builds the object to store for a create: metadata assigned by the server,
/// status reset, CSR and CertificateRequest requester stamped from the
/// caller's identity.
pub fn prepare_create(
    def: &ResourceDef,
    path_namespace: &str,
    mut body: Value,
    id: &Identity,
) -> Result<Value, ApiError> {
    check_type(def, &mut body)?;
    let meta = meta_mut(&mut body)?;
    if def.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("namespace".into(), Value::String(path_namespace.into()));
            }
            Some(ns) if ns == path_namespace => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let name = match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => {
                let n = format!("{prefix}{}", random_suffix());
                meta.insert("name".into(), Value::String(n.clone()));
                n
            }
            _ => {
                return Err(ApiError::invalid_fields(
                    def,
                    "",
                    &[FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
        },
    };
    meta.insert(
        "uid".into(),
        Value::String(uuid::Uuid::new_v4().to_string()),
    );
    meta.insert("creationTimestamp".into(), Value::String(now()));
    if tracks_generation(def) {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    for server_owned in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    ] {
        meta.remove(server_owned);
    }
    if let Some(map) = body.as_object_mut() {
        match (def.kind, def.has_status()) {
            // Node status is written by the kubelet on registration, so creates keep it.
            ("Node", _) => {}
            ("Pod", _) => {
                map.insert("status".into(), json!({"phase": "Pending"}));
            }
            ("Namespace", _) => {
                map.insert("status".into(), json!({"phase": "Active"}));
            }
            (_, true) => {
                map.remove("status");
            }
            (_, false) => {}
        }
    }
    if is_csr(def) {
        prepare_csr(&mut body, id);
    }
    if is_certificate_request(def) {
        prepare_certificate_request(def, &name, &mut body, id)?;
    }
    if def.kind == "Secret" {
        normalize_secret(&mut body);
    }
    // Validated as the real server does, after its create strategy
    // (stamping, normalising) has run.
    let errors = validation::validate(def, &body, None);
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(def, &name, &errors));
    }
    Ok(body)
}

/// What the real server does to every Secret it stores: an empty `type` is
/// `Opaque`, and `stringData` (write-only) is merged into `data` (base64),
/// overriding keys of the same name, then dropped.
fn normalize_secret(body: &mut Value) {
    let Some(map) = body.as_object_mut() else {
        return;
    };
    if map
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        map.insert("type".into(), json!("Opaque"));
    }
    if let Some(Value::Object(strings)) = map.remove("stringData") {
        let data = map.entry("data").or_insert_with(|| json!({}));
        if !data.is_object() {
            *data = json!({});
        }
        if let Value::Object(data) = data {
            for (k, v) in strings {
                let plain = v.as_str().unwrap_or_default();
                let encoded = base64::engine::general_purpose::STANDARD.encode(plain);
                data.insert(k, Value::String(encoded));
            }
        }
    }
}

/// The requester fields of a new CSR, stamped from the caller; the spec
/// itself is checked by [`validation::validate`] afterwards, so a missing
/// one becomes an empty one whose fields it reports.
fn prepare_csr(body: &mut Value, id: &Identity) {
    let Some(map) = body.as_object_mut() else {
        return;
    };
    let spec = map.entry("spec").or_insert_with(|| json!({}));
    if spec.is_null() {
        *spec = json!({});
    }
    if let Some(spec) = spec.as_object_mut() {
        stamp_requester(spec, id);
    }
}

/// The requester is who authenticated, never what the client wrote:
/// `spec.username/uid/groups/extra` from the caller's identity (an empty
/// `extra` is left out, as Go's `omitempty` does).
fn stamp_requester(spec: &mut Map<String, Value>, id: &Identity) {
    spec.insert("username".into(), Value::String(id.username.clone()));
    spec.insert("uid".into(), Value::String(id.uid.clone()));
    spec.insert("groups".into(), json!(id.effective_groups()));
    if id.extra.is_empty() {
        spec.remove("extra");
    } else {
        spec.insert("extra".into(), json!(id.extra));
    }
}

fn is_certificate_request(def: &ResourceDef) -> bool {
    def.group == "cert-manager.io" && def.kind == "CertificateRequest"
}

/// What cert-manager's webhook (its `CertificateRequestIdentity` admission
/// plugin) does to every CertificateRequest create: the requester fields
/// are overwritten with the caller's identity, so a consumer such as the
/// controller, which trusts only requests its own ServiceAccount made, can
/// rely on them. Nothing else of the webhook is emulated: a request without
/// `spec.request` or `issuerRef` is stored as written, and an update may
/// change the identity fields (cert-manager refuses that).
fn prepare_certificate_request(
    def: &ResourceDef,
    name: &str,
    body: &mut Value,
    id: &Identity,
) -> Result<(), ApiError> {
    let Some(map) = body.as_object_mut() else {
        return Ok(());
    };
    let spec = map
        .entry("spec")
        .and_modify(|s| {
            if s.is_null() {
                *s = json!({});
            }
        })
        .or_insert_with(|| json!({}));
    let spec = spec
        .as_object_mut()
        .ok_or_else(|| ApiError::invalid(def, name, "spec: Invalid value: must be an object"))?;
    stamp_requester(spec, id);
    Ok(())
}

/// Whether `a` and `b` are equal apart from the top-level `fields`
/// (compared in place: no copies of either object).
fn equal_except(a: &Value, b: &Value, fields: &[&str]) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let kept = |m: &serde_json::Map<String, Value>| {
                m.keys().filter(|k| !fields.contains(&k.as_str())).count()
            };
            kept(a) == kept(b)
                && a.iter()
                    .filter(|(k, _)| !fields.contains(&k.as_str()))
                    .all(|(k, v)| b.get(k) == Some(v))
        }
        _ => a == b,
    }
}

fn set_field(obj: &mut Value, key: &str, value: Option<&Value>) {
    if let Some(map) = obj.as_object_mut() {
        match value {
            Some(v) => {
                map.insert(key.into(), v.clone());
            }
            None => {
                map.remove(key);
            }
        }
    }
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn has_condition(conds: &[Value], t: &str) -> bool {
    conds
        .iter()
        .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
}

/// The CSR status writes that need a `sign` check, from old to new object.
pub fn certificate_changed(old: &Value, new: &Value) -> bool {
    old.pointer("/status/certificate") != new.pointer("/status/certificate")
}

/// An update (PUT, or PATCH after the patch is applied) of the main resource or a subresource.
pub fn prepare_update(
    def: &ResourceDef,
    subresource: Option<&str>,
    name: &str,
    old: &Value,
    mut new: Value,
) -> Result<Write, ApiError> {
    check_type(def, &mut new)?;
    let new_name = meta_str(&new, "name");
    if !new_name.is_empty() && new_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({new_name}) does not match the name on the URL ({name})"
        )));
    }
    if def.namespaced {
        let ns = meta_str(&new, "namespace");
        if !ns.is_empty() && ns != meta_str(old, "namespace") {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let want_rv = meta_str(&new, "resourceVersion");
    if !want_rv.is_empty() && want_rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let mut result = match subresource {
        None => {
            let mut r = new;
            if def.has_status() {
                set_field(&mut r, "status", old.get("status"));
            }
            if is_csr(def) {
                set_field(&mut r, "spec", old.get("spec"));
            }
            // Server-owned metadata is not writable through the main resource.
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let meta = meta_mut(&mut r)?;
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match old_meta.get(k) {
                    Some(v) => meta.insert(k.into(), v.clone()),
                    None => meta.remove(k),
                };
            }
            if tracks_generation(def) && !equal_except(&r, old, &["metadata", "status"]) {
                let g = old_meta
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
                    + 1;
                meta_mut(&mut r)?.insert("generation".into(), json!(g));
            }
            r
        }
        Some("status") => {
            let mut r = old.clone();
            let mut status = new.get("status").cloned();
            if is_csr(def) {
                status = Some(csr_status_update(
                    def,
                    name,
                    old,
                    status.unwrap_or_else(|| json!({})),
                )?);
            }
            set_field(&mut r, "status", status.as_ref());
            r
        }
        Some("approval") if is_csr(def) => {
            let mut r = old.clone();
            let conds = csr_approval_update(def, name, old, &new)?;
            if !r.get("status").is_some_and(Value::is_object) {
                set_field(&mut r, "status", Some(&json!({})));
            }
            if let Some(status) = r.get_mut("status").and_then(Value::as_object_mut) {
                status.insert("conditions".into(), Value::Array(conds));
            }
            r
        }
        Some(other) => {
            return Err(ApiError::no_route(&format!("{}/{other}", def.plural)));
        }
    };
    if let Some(meta) = result.get_mut("metadata").and_then(Value::as_object_mut)
        && let Some(rv) = old.pointer("/metadata/resourceVersion")
    {
        meta.insert("resourceVersion".into(), rv.clone());
    }
    if def.kind == "Secret" {
        normalize_secret(&mut result);
    }
    let errors = validation::validate(def, &result, Some(old));
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(def, name, &errors));
    }
    let finalizers_empty = result
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if result.pointer("/metadata/deletionTimestamp").is_some() && finalizers_empty {
        return Ok(Write::Delete);
    }
    if result == *old {
        return Ok(Write::Unchanged);
    }
    Ok(Write::Put(result))
}

fn csr_approval_update(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<Vec<Value>, ApiError> {
    let old_conds = conditions(old);
    let mut conds = conditions(new);
    let now = now();
    for c in &mut conds {
        let t = c.get("type").and_then(Value::as_str).unwrap_or("");
        if t.is_empty() {
            return Err(ApiError::invalid(
                def,
                name,
                "status.conditions[].type: Required value",
            ));
        }
        let status = c.get("status").and_then(Value::as_str).unwrap_or("");
        if (t == "Approved" || t == "Denied") && status != "True" {
            return Err(ApiError::invalid(
                def,
                name,
                format!(
                    "status.conditions[{t}].status: Unsupported value: {status:?}: supported values: \"True\""
                ),
            ));
        }
        if let Some(m) = c.as_object_mut() {
            m.entry("lastUpdateTime")
                .or_insert_with(|| Value::String(now.clone()));
            m.entry("lastTransitionTime")
                .or_insert_with(|| Value::String(now.clone()));
        }
    }
    if has_condition(&conds, "Approved") && has_condition(&conds, "Denied") {
        return Err(ApiError::invalid(
            def,
            name,
            "status.conditions: Invalid value: Approved and Denied conditions are mutually exclusive",
        ));
    }
    for t in ["Approved", "Denied", "Failed"] {
        if has_condition(&old_conds, t) && !has_condition(&conds, t) {
            return Err(ApiError::invalid(
                def,
                name,
                format!(
                    "status.conditions: Forbidden: updates may not remove a condition of type {t:?}"
                ),
            ));
        }
    }
    Ok(conds)
}

fn csr_status_update(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    mut status: Value,
) -> Result<Value, ApiError> {
    // Approval only goes through /approval: /status keeps the old Approved/Denied.
    let old_conds = conditions(old);
    let mut conds: Vec<Value> = status
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            !matches!(
                c.get("type").and_then(Value::as_str),
                Some("Approved" | "Denied")
            )
        })
        .collect();
    for c in old_conds.iter().filter(|c| {
        matches!(
            c.get("type").and_then(Value::as_str),
            Some("Approved" | "Denied")
        )
    }) {
        conds.insert(0, c.clone());
    }
    if let Some(m) = status.as_object_mut() {
        if conds.is_empty() {
            m.remove("conditions");
        } else {
            m.insert("conditions".into(), Value::Array(conds.clone()));
        }
    }
    let old_cert = old
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .unwrap_or("");
    let cert = status
        .get("certificate")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !old_cert.is_empty() && cert != old_cert {
        return Err(ApiError::invalid(
            def,
            name,
            "status.certificate: Forbidden: updates may not modify existing certificate content",
        ));
    }
    if !cert.is_empty() && cert != old_cert {
        if !has_condition(&conds, "Approved")
            || has_condition(&conds, "Denied")
            || has_condition(&conds, "Failed")
        {
            return Err(ApiError::invalid(
                def,
                name,
                "status.certificate: Forbidden: certificate issuance not allowed unless the request is approved",
            ));
        }
        let pem = base64::engine::general_purpose::STANDARD
            .decode(cert)
            .unwrap_or_default();
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ApiError::invalid(
                def,
                name,
                "status.certificate: Invalid value: \"<certificate data>\": must contain at least one CERTIFICATE PEM block",
            ));
        }
    }
    Ok(status)
}

/// `DeleteOptions` preconditions and the delete decision (finalizers defer it).
pub fn prepare_delete(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    options: &Value,
) -> Result<Write, ApiError> {
    if let Some(uid) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
        && uid != meta_str(old, "uid")
    {
        return Err(ApiError::conflict(
            def,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(old, "uid")
            ),
        ));
    }
    if let Some(rv) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && rv != meta_str(old, "resourceVersion")
    {
        return Err(ApiError::conflict(
            def,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta_str(old, "resourceVersion")
            ),
        ));
    }
    let has_finalizers = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if !has_finalizers {
        return Ok(Write::Delete);
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(Write::Unchanged);
    }
    let mut r = old.clone();
    let meta = meta_mut(&mut r)?;
    meta.insert("deletionTimestamp".into(), Value::String(now()));
    meta.insert("deletionGracePeriodSeconds".into(), json!(0));
    Ok(Write::Put(r))
}

#[cfg(test)]
mod tests;
