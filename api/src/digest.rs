//! [`Sha256Digest`]: the only form in which certificates and trust bundles
//! appear in status, receipts, the coordination record and logs.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// A SHA-256 digest, serialised as 64 lowercase hex characters.
///
/// Decoding accepts lowercase only, so one digest has one spelling (receipts
/// are signed over their text).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// SHA-256 of `data`.
    pub fn of(data: &[u8]) -> Self {
        Sha256Digest(Sha256::digest(data).into())
    }

    /// SHA-256 over several parts fed in order (no separators: callers that
    /// need unambiguous framing add it themselves).
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        Sha256Digest(h.finalize().into())
    }

    /// Wraps raw digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Sha256Digest(bytes)
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for Sha256Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error::invalid_value(
                "digest",
                "must be 64 lowercase hex characters",
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| Error::invalid_value("digest", e))?;
        Ok(Sha256Digest(out))
    }
}

impl TryFrom<String> for Sha256Digest {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Sha256Digest> for String {
    fn from(d: Sha256Digest) -> String {
        d.to_hex()
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector_and_spelling() {
        let d = Sha256Digest::of(b"abc");
        assert_eq!(
            d.to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.to_string().parse::<Sha256Digest>().unwrap(), d);
        assert!(
            d.to_string()
                .to_uppercase()
                .parse::<Sha256Digest>()
                .is_err()
        );
        assert!("ab".parse::<Sha256Digest>().is_err());
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            format!("\"{}\"", d.to_hex())
        );
    }
}
