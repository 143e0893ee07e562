//! `labelSelector` and `fieldSelector` parsing and matching.

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceDef;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses (`a in (x,y),b` has two terms).
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_set(rest: &str, term: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| ApiError::bad_request(format!("unable to parse requirement: {term:?}")))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    /// Parses the `labelSelector` query parameter syntax.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let bad = || ApiError::bad_request(format!("unable to parse requirement: {term:?}"));
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = term.split_once("==") {
                Requirement::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = term.split_once('=') {
                Requirement::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                Requirement::NotIn(k.trim().to_string(), parse_set(rest, term)?)
            } else if let Some((k, rest)) = term.split_once(" in ") {
                Requirement::In(k.trim().to_string(), parse_set(rest, term)?)
            } else {
                Requirement::Exists(term.to_string())
            };
            let key = match &req {
                Requirement::Eq(k, _)
                | Requirement::NotEq(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Selects everything (no requirements).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches(&self, obj: &Value) -> bool {
        // `get` chains, not `pointer`: this runs for every event on every watch.
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value`, ANDed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

/// The fields a resource can be selected by, like the real server's field label conversions.
fn allowed_fields(def: &ResourceDef) -> &'static [&'static str] {
    match (def.group, def.kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => &["spec.signerName"],
        ("", "Secret") => &["type"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "reason",
            "type",
        ],
        ("", "Namespace") => &["status.phase"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses a `fieldSelector` for the given resource; unsupported fields are a 400 like the real server.
    pub fn parse(s: &str, def: &ResourceDef) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, neg, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{term}'")));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !allowed_fields(def).contains(&field)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            terms.push((
                field.split('.').map(str::to_string).collect(),
                neg,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the object satisfies every term (a missing field reads as `""`).
    /// Selects everything (no terms).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, neg, want)| {
            let mut cur = Some(obj);
            for seg in path {
                cur = cur.and_then(|c| c.get(seg));
            }
            let have = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (have == *want) != *neg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, idx};
    use serde_json::json;

    fn obj() -> Value {
        json!({"metadata": {"name": "p", "namespace": "kube-system",
            "labels": {"app": "kube-ovn-cni", "tier": "node"}},
            "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj();
        for (sel, want) in [
            ("app=kube-ovn-cni", true),
            ("app==kube-ovn-cni", true),
            ("app!=kube-ovn-cni", false),
            ("app!=other", true),
            ("missing!=x", true),
            ("app in (a, kube-ovn-cni)", true),
            ("app in (a,b)", false),
            ("app notin (a,b)", true),
            ("missing notin (a)", true),
            ("app notin (kube-ovn-cni)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=kube-ovn-cni,tier in (node),!missing", true),
            ("app=kube-ovn-cni,tier=x", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn label_parse_errors() {
        assert!(LabelSelector::parse("app in a,b").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors() {
        let pods = &RESOURCES[idx::PODS];
        let o = obj();
        assert!(
            FieldSelector::parse("spec.nodeName=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName!=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.name=p,metadata.namespace==kube-system", pods)
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("spec.bogus=1", pods).unwrap_err().code,
            400
        );
        let csrs = &RESOURCES[idx::CSRS];
        let csr = json!({"spec": {"signerName": "kubeovn.io/signer"}});
        assert!(
            FieldSelector::parse("spec.signerName=kubeovn.io/signer", csrs)
                .unwrap()
                .matches(&csr)
        );
        assert!(FieldSelector::parse("spec.nodeName=x", csrs).is_err());
    }
}
