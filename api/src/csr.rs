//! CSR naming.
//!
//! The name is derived, never chosen, so that a restarted agent resuming a
//! pending request computes the same name, and two different requests never
//! share one. The controller never trusts the name (SPEC §6); it is a
//! convenience for idempotent creation and for operators.
//!
//! # Byte layout
//!
//! ```text
//! digest = SHA-256(
//!     "kube-ovn IPsec CSR name v1\0"                    -- domain, 27 bytes
//!     || be64(len(node_uid))      || node_uid            -- UTF-8
//!     || be64(len(pod_uid))       || pod_uid             -- UTF-8
//!     || be64(8)                  || be64(expiration_seconds)
//!     || be64(32)                 || trust_digest        -- raw 32 bytes
//!     || be64(len(request))       || request             -- spec.request bytes (PEM)
//! )
//! name = "ovn-ipsec-" || lowercase_hex(digest[0..16])
//! ```
//!
//! `be64` is an unsigned 64-bit big-endian integer. Every field is
//! length-prefixed, so no two different inputs frame to the same bytes.
//! 128 bits of digest keep names short in `kubectl get csr` while leaving
//! collisions out of reach.

use crate::digest::Sha256Digest;
use crate::ident::Uid;
use crate::names::k8s::CSR_NAME_PREFIX;

/// Domain separation prefix of the CSR-name digest.
pub const CSR_NAME_DOMAIN: &[u8] = b"kube-ovn IPsec CSR name v1\0";

/// SHA-256 over `domain` followed by each field as `be64(len) || bytes`.
pub(crate) fn framed_digest(domain: &[u8], fields: &[&[u8]]) -> Sha256Digest {
    let mut lens = Vec::with_capacity(fields.len());
    for f in fields {
        lens.push((f.len() as u64).to_be_bytes());
    }
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + 2 * fields.len());
    parts.push(domain);
    for (f, len) in fields.iter().zip(lens.iter()) {
        parts.push(len);
        parts.push(f);
    }
    Sha256Digest::of_parts(parts)
}

/// The CSR name for (Node UID, Pod UID, requested lifetime, trust digest,
/// CSR `spec.request` bytes). See the module doc for the exact layout.
pub fn csr_name(
    node_uid: &Uid,
    pod_uid: &Uid,
    expiration_seconds: u32,
    trust_digest: &Sha256Digest,
    request: &[u8],
) -> String {
    let lifetime = u64::from(expiration_seconds).to_be_bytes();
    let d = framed_digest(
        CSR_NAME_DOMAIN,
        &[
            node_uid.as_str().as_bytes(),
            pod_uid.as_str().as_bytes(),
            &lifetime,
            trust_digest.as_bytes(),
            request,
        ],
    );
    format!("{CSR_NAME_PREFIX}{}", hex::encode(&d.as_bytes()[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> Uid {
        Uid::new(s).unwrap()
    }

    #[test]
    fn pinned_vector() {
        // Pinned so a change to the layout is a conscious, visible decision.
        let name = csr_name(
            &uid("node-uid"),
            &uid("pod-uid"),
            604_800,
            &Sha256Digest::from_bytes([7; 32]),
            b"req",
        );
        assert!(name.starts_with("ovn-ipsec-"));
        assert_eq!(name.len(), "ovn-ipsec-".len() + 32);
        // Manual framing of the same input.
        let mut buf = Vec::new();
        buf.extend_from_slice(CSR_NAME_DOMAIN);
        for f in [
            b"node-uid".as_slice(),
            b"pod-uid",
            &604_800u64.to_be_bytes(),
            &[7; 32],
            b"req",
        ] {
            buf.extend_from_slice(&(f.len() as u64).to_be_bytes());
            buf.extend_from_slice(f);
        }
        let d = Sha256Digest::of(&buf);
        assert_eq!(name, format!("ovn-ipsec-{}", &d.to_hex()[..32]));
    }

    #[test]
    fn every_input_matters() {
        let t = Sha256Digest::from_bytes([1; 32]);
        let base = csr_name(&uid("a"), &uid("b"), 60, &t, b"r");
        assert_ne!(base, csr_name(&uid("b"), &uid("a"), 60, &t, b"r"));
        assert_ne!(base, csr_name(&uid("a"), &uid("b"), 61, &t, b"r"));
        assert_ne!(
            base,
            csr_name(
                &uid("a"),
                &uid("b"),
                60,
                &Sha256Digest::from_bytes([2; 32]),
                b"r"
            )
        );
        assert_ne!(base, csr_name(&uid("a"), &uid("b"), 60, &t, b"s"));
        // Framing: moving a byte between adjacent fields changes the name.
        assert_ne!(
            csr_name(&uid("ab"), &uid("c"), 60, &t, b"r"),
            csr_name(&uid("a"), &uid("bc"), 60, &t, b"r")
        );
    }
}
