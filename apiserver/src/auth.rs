//! Authentication: bearer tokens mapped to identities, as the real server's
//! token authenticators (static tokens, bound ServiceAccount tokens) produce them.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::SystemTime;

/// `extra` key the real server sets for a token bound to a Pod: the Pod's name.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `extra` key: the Pod's UID.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// `extra` key: the name of the Node the Pod runs on.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// `extra` key: the UID of the Node the Pod runs on.
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
/// `extra` key: the token's credential id.
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Who a request comes from (the real server's `user.Info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// User name (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub username: String,
    /// User UID.
    pub uid: String,
    /// Groups; `system:authenticated` is added by the server.
    pub groups: Vec<String>,
    /// Extra attributes (pod and node binding of ServiceAccount tokens).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The cluster administrator: group `system:masters`, which bypasses RBAC.
    pub fn admin() -> Self {
        Identity {
            username: "kubernetes-admin".into(),
            uid: "admin".into(),
            groups: vec!["system:masters".into()],
            extra: BTreeMap::new(),
        }
    }

    /// A plain user with no group.
    pub fn user(name: &str) -> Self {
        Identity {
            username: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        }
    }

    /// A ServiceAccount identity (not bound to a Pod).
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Identity {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: format!("sa-uid-{namespace}-{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
            ],
            extra: BTreeMap::new(),
        }
    }

    /// Binds a ServiceAccount token to a Pod on a Node, as a projected token does:
    /// sets the `authentication.kubernetes.io/{pod-name,pod-uid,node-name,node-uid}` extras.
    pub fn bound_to_pod(
        mut self,
        pod_name: &str,
        pod_uid: &str,
        node_name: &str,
        node_uid: &str,
    ) -> Self {
        for (k, v) in [
            (EXTRA_POD_NAME, pod_name),
            (EXTRA_POD_UID, pod_uid),
            (EXTRA_NODE_NAME, node_name),
            (EXTRA_NODE_UID, node_uid),
        ] {
            if !v.is_empty() {
                self.extra.insert(k.into(), vec![v.into()]);
            }
        }
        self.extra.insert(
            EXTRA_CREDENTIAL_ID.into(),
            vec![format!("JTI={}", uuid::Uuid::new_v4())],
        );
        self
    }

    /// Adds a group.
    pub fn with_group(mut self, group: &str) -> Self {
        self.groups.push(group.into());
        self
    }

    /// Sets the UID.
    pub fn with_uid(mut self, uid: &str) -> Self {
        self.uid = uid.into();
        self
    }

    /// Groups as the server sees them: the configured ones plus `system:authenticated`.
    pub fn effective_groups(&self) -> Vec<String> {
        let mut g = self.groups.clone();
        if !g.iter().any(|x| x == "system:authenticated") {
            g.push("system:authenticated".into());
        }
        g
    }

    /// Member of `system:masters`: RBAC is bypassed, as in the real server.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// An object a token is bound to: the token authenticates only while an
/// object of that name with that UID exists, as the real server's
/// ServiceAccount token validator checks on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundObject {
    /// Index into [`RESOURCES`](crate::RESOURCES).
    pub resource: usize,
    /// Namespace, `""` for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The UID the object had when the token was issued.
    pub uid: String,
}

/// What a bearer token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Who the bearer is.
    pub identity: Identity,
    /// From this instant on the token no longer authenticates (`None`: never expires).
    pub expires: Option<SystemTime>,
    /// Objects that must still exist for the token to authenticate.
    pub bound: Vec<BoundObject>,
}

impl Credential {
    /// A token valid for as long as the server runs (static tokens).
    pub fn forever(identity: Identity) -> Self {
        Credential {
            identity,
            expires: None,
            bound: Vec::new(),
        }
    }
}

/// Token → credential table; tokens can be added while the server runs (a lab
/// starting a new Pod gives it a new bound token).
#[derive(Debug, Default)]
pub struct Tokens(RwLock<HashMap<String, Credential>>);

impl Tokens {
    /// Adds or replaces a token that never expires.
    pub fn insert(&self, token: &str, identity: Identity) {
        self.insert_credential(token, Credential::forever(identity));
    }

    /// Adds or replaces a token.
    pub fn insert_credential(&self, token: &str, credential: Credential) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.insert(token.into(), credential);
    }

    /// Removes a token (later requests with it get 401).
    pub fn remove(&self, token: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }

    /// The identity of an `Authorization` header value at `now`: `None` for
    /// an unknown or expired token, or one whose bound objects are gone
    /// (`exists` answers whether a bound object is still there with its UID).
    pub fn authenticate(
        &self,
        header: Option<&str>,
        now: SystemTime,
        exists: impl Fn(&BoundObject) -> bool,
    ) -> Option<Identity> {
        let token = header?.strip_prefix("Bearer ")?.trim();
        let credential = self
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()?;
        if credential.expires.is_some_and(|at| now >= at) {
            return None;
        }
        credential
            .bound
            .iter()
            .all(exists)
            .then_some(credential.identity)
    }

    /// Drops the tokens that expired by `now`.
    pub fn forget_expired(&self, now: SystemTime) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, c| c.expires.is_none_or(|at| now < at));
    }

    /// Whether a token is known.
    pub fn contains(&self, token: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bearer_tokens() {
        let t = Tokens::default();
        t.insert(
            "tok",
            Identity::service_account("kube-system", "kube-ovn-cni")
                .bound_to_pod("p", "u", "n", ""),
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let auth = |h| t.authenticate(h, now, |_| true);
        let id = auth(Some("Bearer tok")).unwrap();
        assert_eq!(
            id.username,
            "system:serviceaccount:kube-system:kube-ovn-cni"
        );
        assert_eq!(id.extra[EXTRA_POD_UID], vec!["u".to_string()]);
        assert!(!id.extra.contains_key(EXTRA_NODE_UID));
        assert!(
            id.effective_groups()
                .contains(&"system:authenticated".to_string())
        );
        assert!(auth(Some("Bearer nope")).is_none());
        assert!(auth(Some("Basic tok")).is_none());
        assert!(auth(None).is_none());
        assert!(Identity::admin().is_master());
    }

    #[test]
    fn expired_or_unbound_tokens_stop_authenticating() {
        let t = Tokens::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pod = BoundObject {
            resource: 2,
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u1".into(),
        };
        t.insert_credential(
            "tok",
            Credential {
                identity: Identity::service_account("ns", "sa"),
                expires: Some(now + Duration::from_secs(600)),
                bound: vec![pod.clone()],
            },
        );
        let h = Some("Bearer tok");
        assert!(t.authenticate(h, now, |_| true).is_some());
        assert!(
            t.authenticate(h, now + Duration::from_secs(599), |_| true)
                .is_some()
        );
        assert!(
            t.authenticate(h, now + Duration::from_secs(600), |_| true)
                .is_none()
        );
        assert!(t.authenticate(h, now, |b| *b != pod).is_none());
        t.insert("static", Identity::user("u"));
        t.forget_expired(now + Duration::from_secs(600));
        assert!(!t.contains("tok") && t.contains("static"));
    }
}
