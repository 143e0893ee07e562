//! RBAC authorization from the Role/ClusterRole/(Cluster)RoleBinding objects in
//! the store, evaluated on every request like the real RBAC authorizer.

use serde_json::Value;

use crate::auth::Identity;
use crate::resources::idx;
use crate::store::Store;

/// What a request wants to do (the real server's authorizer attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Verb: get, list, watch, create, update, patch, delete, deletecollection, approve, sign, ...
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource, `""` if none.
    pub subresource: String,
    /// Object name, `""` for lists and creates.
    pub name: String,
    /// Namespace, `""` for cluster-scoped requests.
    pub namespace: String,
    /// Non-resource URL path (`/version`), when this is not a resource request.
    pub path: Option<String>,
}

/// An authorization decision with the reason the real server would give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed, by this binding.
    Allow(String),
    /// Denied.
    Deny(String),
}

impl Decision {
    /// Allowed?
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn has(list: &[&str], want: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == want)
}

/// Whether one PolicyRule allows the attributes.
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let verbs = strings(rule.get("verbs"));
    if !has(&verbs, &a.verb) {
        return false;
    }
    if let Some(path) = &a.path {
        return strings(rule.get("nonResourceURLs")).iter().any(|u| {
            *u == "*" || *u == path || u.strip_suffix('*').is_some_and(|pre| path.starts_with(pre))
        });
    }
    if !has(&strings(rule.get("apiGroups")), &a.group) {
        return false;
    }
    let resources = strings(rule.get("resources"));
    let res_ok = if a.subresource.is_empty() {
        has(&resources, &a.resource)
    } else {
        let combined = format!("{}/{}", a.resource, a.subresource);
        let star_sub = format!("*/{}", a.subresource);
        resources
            .iter()
            .any(|r| *r == "*" || *r == combined || *r == star_sub)
    };
    if !res_ok {
        return false;
    }
    let names = strings(rule.get("resourceNames"));
    names.is_empty() || (!a.name.is_empty() && names.contains(&a.name.as_str()))
}

fn subject_matches(subject: &Value, id: &Identity, groups: &[String]) -> bool {
    let kind = subject.get("kind").and_then(Value::as_str).unwrap_or("");
    let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
    match kind {
        "User" => id.username == name,
        "Group" => groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or("");
            id.username == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Decides a request from the RBAC objects in the store. `system:masters` bypasses.
pub fn authorize(store: &Store, id: &Identity, a: &Attributes) -> Decision {
    if id.is_master() {
        return Decision::Allow("system:masters".into());
    }
    // Discovery, version and health are open to every authenticated user, as the
    // real server's default system:discovery and system:public-info-viewer bindings do.
    if let Some(path) = &a.path {
        let open = [
            "/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi",
        ];
        if a.verb == "get"
            && open
                .iter()
                .any(|p| path == p || path.starts_with(&format!("{p}/")))
        {
            return Decision::Allow("system:discovery".into());
        }
    }
    // Everyone may ask what they themselves may do and who they are (system:basic-user).
    let self_review = matches!(
        (a.group.as_str(), a.resource.as_str()),
        ("authorization.k8s.io", "selfsubjectaccessreviews")
            | ("authentication.k8s.io", "selfsubjectreviews")
    );
    if self_review && a.verb == "create" {
        return Decision::Allow("system:basic-user".into());
    }
    let groups = id.effective_groups();
    let cluster_roles = store.snapshot(idx::CLUSTER_ROLES);
    let find_cluster_role = |name: &str| {
        cluster_roles
            .iter()
            .find(|r| meta(r, "name") == name)
            .cloned()
    };
    let allows = |role: &Value| array(role, "rules").iter().any(|r| rule_allows(r, a));
    for crb in store.snapshot(idx::CLUSTER_ROLE_BINDINGS) {
        let Some(("ClusterRole", role_name)) = granted(&crb, id, &groups) else {
            continue;
        };
        if find_cluster_role(role_name).is_some_and(|r| allows(&r)) {
            return Decision::Allow(format!(
                "RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{role_name}\"",
                meta(&crb, "name")
            ));
        }
    }
    if !a.namespace.is_empty() && a.path.is_none() {
        let roles = store.list(idx::ROLES, Some(&a.namespace)).0;
        for rb in store.list(idx::ROLE_BINDINGS, Some(&a.namespace)).0 {
            let role = match granted(&rb, id, &groups) {
                Some(("Role", name)) => roles.iter().find(|r| meta(r, "name") == name).cloned(),
                Some(("ClusterRole", name)) => find_cluster_role(name),
                _ => None,
            };
            if role.is_some_and(|r| allows(&r)) {
                return Decision::Allow(format!(
                    "RBAC: allowed by RoleBinding \"{}/{}\"",
                    a.namespace,
                    meta(&rb, "name")
                ));
            }
        }
    }
    Decision::Deny(forbidden_message(id, a))
}

/// The role `(kind, name)` a binding grants `id`, if its subjects name `id`.
fn granted<'b>(binding: &'b Value, id: &Identity, groups: &[String]) -> Option<(&'b str, &'b str)> {
    if !array(binding, "subjects")
        .iter()
        .any(|s| subject_matches(s, id, groups))
    {
        return None;
    }
    let kind = binding.pointer("/roleRef/kind").and_then(Value::as_str)?;
    let name = binding.pointer("/roleRef/name").and_then(Value::as_str);
    Some((kind, name.unwrap_or("")))
}

/// The array at `key` of an object (empty if absent), borrowed: this runs
/// for every binding and role on every authorised request.
fn array<'a>(obj: &'a Value, key: &str) -> &'a [Value] {
    obj.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The real server's 403 message.
pub fn forbidden_message(id: &Identity, a: &Attributes) -> String {
    if let Some(path) = &a.path {
        return format!(
            "forbidden: User \"{}\" cannot {} path \"{path}\"",
            id.username, a.verb
        );
    }
    let mut what = a.resource.clone();
    if !a.subresource.is_empty() {
        what = format!("{what}/{}", a.subresource);
    }
    let group = if a.group.is_empty() {
        String::new()
    } else {
        format!(" in API group \"{}\"", a.group)
    };
    let target = if a.name.is_empty() {
        String::new()
    } else {
        format!("{} \"{}\" is forbidden: ", a.resource, a.name)
    };
    let scope = if a.namespace.is_empty() {
        " at the cluster scope".to_string()
    } else {
        format!(" in the namespace \"{}\"", a.namespace)
    };
    format!(
        "{target}User \"{}\" cannot {} resource \"{what}\"{group}{scope}",
        id.username, a.verb
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Write;
    use serde_json::json;

    fn attrs(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        name: &str,
        ns: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            namespace: ns.into(),
            path: None,
        }
    }

    #[test]
    fn rules() {
        let rule = json!({"apiGroups": [""], "resources": ["nodes", "pods/status"], "verbs": ["get", "patch"]});
        assert!(rule_allows(&rule, &attrs("get", "", "nodes", "", "n1", "")));
        assert!(!rule_allows(
            &rule,
            &attrs("delete", "", "nodes", "", "n1", "")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("get", "apps", "nodes", "", "n1", "")
        ));
        assert!(rule_allows(
            &rule,
            &attrs("patch", "", "pods", "status", "p", "ns")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("patch", "", "pods", "", "p", "ns")
        ));
        let named = json!({"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
                           "resourceNames": ["kubeovn.io/signer"], "verbs": ["approve"]});
        assert!(rule_allows(
            &named,
            &attrs(
                "approve",
                "certificates.k8s.io",
                "signers",
                "",
                "kubeovn.io/signer",
                ""
            )
        ));
        assert!(!rule_allows(
            &named,
            &attrs("approve", "certificates.k8s.io", "signers", "", "other", "")
        ));
        let star = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &attrs("watch", "apps", "daemonsets", "status", "", "x")
        ));
    }

    #[test]
    fn bindings() {
        let store = Store::new(10);
        let put = |res: usize, ns: &str, obj: Value| {
            let name = obj["metadata"]["name"].as_str().unwrap().to_string();
            store
                .write(res, ns, &name, |_| Ok(Write::Put(obj)))
                .unwrap();
        };
        put(
            idx::CLUSTER_ROLES,
            "",
            json!({"metadata": {"name": "node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]}),
        );
        put(
            idx::CLUSTER_ROLE_BINDINGS,
            "",
            json!({"metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "cni", "namespace": "kube-system"}]}),
        );
        put(
            idx::ROLES,
            "kube-system",
            json!({"metadata": {"name": "cm", "namespace": "kube-system"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]}),
        );
        put(
            idx::ROLE_BINDINGS,
            "kube-system",
            json!({"metadata": {"name": "cm", "namespace": "kube-system"},
            "roleRef": {"kind": "Role", "name": "cm"}, "subjects": [{"kind": "Group", "name": "ops"}]}),
        );
        let sa = Identity::service_account("kube-system", "cni");
        assert!(authorize(&store, &sa, &attrs("list", "", "nodes", "", "", "")).allowed());
        let denied = authorize(&store, &sa, &attrs("delete", "", "nodes", "", "n1", ""));
        assert_eq!(
            denied,
            Decision::Deny("nodes \"n1\" is forbidden: User \"system:serviceaccount:kube-system:cni\" cannot delete resource \"nodes\" at the cluster scope".into())
        );
        let ops = Identity::user("alice").with_group("ops");
        assert!(
            authorize(
                &store,
                &ops,
                &attrs("update", "", "configmaps", "", "x", "kube-system")
            )
            .allowed()
        );
        assert!(
            !authorize(
                &store,
                &ops,
                &attrs("update", "", "configmaps", "", "x", "default")
            )
            .allowed()
        );
        assert!(
            authorize(
                &store,
                &Identity::admin(),
                &attrs("delete", "", "nodes", "", "n1", "")
            )
            .allowed()
        );
        let version = Attributes {
            verb: "get".into(),
            path: Some("/version".into()),
            ..Default::default()
        };
        assert!(authorize(&store, &ops, &version).allowed());
    }
}
