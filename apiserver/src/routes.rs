//! The Kubernetes path grammar, pure: what a request path names
//! (`/api/v1/namespaces/<ns>/<plural>/<name>/<sub>`, `/apis/<group>/<version>/...`,
//! discovery and OpenAPI documents) and the query string's parameters.
//!
//! The grammar has more shapes than axum's route patterns express well, and
//! every miss must still be a `Status`, so the one fallback handler
//! (`handlers`) calls [`parse_route`] itself.

use std::collections::HashMap;

use crate::error::ApiError;
use crate::resources::{RESOURCES, find};

/// A parsed resource path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResourcePath {
    pub(crate) resource: usize,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

/// What a path names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Route {
    Health,
    Version,
    CoreVersions,
    Groups,
    Group(String),
    GroupVersion(String, String),
    OpenApiRoot,
    OpenApi(String, String),
    Resource(ResourcePath),
}

fn parse_resource_path(
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Route, ApiError> {
    let not_found = || ApiError::no_route(path);
    if rest.is_empty() {
        return Ok(Route::GroupVersion(group.into(), version.into()));
    }
    if rest.iter().any(|s| s.is_empty()) {
        return Err(not_found());
    }
    let namespaced_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && find(group, version, rest[2]).is_some_and(|i| RESOURCES[i].namespaced);
    let (namespace, tail) = if namespaced_path {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    if tail.len() > 3 {
        return Err(not_found());
    }
    let resource = find(group, version, tail[0]).ok_or_else(not_found)?;
    let def = &RESOURCES[resource];
    let name = tail.get(1).map(|s| s.to_string());
    let subresource = tail.get(2).map(|s| s.to_string());
    if let Some(sub) = &subresource
        && !def.subresources.contains(&sub.as_str())
    {
        return Err(not_found());
    }
    // A namespaced object is only addressed through its namespace.
    if def.namespaced && namespace.is_none() && name.is_some() {
        return Err(not_found());
    }
    Ok(Route::Resource(ResourcePath {
        resource,
        namespace,
        name,
        subresource,
    }))
}

pub(crate) fn parse_route(path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segs.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => Ok(Route::Health),
        ["version"] => Ok(Route::Version),
        ["api"] => Ok(Route::CoreVersions),
        ["api", "v1", rest @ ..] => parse_resource_path("", "v1", rest, path),
        ["apis"] => Ok(Route::Groups),
        ["apis", group] => Ok(Route::Group(group.to_string())),
        ["apis", group, version, rest @ ..] => parse_resource_path(group, version, rest, path),
        ["openapi", "v3"] => Ok(Route::OpenApiRoot),
        ["openapi", "v3", "api", version] => Ok(Route::OpenApi(String::new(), version.to_string())),
        ["openapi", "v3", "apis", group, version] => {
            Ok(Route::OpenApi(group.to_string(), version.to_string()))
        }
        _ => Err(ApiError::no_route(path)),
    }
}

pub(crate) fn query_map(query: Option<&str>) -> HashMap<String, String> {
    query
        .map(|q| {
            q.split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `%XX` and `+` decoding of a query component or header-borne key.
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let pods = find("", "v1", "pods").unwrap();
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/pods/p/status").unwrap(),
            Route::Resource(ResourcePath {
                resource: pods,
                namespace: Some("ns".into()),
                name: Some("p".into()),
                subresource: Some("status".into())
            })
        );
        assert_eq!(
            parse_route("/api/v1/pods").unwrap(),
            Route::Resource(ResourcePath {
                resource: pods,
                namespace: None,
                name: None,
                subresource: None
            })
        );
        let ns = find("", "v1", "namespaces").unwrap();
        assert_eq!(
            parse_route("/api/v1/namespaces/kube-system").unwrap(),
            Route::Resource(ResourcePath {
                resource: ns,
                namespace: None,
                name: Some("kube-system".into()),
                subresource: None
            })
        );
        assert_eq!(
            parse_route("/apis/apps/v1").unwrap(),
            Route::GroupVersion("apps".into(), "v1".into())
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/widgets")
                .unwrap_err()
                .code,
            404
        );
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/pods/p/exec")
                .unwrap_err()
                .code,
            404
        );
        assert_eq!(parse_route("/api/v1/pods/p").unwrap_err().code, 404);
        assert_eq!(parse_route("/nope").unwrap_err().code, 404);
    }

    #[test]
    fn query_decoding() {
        let q = query_map(Some("labelSelector=app%3Dx%2Cb%20in%20(c)&watch=1&x"));
        assert_eq!(q["labelSelector"], "app=x,b in (c)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
