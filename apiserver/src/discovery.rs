//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/<group>`,
//! `/api/v1`, `/apis/<group>/<version>`, and the aggregated discovery
//! (`apidiscovery.k8s.io/v2`) form of `/api` and `/apis` that kubectl prefers.

use serde_json::{Value, json};

use crate::resources::{RESOURCES, ResourceDef, Storage, groups, subresource_kind};

/// The Kubernetes version the server claims (matches k8s-openapi's `v1_33`).
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-kube-ovn-ipsec-lab",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group_doc(group: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `/apis`.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|g| {
            let mut d = group_doc(g);
            if let Some(m) = d.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            d
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, if served.
pub fn api_group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| group_doc(group))
}

fn verbs(def: &ResourceDef) -> Vec<&'static str> {
    match def.storage {
        Storage::Review => vec!["create"],
        Storage::Stored => vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ],
    }
}

fn in_group<'a>(
    group: &'a str,
    version: &'a str,
) -> impl Iterator<Item = &'static ResourceDef> + 'a {
    RESOURCES
        .iter()
        .filter(move |d| d.group == group && d.version == version)
}

/// `/api/v1` or `/apis/<group>/<version>`, if served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for d in in_group(group, version) {
        resources.push(json!({
            "name": d.plural, "singularName": d.singular, "namespaced": d.namespaced,
            "kind": d.kind, "verbs": verbs(d), "shortNames": d.short_names,
        }));
        for sub in d.subresources {
            let (group, kind, verbs) = subresource_kind(d, sub);
            let mut doc = json!({
                "name": format!("{}/{sub}", d.plural), "singularName": "", "namespaced": d.namespaced,
                "kind": kind, "verbs": verbs,
            });
            // A subresource of another kind names its group and version, as kube-apiserver's does.
            if group != d.group
                && let Some(m) = doc.as_object_mut()
            {
                m.insert("group".into(), json!(group));
                m.insert("version".into(), json!("v1"));
            }
            resources.push(doc);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Content type of an aggregated discovery answer.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an `Accept` header asks for aggregated discovery v2.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|a| {
        a.contains("g=apidiscovery.k8s.io") && a.contains("v=v2") && !a.contains("v=v2beta1")
    })
}

fn discovery_version(group: &str, version: &str) -> Value {
    let resources: Vec<Value> = in_group(group, version)
        .map(|d| {
            let subs: Vec<Value> = d.subresources.iter().map(|s| {
                let (group, kind, verbs) = subresource_kind(d, s);
                json!({"subresource": s, "responseKind": {"group": group, "version": "v1", "kind": kind},
                       "verbs": verbs})
            }).collect();
            json!({
                "resource": d.plural, "responseKind": {"group": d.group, "version": d.version, "kind": d.kind},
                "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": d.singular, "verbs": verbs(d), "shortNames": d.short_names,
                "subresources": subs,
            })
        })
        .collect();
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// Aggregated discovery for `/api` (core group) or `/apis` (named groups).
pub fn aggregated(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![
            json!({"metadata": {"creationTimestamp": null}, "versions": [discovery_version("", "v1")]}),
        ]
    } else {
        groups()
            .into_iter()
            .map(|g| json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": [discovery_version(g, "v1")]}))
            .collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// `/openapi/v3`: the index of per-group-version documents.
///
/// There are no schemas here. The documents exist so that kubectl learns that
/// PATCH accepts `fieldValidation` for every served kind, which makes it leave
/// validation to the server instead of downloading schemas to validate
/// client-side (which it cannot do here). See `docs/embedded-apiserver.md`.
pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs = vec![("".to_string(), "v1".to_string())];
    gvs.extend(
        groups()
            .into_iter()
            .map(|g| (g.to_string(), "v1".to_string())),
    );
    for (g, v) in gvs {
        let key = if g.is_empty() {
            format!("api/{v}")
        } else {
            format!("apis/{g}/{v}")
        };
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=lab")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`, if served.
pub fn openapi_v3_group_version(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for d in in_group(group, version).filter(|d| d.storage == Storage::Stored) {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if d.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{prefix}/{}/{{name}}", d.plural)
        };
        let op = json!({
            "operationId": format!("patch{}", d.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind},
            "parameters": [
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(path, json!({"patch": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-kube-ovn-ipsec-lab"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let core = api_resource_list("", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(
            names.contains(&"pods")
                && names.contains(&"pods/status")
                && names.contains(&"configmaps")
        );
        let csr = api_resource_list("certificates.k8s.io", "v1").unwrap();
        assert!(
            csr.to_string()
                .contains("certificatesigningrequests/approval")
        );
        let token = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "serviceaccounts/token")
            .unwrap();
        assert_eq!(token["kind"], "TokenRequest");
        assert_eq!(token["group"], "authentication.k8s.io");
        assert_eq!(token["verbs"], json!(["create"]));
        assert!(api_resource_list("nope", "v1").is_none());
        assert!(api_group("apps").is_some());
        assert!(api_group_list().to_string().contains("cert-manager.io/v1"));
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
        assert_eq!(
            aggregated(false)["items"].as_array().unwrap().len(),
            groups().len()
        );
    }
}
