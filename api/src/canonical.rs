//! Canonical JSON: the byte form every signed document is signed over.
//!
//! The encoding is RFC 8785 (JSON Canonicalization Scheme) restricted to
//! integers, which makes it simple enough to state completely:
//!
//! * UTF-8, no byte-order mark, no whitespace outside strings.
//! * Object members sorted by key, comparing keys as sequences of UTF-16
//!   code units (RFC 8785 §3.2.3); duplicate keys are not allowed.
//! * Numbers: integers only, in `-(2^53-1) ..= 2^53-1`, written in decimal
//!   without sign for non-negatives, no leading zeros, no exponent, no
//!   fraction. Floats are rejected on encode and decode.
//! * Strings: `"` and `\` escaped with a backslash; U+0008, U+0009, U+000A,
//!   U+000C, U+000D as `\b \t \n \f \r`; other code points below U+0020 as
//!   `\u00xx` (lowercase hex); everything else (including `/` and non-ASCII)
//!   as literal UTF-8.
//! * `true`, `false`, `null` as such; arrays keep their order.
//!
//! Decoding ([`from_canonical_slice`]) parses, re-encodes and requires the
//! result to equal the input byte for byte, so a document has exactly one
//! accepted encoding and a verifier never has to ask "which bytes were
//! signed".
//!
//! The sorting is done here, not by `serde_json::Map`, because another crate
//! in the build may turn on serde_json's `preserve_order` feature.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};

/// Largest magnitude of an integer the canonical form carries (2^53 - 1,
/// the I-JSON safe range, so every JSON implementation reads it exactly).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Serialises `value` to canonical JSON bytes.
pub fn to_canonical_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let v = serde_json::to_value(value).map_err(Error::document)?;
    let mut out = Vec::new();
    write_value(&v, &mut out)?;
    Ok(out)
}

/// Encodes an already-built JSON value canonically.
pub fn value_to_canonical_vec(value: &Value) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_value(value, &mut out)?;
    Ok(out)
}

/// Parses canonical JSON bytes into `T`, rejecting any input that is not
/// exactly the canonical encoding of what it parses to.
pub fn from_canonical_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let v: Value = serde_json::from_slice(bytes).map_err(Error::document)?;
    // serde_json keeps the last of duplicate keys; re-encoding then drops
    // the others, so duplicates fail the comparison below too.
    if value_to_canonical_vec(&v)? != bytes {
        return Err(Error::NonCanonical);
    }
    serde_json::from_value(v).map_err(Error::document)
}

fn write_value(v: &Value, out: &mut Vec<u8>) -> Result<()> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                if u > MAX_SAFE_INTEGER {
                    return Err(out_of_range());
                }
                out.extend_from_slice(u.to_string().as_bytes());
            } else if let Some(i) = n.as_i64() {
                if i.unsigned_abs() > MAX_SAFE_INTEGER {
                    return Err(out_of_range());
                }
                out.extend_from_slice(i.to_string().as_bytes());
            } else {
                return Err(Error::NotCanonicalizable {
                    reason: "floating-point number".into(),
                });
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_value(val, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn out_of_range() -> Error {
    Error::NotCanonicalizable {
        reason: "integer outside +/-(2^53-1)".into(),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn sorted_compact_escaped() {
        let v = json!({"b": 1, "a": [true, null, -5], "\u{e000}": "x", "\u{1f600}": "y", "s": "q\"\\\n\u{1}/é"});
        let bytes = value_to_canonical_vec(&v).unwrap();
        // U+1F600 is a surrogate pair (0xD83D...) and sorts before U+E000
        // in UTF-16 order, unlike UTF-8 order.
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "{\"a\":[true,null,-5],\"b\":1,\"s\":\"q\\\"\\\\\\n\\u0001/é\",\"\u{1f600}\":\"y\",\"\u{e000}\":\"x\"}"
        );
    }

    #[test]
    fn rejects_non_canonical_input() {
        for bad in [
            &b"{\"b\":1,\"a\":2}"[..],
            b"{\"a\": 2}",
            b"{\"a\":2,\"a\":2}",
            b"{\"a\":\"\\u0041\"}",
            b"{\"a\":1.0}",
            b"{\"a\":9007199254740992}",
            b" {}",
        ] {
            assert!(from_canonical_slice::<Value>(bad).is_err(), "{bad:?}");
        }
        assert!(from_canonical_slice::<Value>(b"{\"a\":2,\"b\":1}").is_ok());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(MAX_SAFE_INTEGER as i64)..=(MAX_SAFE_INTEGER as i64)).prop_map(|i| json!(i)),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn canonical_round_trip(v in arb_json()) {
            let bytes = value_to_canonical_vec(&v).unwrap();
            let back: Value = from_canonical_slice(&bytes).unwrap();
            prop_assert_eq!(&back, &v);
            // serde_json agrees on the meaning of the bytes.
            let parsed: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(parsed, v);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = from_canonical_slice::<Value>(&bytes);
        }
    }
}
