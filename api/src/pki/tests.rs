use super::*;
use crate::test_util::{self, TestCa, TestKeyAlg};
use proptest::prelude::*;

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_unix(secs).unwrap()
}

#[test]
fn pem_round_trip_and_crlf() {
    let leaf = test_util::p256_leaf();
    let pem = leaf.cert_pem();
    assert_eq!(
        Certificate::from_pem(pem.as_bytes()).unwrap(),
        leaf.certificate
    );
    let crlf = pem.replace('\n', "\r\n");
    assert_eq!(
        Certificate::from_pem(crlf.as_bytes()).unwrap(),
        leaf.certificate
    );
    // Lines are 64 columns.
    assert!(pem.lines().all(|l| l.len() <= 64 || l.starts_with("-----")));
}

#[test]
fn pem_garbage_is_rejected_with_a_line() {
    let ca = test_util::p256_ca().certificate.to_pem();
    let cases = [
        (format!("hello\n{ca}"), "line 1: text outside"),
        (format!("{ca}trailing junk\n"), "text outside"),
        (
            ca.replace("-----END CERTIFICATE-----\n", ""),
            "not terminated",
        ),
        (ca.replace("CERTIFICATE", "PRIVATE KEY"), "unexpected block"),
        (
            ca.replacen('\n', "\nProc-Type: 4,ENCRYPTED\n", 1),
            "headers are not accepted",
        ),
        ("".to_string(), "no CERTIFICATE block"),
        (
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".to_string(),
            "empty block",
        ),
        (
            "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n".to_string(),
            "base64",
        ),
    ];
    for (input, want) in cases {
        match TrustBundle::from_pem(input.as_bytes()) {
            Err(Error::InvalidPem { reason }) => {
                assert!(reason.contains(want), "{reason} / {want}")
            }
            other => panic!("{want}: {other:?}"),
        }
    }
    assert!(matches!(
        TrustBundle::from_pem(&[0xff, 0xfe]),
        Err(Error::InvalidPem { .. })
    ));
    // Valid PEM of something that is not a certificate.
    let not_cert = encode_pem(PEM_CERTIFICATE, b"\x30\x03\x02\x01\x01");
    assert!(matches!(
        TrustBundle::from_pem(not_cert.as_bytes()),
        Err(Error::InvalidTrustBundle { .. })
    ));
}

#[test]
fn trust_bundle_digest_is_sha256_over_concatenated_der() {
    let a = &test_util::rsa_ca().certificate;
    let b = &test_util::p256_ca().certificate;
    let pem = format!("{}\n{}", a.to_pem(), b.to_pem());
    let bundle = TrustBundle::from_pem(pem.as_bytes()).unwrap();
    let mut cat = a.der().to_vec();
    cat.extend_from_slice(b.der());
    assert_eq!(bundle.digest(), Sha256Digest::of(&cat));
    assert_eq!(bundle.digest(), trust_digest([a.der(), b.der()]));
    let reversed =
        TrustBundle::from_pem(format!("{}{}", b.to_pem(), a.to_pem()).as_bytes()).unwrap();
    assert_ne!(
        bundle.digest(),
        reversed.digest(),
        "order is part of the digest"
    );
    assert_eq!(
        TrustBundle::from_pem(bundle.to_pem().as_bytes()).unwrap(),
        bundle
    );
    assert_eq!(a.digest(), certificate_digest(a.der()));
}

#[test]
fn trust_bundle_rejects_leaves() {
    let leaf = test_util::p256_leaf();
    match TrustBundle::from_pem(leaf.cert_pem().as_bytes()) {
        Err(Error::InvalidTrustBundle { reason }) => assert!(reason.contains("not a CA")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn leaf_facts() {
    let leaf = test_util::rsa_leaf();
    let c = &leaf.certificate;
    assert_eq!(c.key_algorithm(), KeyAlgorithm::Rsa { bits: 2048 });
    assert!(!c.is_ca());
    assert_eq!(c.common_names(), ["chassis-rsa-a"]);
    assert_eq!(c.organizations(), ["kube-ovn"]);
    assert_eq!(c.dns_names(), ["chassis-rsa-a"]);
    assert_eq!(
        test_util::p256_leaf().certificate.key_algorithm(),
        KeyAlgorithm::EcdsaP256
    );
}

#[test]
fn chain_and_identity_checks() {
    let now = ts(1_700_000_000);
    let rsa_trust = test_util::rsa_ca().trust_bundle();
    let p256_trust = test_util::p256_ca().trust_bundle();
    let rsa = test_util::rsa_leaf();
    let ec = test_util::p256_leaf();
    rsa_trust.verify_leaf(&rsa.certificate, now).unwrap();
    p256_trust.verify_leaf(&ec.certificate, now).unwrap();
    assert_eq!(
        rsa_trust.verify_leaf(&ec.certificate, now),
        Err(Error::Untrusted)
    );
    assert_eq!(
        p256_trust.verify_leaf(&rsa.certificate, now),
        Err(Error::Untrusted)
    );
    // During a CA rotation both CAs are trusted.
    let both = TrustBundle::from_certificates(vec![
        test_util::rsa_ca().certificate.clone(),
        test_util::p256_ca().certificate.clone(),
    ])
    .unwrap();
    both.verify_leaf(&rsa.certificate, now).unwrap();
    both.verify_leaf(&ec.certificate, now).unwrap();
    // A different CA with the same name does not verify (signature check).
    let impostor = TestCa::new(TestKeyAlg::P256, "kube-ovn IPsec test CA (P-256)");
    assert_eq!(
        impostor.trust_bundle().verify_leaf(&ec.certificate, now),
        Err(Error::Untrusted)
    );

    rsa.certificate
        .check_chassis_identity(&rsa.chassis)
        .unwrap();
    assert!(matches!(
        rsa.certificate.check_chassis_identity(&ec.chassis),
        Err(Error::IdentityMismatch { .. })
    ));
    assert!(
        test_util::rsa_ca()
            .certificate
            .check_chassis_identity(&rsa.chassis)
            .is_err()
    );
}

#[test]
fn validity_and_renewal_point() {
    let ca = test_util::p256_ca();
    let nb = ts(1_700_000_000);
    let na = nb.plus_secs(7 * 24 * 3600);
    let leaf = ca.issue_with_validity("chassis-x", TestKeyAlg::P256, nb, na);
    let c = &leaf.certificate;
    assert_eq!((c.not_before(), c.not_after()), (nb, na));
    let trust = ca.trust_bundle();
    trust.verify_leaf(c, nb).unwrap();
    trust.verify_leaf(c, na).unwrap();
    assert!(matches!(
        trust.verify_leaf(c, na.plus_secs(1)),
        Err(Error::CertificateNotValidNow { .. })
    ));
    assert!(trust.verify_leaf(c, nb.plus_secs(-1)).is_err());

    let uid = Uid::new("node-uid-1").unwrap();
    let r = c.renewal_time(&uid);
    assert_eq!(r, c.renewal_time(&uid), "stable");
    let life = na.secs_since(nb);
    let off = r.secs_since(nb);
    assert!(
        off >= life * 2 / 5 && off <= life * 3 / 5,
        "{off} of {life}"
    );
    // A renewed certificate for the same key gets its own point.
    let again = ca.issue_for_key("chassis-x", &leaf.key_pkcs8_der, Some((nb, na)));
    assert_ne!(again.certificate.digest(), c.digest());
    assert!(leaf.signing_key().matches_certificate(&again.certificate));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn pem_parser_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = TrustBundle::from_pem(&bytes);
        let _ = Certificate::from_der(&bytes);
    }

    #[test]
    fn pem_parser_never_panics_on_pemish_text(
        body in "[A-Za-z0-9+/=\n -]{0,200}",
        label in prop::sample::select(vec!["CERTIFICATE", "PRIVATE KEY", "X"]),
    ) {
        let text = format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n");
        let _ = TrustBundle::from_pem(text.as_bytes());
    }

    #[test]
    fn renewal_point_stays_in_window(uid in "[a-z0-9-]{1,36}", which in 0usize..4) {
        let leaves = [
            test_util::rsa_leaf(), test_util::rsa_leaf_b(),
            test_util::p256_leaf(), test_util::p256_leaf_b(),
        ];
        let c = &leaves[which].certificate;
        let r = c.renewal_time(&Uid::new(uid).unwrap());
        let life = c.not_after().secs_since(c.not_before());
        let off = r.secs_since(c.not_before());
        prop_assert!(off >= life * 2 / 5 && off <= life * 3 / 5);
    }
}
