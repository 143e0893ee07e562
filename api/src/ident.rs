//! Validated identifiers: [`Chassis`] and [`Uid`].
//!
//! Both appear in certificates, CSR annotations, receipts and `/status`.
//! Validating them on construction *and* on deserialisation means a status
//! document or receipt cannot smuggle arbitrary text (a PEM block needs
//! spaces and newlines, which neither accepts).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A chassis name: OVS `Open_vSwitch . external_ids:system-id`, also the
/// certificate's `CN` and its only `DNS:` SAN.
///
/// Accepted form: 1..=253 ASCII characters from `[A-Za-z0-9.-]`, starting and
/// ending with a letter or digit — what a DNS SAN can carry, and what
/// Kube-OVN uses (a node name or a UUID).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Chassis(String);

impl Chassis {
    /// Validates and wraps a chassis name.
    pub fn new(s: impl Into<String>) -> Result<Self> {
        let s = s.into();
        let bytes = s.as_bytes();
        if bytes.is_empty() || bytes.len() > 253 {
            return Err(Error::invalid_value("chassis", "length must be 1..=253"));
        }
        if !bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
        {
            return Err(Error::invalid_value(
                "chassis",
                "only letters, digits, '-' and '.' are allowed",
            ));
        }
        let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
        if !edge_ok(bytes.first()) || !edge_ok(bytes.last()) {
            return Err(Error::invalid_value(
                "chassis",
                "must start and end with a letter or digit",
            ));
        }
        Ok(Chassis(s))
    }

    /// The chassis name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A Kubernetes object UID (Node, Pod, CSR, DaemonSet).
///
/// Kubernetes generates RFC 4122 UUIDs but does not promise the format, so
/// this accepts 1..=128 characters from `[A-Za-z0-9-]`. UIDs are compared
/// byte for byte; no case folding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Uid(String);

impl Uid {
    /// Validates and wraps a UID.
    pub fn new(s: impl Into<String>) -> Result<Self> {
        let s = s.into();
        if s.is_empty() || s.len() > 128 {
            return Err(Error::invalid_value("uid", "length must be 1..=128"));
        }
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(Error::invalid_value(
                "uid",
                "only letters, digits and '-' are allowed",
            ));
        }
        Ok(Uid(s))
    }

    /// The UID string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_newtype_impls {
    ($t:ident) => {
        impl TryFrom<String> for $t {
            type Error = Error;
            fn try_from(s: String) -> Result<Self> {
                $t::new(s)
            }
        }
        impl TryFrom<&str> for $t {
            type Error = Error;
            fn try_from(s: &str) -> Result<Self> {
                $t::new(s)
            }
        }
        impl FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                $t::new(s)
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}
string_newtype_impls!(Chassis);
string_newtype_impls!(Uid);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chassis_accepts_uuids_and_node_names() {
        assert!(Chassis::new("0b3c5f8e-1a2b-4c3d-8e9f-001122334455").is_ok());
        assert!(Chassis::new("node-1.example.com").is_ok());
    }

    #[test]
    fn chassis_rejects_pem_and_edges() {
        for bad in [
            "",
            "-a",
            "a-",
            "a b",
            "-----BEGIN CERTIFICATE-----",
            "a_b",
            "a\nb",
        ] {
            assert!(Chassis::new(bad).is_err(), "{bad:?}");
        }
        assert!(Chassis::new("a".repeat(254)).is_err());
    }

    #[test]
    fn uid_rules() {
        assert!(Uid::new("6f1e2d3c-0000-4000-8000-000000000001").is_ok());
        assert!(Uid::new("").is_err());
        assert!(Uid::new("a/b").is_err());
        assert!(serde_json::from_str::<Uid>("\"x y\"").is_err());
    }
}
