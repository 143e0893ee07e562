use super::*;
use crate::coordination::{RELEASE_RECEIPT_DOMAIN, Receipt};
use crate::test_util::{self, TestLeaf};
use proptest::prelude::*;
use serde::Deserialize;

/// A small document kind for tests (signing cost does not depend on it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    n: u64,
    s: String,
}

impl SignedPayload for Doc {
    const DOMAIN: &'static [u8] = b"kube-ovn IPsec test document v1\0";
    const MAX_ENCODED_LEN: usize = 8 * 1024;
}

/// The same schema under another domain: a signature for [`Doc`] must not
/// verify as this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
struct OtherDomainDoc(Doc);

impl SignedPayload for OtherDomainDoc {
    const DOMAIN: &'static [u8] = RELEASE_RECEIPT_DOMAIN;
    const MAX_ENCODED_LEN: usize = 8 * 1024;
}

fn leaves() -> [&'static TestLeaf; 4] {
    [
        test_util::rsa_leaf(),
        test_util::rsa_leaf_b(),
        test_util::p256_leaf(),
        test_util::p256_leaf_b(),
    ]
}

fn doc() -> Doc {
    Doc {
        n: 42,
        s: "node-a".into(),
    }
}

/// Splits an annotation into (payload, alg, signature) bytes.
fn parts(s: &str) -> (Vec<u8>, String, Vec<u8>) {
    let v: Vec<&str> = s.split('.').collect();
    (
        URL_SAFE_NO_PAD.decode(v[0]).unwrap(),
        v[1].to_owned(),
        URL_SAFE_NO_PAD.decode(v[2]).unwrap(),
    )
}

fn join(p: &[u8], alg: &str, sig: &[u8]) -> String {
    format!(
        "{}.{alg}.{}",
        URL_SAFE_NO_PAD.encode(p),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

#[test]
fn envelope_shape_and_algorithms() {
    let rsa = test_util::rsa_leaf();
    let ec = test_util::p256_leaf();
    assert_eq!(
        rsa.signing_key().algorithm(),
        SignatureAlgorithm::RsaPkcs1Sha256
    );
    assert_eq!(
        ec.signing_key().algorithm(),
        SignatureAlgorithm::EcdsaP256Sha256
    );
    let s = sign(&doc(), &rsa.signing_key()).unwrap();
    let (p, alg, sig) = parts(&s);
    assert_eq!(p, br#"{"n":42,"s":"node-a"}"#);
    assert_eq!(alg, "rsa-pkcs1v15-sha256");
    assert_eq!(sig.len(), 256);
    assert!(!s.contains('='), "no padding");
    let s = sign(&doc(), &ec.signing_key()).unwrap();
    assert_eq!(parts(&s).1, "ecdsa-p256-sha256");
    assert_eq!(verify::<Doc>(&s, &ec.certificate).unwrap(), doc());
    assert!(format!("{:?}", ec.signing_key()).contains("EcdsaP256"));
}

#[test]
fn key_matches_its_certificate_only() {
    for (i, a) in leaves().iter().enumerate() {
        for (j, b) in leaves().iter().enumerate() {
            assert_eq!(a.signing_key().matches_certificate(&b.certificate), i == j);
        }
    }
}

#[test]
fn key_a_never_verifies_with_certificate_b() {
    for (i, a) in leaves().iter().enumerate() {
        let s = sign(&doc(), &a.signing_key()).unwrap();
        for (j, b) in leaves().iter().enumerate() {
            let r = verify::<Doc>(&s, &b.certificate);
            if i == j {
                assert!(r.is_ok());
            } else {
                assert!(
                    matches!(
                        r,
                        Err(Error::BadSignature | Error::AlgorithmMismatch { .. })
                    ),
                    "{i} vs {j}: {r:?}"
                );
            }
        }
    }
}

#[test]
fn envelope_cannot_steer_the_algorithm() {
    let rsa = test_util::rsa_leaf();
    let s = sign(&doc(), &rsa.signing_key()).unwrap();
    let (p, _, sig) = parts(&s);
    let relabelled = join(&p, "ecdsa-p256-sha256", &sig);
    assert!(matches!(
        verify::<Doc>(&relabelled, &rsa.certificate),
        Err(Error::AlgorithmMismatch { .. })
    ));
}

#[test]
fn domain_separation() {
    let leaf = test_util::p256_leaf();
    let s = sign(&doc(), &leaf.signing_key()).unwrap();
    assert!(matches!(
        verify::<OtherDomainDoc>(&s, &leaf.certificate),
        Err(Error::BadSignature)
    ));
    // A Doc annotation is not a Receipt either (schema) — typed error.
    assert!(matches!(
        decode::<Receipt>(&s),
        Err(Error::InvalidDocument { .. })
    ));
}

#[test]
fn non_canonical_payload_is_rejected_even_if_signed() {
    // Sign a non-canonical encoding by hand: valid signature, wrong bytes.
    let leaf = test_util::p256_leaf();
    let payload = br#"{"s":"node-a","n":42}"#;
    let sig = leaf
        .signing_key()
        .sign_raw(&message::<Doc>(payload))
        .unwrap();
    let s = join(payload, "ecdsa-p256-sha256", &sig);
    assert_eq!(
        verify::<Doc>(&s, &leaf.certificate),
        Err(Error::NonCanonical)
    );
}

#[test]
fn malformed_envelopes() {
    for bad in [
        "",
        "a",
        "a.b",
        "a.b.c.d",
        "e30.rsa-pkcs1v15-sha256.",
        "e30=.rsa-pkcs1v15-sha256.AA",
        "e30.unknown.AA",
        "!!.rsa-pkcs1v15-sha256.AA",
    ] {
        assert!(decode::<Doc>(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn private_key_loading() {
    let leaf = test_util::rsa_leaf();
    assert!(SigningKey::from_pkcs8_pem(leaf.key_pem().as_bytes()).is_ok());
    assert!(matches!(
        SigningKey::from_pkcs8_der(b"not a key"),
        Err(Error::InvalidPrivateKey { .. })
    ));
    assert!(SigningKey::from_pkcs8_pem(leaf.cert_pem().as_bytes()).is_err());
}

fn flip_strategy() -> impl Strategy<Value = (usize, bool, usize, u8)> {
    (0usize..4, any::<bool>(), any::<usize>(), 1u8..=255)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Flipping any bit pattern in any byte of the payload or the signature
    /// makes verification fail.
    #[test]
    fn any_flip_fails((which, in_payload, pos, mask) in flip_strategy()) {
        let leaf = leaves()[which];
        // Sign once per key, not per case: RSA signing is slow in debug.
        static SIGNED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let signed = SIGNED.get_or_init(|| {
            leaves().iter().map(|l| sign(&doc(), &l.signing_key()).unwrap()).collect()
        });
        let (mut p, alg, mut sig) = parts(&signed[which]);
        if in_payload {
            let i = pos % p.len();
            p[i] ^= mask;
        } else {
            let i = pos % sig.len();
            sig[i] ^= mask;
        }
        prop_assert!(verify::<Doc>(&join(&p, &alg, &sig), &leaf.certificate).is_err());
    }

    /// Changing any character of the annotation text makes it fail (strict
    /// base64url: no two spellings decode to the same bytes).
    #[test]
    fn any_text_edit_fails(which in 0usize..4, pos in any::<usize>(), c in any::<char>()) {
        let leaf = leaves()[which];
        static SIGNED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let signed = SIGNED.get_or_init(|| {
            leaves().iter().map(|l| sign(&doc(), &l.signing_key()).unwrap()).collect()
        });
        let s = &signed[which];
        let i = pos % s.len();
        let mut edited = String::new();
        edited.push_str(&s[..i]);
        edited.push(c);
        edited.push_str(&s[i + 1..]);
        prop_assume!(edited != *s);
        prop_assert!(verify::<Doc>(&edited, &leaf.certificate).is_err());
    }

    #[test]
    fn decode_arbitrary_text_never_panics(s in ".{0,300}") {
        let _ = decode::<Receipt>(&s);
        let _ = decode::<Doc>(&s);
    }

    #[test]
    fn decode_arbitrary_envelopes_never_panics(
        p in prop::collection::vec(any::<u8>(), 0..200),
        alg in prop::sample::select(vec!["rsa-pkcs1v15-sha256", "ecdsa-p256-sha256", "x"]),
        sig in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let s = join(&p, alg, &sig);
        for leaf in leaves() {
            prop_assert!(verify::<Doc>(&s, &leaf.certificate).is_err());
        }
    }

    #[test]
    fn p256_sign_verify_round_trip(n in 0..=crate::canonical::MAX_SAFE_INTEGER, s in ".{0,64}") {
        let d = Doc { n, s };
        let leaf = test_util::p256_leaf();
        let a = sign(&d, &leaf.signing_key()).unwrap();
        prop_assert_eq!(verify::<Doc>(&a, &leaf.certificate).unwrap(), d);
    }
}
