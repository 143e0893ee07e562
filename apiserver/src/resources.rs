//! The table of resources the embedded API server serves.
//!
//! Objects are stored as `serde_json::Value`: one generic store serves every
//! kind, and the table below is the only per-kind knowledge besides the few
//! semantics (CSR identity stamping, status on create) in `objects.rs`.

/// How the server keeps a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Objects live in the store (CRUD, list, watch).
    Stored,
    /// A create-only review answered on the spot (SelfSubjectAccessReview).
    Review,
}

/// One served resource.
#[derive(Debug)]
pub struct ResourceDef {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural, the path segment.
    pub plural: &'static str,
    /// Singular name for discovery.
    pub singular: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Subresources (`status`, `approval`).
    pub subresources: &'static [&'static str],
    /// Short names for kubectl.
    pub short_names: &'static [&'static str],
    /// Built into Kubernetes (strategic merge patch allowed) or a custom resource.
    pub builtin: bool,
    /// Stored or a review.
    pub storage: Storage,
}

impl ResourceDef {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, as the real server names resources in messages.
    pub fn resource_ref(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Has a `/status` subresource, so main writes keep status and status writes keep the rest.
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    /// The list kind (`PodList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

const fn core(
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
    short_names: &'static [&'static str],
) -> ResourceDef {
    ResourceDef {
        group: "",
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        subresources,
        short_names,
        builtin: true,
        storage: Storage::Stored,
    }
}

const fn grouped(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
    short_names: &'static [&'static str],
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        subresources,
        short_names,
        builtin: true,
        storage: Storage::Stored,
    }
}

/// Every served resource. The index into this table identifies a resource in the store.
pub static RESOURCES: &[ResourceDef] = &[
    core(
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["status"],
        &["ns"],
    ),
    core("Node", "nodes", "node", false, &["status"], &["no"]),
    core("Pod", "pods", "pod", true, &["status"], &["po"]),
    core("ConfigMap", "configmaps", "configmap", true, &[], &["cm"]),
    core("Secret", "secrets", "secret", true, &[], &[]),
    core(
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["token"],
        &["sa"],
    ),
    core("Event", "events", "event", true, &[], &["ev"]),
    grouped(
        "apps",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["status"],
        &["ds"],
    ),
    grouped(
        "apps",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        &[],
        &[],
    ),
    grouped(
        "certificates.k8s.io",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
        &["approval", "status"],
        &["csr"],
    ),
    grouped(
        "coordination.k8s.io",
        "Lease",
        "leases",
        "lease",
        true,
        &[],
        &[],
    ),
    grouped(
        "rbac.authorization.k8s.io",
        "Role",
        "roles",
        "role",
        true,
        &[],
        &[],
    ),
    grouped(
        "rbac.authorization.k8s.io",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        &[],
        &[],
    ),
    grouped(
        "rbac.authorization.k8s.io",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        &[],
        &[],
    ),
    grouped(
        "rbac.authorization.k8s.io",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        &[],
        &[],
    ),
    ResourceDef {
        builtin: false,
        ..grouped(
            "cert-manager.io",
            "ClusterIssuer",
            "clusterissuers",
            "clusterissuer",
            false,
            &["status"],
            &["ciss"],
        )
    },
    ResourceDef {
        builtin: false,
        ..grouped(
            "cert-manager.io",
            "CertificateRequest",
            "certificaterequests",
            "certificaterequest",
            true,
            &["status"],
            &["cr", "crs"],
        )
    },
    ResourceDef {
        storage: Storage::Review,
        ..grouped(
            "authorization.k8s.io",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            false,
            &[],
            &[],
        )
    },
    ResourceDef {
        storage: Storage::Review,
        ..grouped(
            "authentication.k8s.io",
            "SelfSubjectReview",
            "selfsubjectreviews",
            "selfsubjectreview",
            false,
            &[],
            &[],
        )
    },
];

/// Indices of resources used by the server's own logic.
pub mod idx {
    /// Namespace.
    pub const NAMESPACES: usize = 0;
    /// Node.
    pub const NODES: usize = 1;
    /// Pod.
    pub const PODS: usize = 2;
    /// Secret.
    pub const SECRETS: usize = 4;
    /// ServiceAccount.
    pub const SERVICE_ACCOUNTS: usize = 5;
    /// CertificateSigningRequest.
    pub const CSRS: usize = 9;
    /// Role.
    pub const ROLES: usize = 11;
    /// ClusterRole.
    pub const CLUSTER_ROLES: usize = 12;
    /// RoleBinding.
    pub const ROLE_BINDINGS: usize = 13;
    /// ClusterRoleBinding.
    pub const CLUSTER_ROLE_BINDINGS: usize = 14;
}

/// What a subresource of `def` answers with and which verbs it takes, for
/// discovery: `serviceaccounts/token` is a create-only TokenRequest; every
/// other subresource (`status`, `approval`) is read and written as its parent kind.
pub fn subresource_kind(
    def: &ResourceDef,
    sub: &str,
) -> (&'static str, &'static str, &'static [&'static str]) {
    match (def.kind, sub) {
        ("ServiceAccount", "token") => ("authentication.k8s.io", "TokenRequest", &["create"]),
        _ => (def.group, def.kind, &["get", "patch", "update"]),
    }
}

/// Finds a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|d| d.group == group && d.version == version && d.plural == plural)
}

/// The API groups served, in discovery order (core group excluded).
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for d in RESOURCES {
        if !d.group.is_empty() && !out.contains(&d.group) {
            out.push(d.group);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_match_table() {
        assert_eq!(RESOURCES[idx::NAMESPACES].kind, "Namespace");
        assert_eq!(RESOURCES[idx::PODS].kind, "Pod");
        assert_eq!(RESOURCES[idx::NODES].kind, "Node");
        assert_eq!(RESOURCES[idx::CSRS].kind, "CertificateSigningRequest");
        assert_eq!(RESOURCES[idx::SECRETS].kind, "Secret");
        assert_eq!(RESOURCES[idx::SERVICE_ACCOUNTS].kind, "ServiceAccount");
        assert_eq!(RESOURCES[idx::ROLES].kind, "Role");
        assert_eq!(RESOURCES[idx::CLUSTER_ROLES].kind, "ClusterRole");
        assert_eq!(RESOURCES[idx::ROLE_BINDINGS].kind, "RoleBinding");
        assert_eq!(
            RESOURCES[idx::CLUSTER_ROLE_BINDINGS].kind,
            "ClusterRoleBinding"
        );
    }

    #[test]
    fn lookup() {
        assert_eq!(
            find("apps", "v1", "daemonsets").map(|i| RESOURCES[i].kind),
            Some("DaemonSet")
        );
        assert_eq!(find("", "v1", "daemonsets"), None);
        assert_eq!(RESOURCES[idx::CSRS].api_version(), "certificates.k8s.io/v1");
        assert!(groups().contains(&"cert-manager.io"));
    }
}
