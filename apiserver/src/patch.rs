//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the
//! subset of strategic merge patch that this project and `kubectl` use.
//!
//! Strategic merge patch in the real server is driven by the Go struct tags of
//! each built-in type. Without those types, maps merge recursively and lists
//! replace, except the lists named in [`list_strategy`], whose merge keys are
//! the ones the built-in types declare (containers by `name`, conditions by
//! `type`, finalizers as a set, ...). The `$patch`, `$retainKeys`,
//! `$deleteFromPrimitiveList/` and `$setElementOrder/` directives are honoured
//! (the last one only by dropping it: element order is not enforced).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Which PATCH flavour a request asked for, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

impl PatchKind {
    /// Maps a Content-Type; server-side apply and anything else are a 415.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Err(ApiError::unsupported_media_type(
                    "server-side apply is not supported by the lab API server; \
                     use client-side apply (kubectl apply --server-side=false) or a merge patch",
                ))
            }
            other => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/strategic-merge-patch+json (got {other:?})"
            ))),
        }
    }
}

/// Applies a patch body to a copy of `target`.
pub fn apply(kind: PatchKind, target: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let mut out = target.clone();
    match kind {
        PatchKind::Merge => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid merge patch: {e}")))?;
            json_patch::merge(&mut out, &patch);
        }
        PatchKind::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut out, &patch).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: format!(
                    "the server rejected our request due to an error in our request: {e}"
                ),
                details: None,
            })?;
        }
        PatchKind::Strategic => {
            let patch: Value = serde_json::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("invalid strategic merge patch: {e}"))
            })?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "strategic merge patch must be a JSON object",
                ));
            }
            strategic_merge(&mut out, &patch);
        }
    }
    Ok(out)
}

/// How a named list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch list replaces the target list.
    Replace,
    /// Elements are objects merged by this key.
    MergeKey(&'static str),
    /// A list of scalars merged as a set (finalizers).
    PrimitiveSet,
}

/// The list fields whose built-in types carry a `patchMergeKey`.
pub fn list_strategy(field: &str) -> ListStrategy {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => ListStrategy::MergeKey("name"),
        "ports" => ListStrategy::MergeKey("containerPort"),
        "volumeMounts" => ListStrategy::MergeKey("mountPath"),
        "volumeDevices" => ListStrategy::MergeKey("devicePath"),
        "conditions" | "addresses" => ListStrategy::MergeKey("type"),
        "ownerReferences" => ListStrategy::MergeKey("uid"),
        "taints" => ListStrategy::MergeKey("key"),
        "hostAliases" => ListStrategy::MergeKey("ip"),
        "topologySpreadConstraints" => ListStrategy::MergeKey("topologyKey"),
        "finalizers" => ListStrategy::PrimitiveSet,
        _ => ListStrategy::Replace,
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Merges a strategic merge patch object into `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Some(pmap) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pmap.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(tmap) = target.as_object_mut() else {
        return;
    };
    for (key, pv) in pmap {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (tmap.get_mut(field), pv.as_array()) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                tmap.remove(key);
            }
            Value::Object(inner) => {
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") {
                    tmap.remove(key);
                } else {
                    let slot = tmap.entry(key.clone()).or_insert(Value::Null);
                    strategic_merge(slot, pv);
                }
            }
            Value::Array(items) => {
                let slot = tmap.entry(key.clone()).or_insert(Value::Null);
                merge_list(slot, items, list_strategy(key));
            }
            scalar => {
                tmap.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(retain)) = pmap.get("$retainKeys") {
        tmap.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
}

fn merge_list(target: &mut Value, items: &[Value], strategy: ListStrategy) {
    let replace = items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace {
        *target = Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        );
        return;
    }
    match strategy {
        ListStrategy::Replace => {
            *target = Value::Array(items.iter().map(strip_directives).collect())
        }
        ListStrategy::PrimitiveSet => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            if let Value::Array(list) = target {
                for item in items {
                    if !list.contains(item) {
                        list.push(item.clone());
                    }
                }
            }
        }
        ListStrategy::MergeKey(mk) => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let Value::Array(list) = target else {
                return;
            };
            for item in items {
                let Some(key) = item.get(mk) else {
                    list.push(strip_directives(item));
                    continue;
                };
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    list.retain(|el| el.get(mk) != Some(key));
                    continue;
                }
                match list.iter_mut().find(|el| el.get(mk) == Some(key)) {
                    Some(el) => strategic_merge(el, item),
                    None => list.push(strip_directives(item)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(target: Value, patch: Value) -> Value {
        apply(PatchKind::Strategic, &target, patch.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = smp(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"x": "1"}}),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}, "data": {"y": "2"}}),
        );
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "data": {"x": "1", "y": "2"}})
        );
    }

    #[test]
    fn containers_merge_by_name() {
        let out = smp(
            json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
                   "args": ["x", "y"]}}),
            json!({"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "3"}],
                   "$setElementOrder/containers": [{"name": "a"}], "args": ["z"]}}),
        );
        assert_eq!(
            out,
            json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"},
                {"name": "c", "image": "3"}], "args": ["z"]}})
        );
    }

    #[test]
    fn delete_and_replace_directives() {
        let out = smp(
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "X", "$patch": "delete"}, {"type": "Ready", "status": "True"}]}}),
        );
        assert_eq!(
            out,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let out = smp(
            json!({"spec": {"template": {"a": 1, "b": 2}}}),
            json!({"spec": {"template": {"$patch": "replace", "c": 3}}}),
        );
        assert_eq!(out, json!({"spec": {"template": {"c": 3}}}));
        let out = smp(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"finalizers": ["c", "a"]}}),
        );
        assert_eq!(out, json!({"metadata": {"finalizers": ["a", "b", "c"]}}));
        let out = smp(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out, json!({"metadata": {"finalizers": ["b"]}}));
    }

    #[test]
    fn merge_and_json_patch() {
        let t = json!({"a": {"b": 1, "c": [1, 2]}});
        let out = apply(PatchKind::Merge, &t, br#"{"a": {"b": null, "c": [3]}}"#).unwrap();
        assert_eq!(out, json!({"a": {"c": [3]}}));
        let out = apply(
            PatchKind::Json,
            &t,
            br#"[{"op": "add", "path": "/a/d", "value": 4}]"#,
        )
        .unwrap();
        assert_eq!(out["a"]["d"], 4);
        let err = apply(
            PatchKind::Json,
            &t,
            br#"[{"op": "test", "path": "/a/b", "value": 9}]"#,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(apply(PatchKind::Merge, &t, b"{").unwrap_err().code, 400);
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchKind::Merge
        );
        assert_eq!(
            PatchKind::from_content_type("application/apply-patch+yaml")
                .unwrap_err()
                .code,
            415
        );
        assert_eq!(
            PatchKind::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }
}
