//! OVSDB values (RFC 7047 §5.1): atoms, `uuid`/`named-uuid`, `set`, `map`.
//!
//! Pure. The wire form is schema-less: a one-element set may be sent as a
//! bare atom, so readers should use the lenient accessors
//! ([`Datum::as_set`], [`Datum::as_bool`], [`Datum::as_string_map`]) rather
//! than matching on the variant.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::Error;

/// A single OVSDB value of a base type.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    /// `integer`
    Integer(i64),
    /// `real`
    Real(f64),
    /// `boolean`
    Boolean(bool),
    /// `string`
    String(String),
    /// `["uuid", "..."]`: a row reference.
    Uuid(Uuid),
    /// `["named-uuid", "name"]`: a row inserted earlier in the same
    /// transaction.
    NamedUuid(String),
}

impl Atom {
    /// Shorthand for a string atom.
    pub fn string(s: impl Into<String>) -> Self {
        Atom::String(s.into())
    }

    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Atom::Integer(i) => json!(i),
            Atom::Real(r) => json!(r),
            Atom::Boolean(b) => json!(b),
            Atom::String(s) => json!(s),
            Atom::Uuid(u) => json!(["uuid", u.to_string()]),
            Atom::NamedUuid(n) => json!(["named-uuid", n]),
        }
    }

    /// Parses the JSON form of an atom.
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        match v {
            Value::Bool(b) => Ok(Atom::Boolean(*b)),
            Value::String(s) => Ok(Atom::String(s.clone())),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Ok(Atom::Integer(i)),
                None => n
                    .as_f64()
                    .map(Atom::Real)
                    .ok_or_else(|| bad(&format!("number {n} out of range"))),
            },
            Value::Array(a) => match (a.first().and_then(Value::as_str), a.get(1), a.len()) {
                (Some("uuid"), Some(Value::String(s)), 2) => Uuid::parse_str(s)
                    .map(Atom::Uuid)
                    .map_err(|e| bad(&format!("bad uuid {s:?}: {e}"))),
                (Some("named-uuid"), Some(Value::String(s)), 2) => Ok(Atom::NamedUuid(s.clone())),
                _ => Err(bad(&format!("not an atom: {v}"))),
            },
            _ => Err(bad(&format!("not an atom: {v}"))),
        }
    }

    /// The string, if this is a string atom.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Atom::String(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&str> for Atom {
    fn from(s: &str) -> Self {
        Atom::String(s.to_string())
    }
}
impl From<String> for Atom {
    fn from(s: String) -> Self {
        Atom::String(s)
    }
}
impl From<bool> for Atom {
    fn from(b: bool) -> Self {
        Atom::Boolean(b)
    }
}
impl From<i64> for Atom {
    fn from(i: i64) -> Self {
        Atom::Integer(i)
    }
}
impl From<Uuid> for Atom {
    fn from(u: Uuid) -> Self {
        Atom::Uuid(u)
    }
}

/// A column value: an atom, a set of atoms or a map of atom pairs.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum {
    /// A bare atom (also how servers send one-element sets).
    Atom(Atom),
    /// `["set", [...]]`
    Set(Vec<Atom>),
    /// `["map", [[k, v], ...]]`
    Map(Vec<(Atom, Atom)>),
}

impl Datum {
    /// The empty set, which is also how an unset optional column reads.
    pub fn empty_set() -> Self {
        Datum::Set(Vec::new())
    }

    /// A string→string map (ordered by key, as the server orders it).
    pub fn string_map<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Datum::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Atom::string(k.as_ref()), Atom::string(v.as_ref())))
                .collect(),
        )
    }

    /// A set of strings.
    pub fn string_set<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Self {
        Datum::Set(
            items
                .into_iter()
                .map(|s| Atom::string(s.as_ref()))
                .collect(),
        )
    }

    /// The JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Datum::Atom(a) => a.to_json(),
            Datum::Set(items) => {
                json!(["set", items.iter().map(Atom::to_json).collect::<Vec<_>>()])
            }
            Datum::Map(pairs) => json!([
                "map",
                pairs
                    .iter()
                    .map(|(k, v)| json!([k.to_json(), v.to_json()]))
                    .collect::<Vec<_>>()
            ]),
        }
    }

    /// Parses the JSON form of a column value.
    pub fn from_json(v: &Value) -> Result<Self, Error> {
        if let Value::Array(a) = v {
            match (a.first().and_then(Value::as_str), a.get(1), a.len()) {
                (Some("set"), Some(Value::Array(items)), 2) => {
                    return items
                        .iter()
                        .map(Atom::from_json)
                        .collect::<Result<_, _>>()
                        .map(Datum::Set);
                }
                (Some("map"), Some(Value::Array(pairs)), 2) => {
                    return pairs
                        .iter()
                        .map(|p| match p {
                            Value::Array(kv) if kv.len() == 2 => {
                                Ok((Atom::from_json(&kv[0])?, Atom::from_json(&kv[1])?))
                            }
                            _ => Err(bad(&format!("not a map pair: {p}"))),
                        })
                        .collect::<Result<_, _>>()
                        .map(Datum::Map);
                }
                _ => {}
            }
        }
        Atom::from_json(v).map(Datum::Atom)
    }

    /// The elements, treating a bare atom as a one-element set.
    pub fn as_set(&self) -> Option<Vec<&Atom>> {
        match self {
            Datum::Atom(a) => Some(vec![a]),
            Datum::Set(items) => Some(items.iter().collect()),
            Datum::Map(_) => None,
        }
    }

    /// A boolean column (or an optional one: the empty set reads `None`).
    pub fn as_bool(&self) -> Option<bool> {
        match self.as_set()?.as_slice() {
            [Atom::Boolean(b)] => Some(*b),
            _ => None,
        }
    }

    /// A string→string map; an empty set is accepted as the empty map
    /// (`ovsdb-server` never sends it, other implementations might).
    pub fn as_string_map(&self) -> Option<BTreeMap<String, String>> {
        match self {
            Datum::Map(pairs) => pairs
                .iter()
                .map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
                .collect(),
            Datum::Set(items) if items.is_empty() => Some(BTreeMap::new()),
            _ => None,
        }
    }
}

impl From<Atom> for Datum {
    fn from(a: Atom) -> Self {
        Datum::Atom(a)
    }
}
impl From<bool> for Datum {
    fn from(b: bool) -> Self {
        Datum::Atom(Atom::Boolean(b))
    }
}
impl From<&str> for Datum {
    fn from(s: &str) -> Self {
        Datum::Atom(Atom::string(s))
    }
}
impl From<i64> for Datum {
    fn from(i: i64) -> Self {
        Datum::Atom(Atom::Integer(i))
    }
}

fn bad(reason: &str) -> Error {
    Error::UnexpectedReply {
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_shapes() {
        let u = Uuid::parse_str("36a9a2a4-3e5b-4b43-9a4a-2bd5f3d0c1f0").unwrap();
        let data = [
            Datum::from(true),
            Datum::from(-5i64),
            Datum::Atom(Atom::Real(1.5)),
            Datum::from("x"),
            Datum::Atom(Atom::Uuid(u)),
            Datum::Atom(Atom::NamedUuid("row1".into())),
            Datum::string_set(["a", "b"]),
            Datum::empty_set(),
            Datum::string_map([("k", "v"), ("k2", "v2")]),
            Datum::Map(vec![(Atom::Integer(1), Atom::Uuid(u))]),
        ];
        for d in data {
            assert_eq!(
                Datum::from_json(&d.to_json()).unwrap(),
                d,
                "{}",
                d.to_json()
            );
        }
    }

    #[test]
    fn captured_forms() {
        // As `ovsdb-server` 3.1 sends Open_vSwitch other_config and an unset
        // optional column.
        let v: Value = serde_json::from_str(
            r#"["map",[["ca_cert","/k/1/ca.pem"],["private_key","/k/1/key.pem"]]]"#,
        )
        .unwrap();
        let m = Datum::from_json(&v).unwrap().as_string_map().unwrap();
        assert_eq!(m["ca_cert"], "/k/1/ca.pem");
        let empty: Value = serde_json::from_str(r#"["set",[]]"#).unwrap();
        assert_eq!(Datum::from_json(&empty).unwrap().as_bool(), None);
        assert_eq!(
            Datum::from_json(&json!(false)).unwrap().as_bool(),
            Some(false)
        );
        assert_eq!(
            Datum::from_json(&json!(["set", [true]])).unwrap().as_bool(),
            Some(true)
        );
    }

    #[test]
    fn rejects_bad_values() {
        for v in [
            json!({"a": 1}),
            json!(["uuid", "nope"]),
            json!(["map", [[1]]]),
            json!([1, 2]),
            json!(null),
        ] {
            assert!(Datum::from_json(&v).is_err(), "{v}");
        }
    }
}
