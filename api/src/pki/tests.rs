use super::*;
use crate::test_util::{self, CaSpec, TestCa, TestKeyAlg};
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
fn a_critical_extension_the_ike_daemon_refuses_is_refused_with_its_oid() {
    let good = test_util::CaSpec::new("good CA").self_signed();
    // A private OID, critical: strongSwan will not load this CA.
    let refused = test_util::CaSpec::new("private extension CA")
        .critical_extension(&[1, 3, 6, 1, 4, 1, 99999, 1], vec![0x05, 0x00])
        .self_signed_der();
    let mut pem = good.cert_pem();
    pem.push_str(&encode_pem(PEM_CERTIFICATE, &refused));
    match TrustBundle::from_pem(pem.as_bytes()) {
        Err(Error::InvalidTrustBundle { reason }) => {
            assert!(reason.starts_with("certificate 2:"), "{reason}");
            assert!(reason.contains("1.3.6.1.4.1.99999.1"), "{reason}");
            assert!(reason.contains("IKE daemon"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // One the daemon implements (inhibitAnyPolicy, skipCerts 0) is fine,
    // beside the critical basicConstraints and keyUsage every CA has.
    let inhibit = test_util::CaSpec::new("inhibit CA")
        .critical_extension(&[2, 5, 29, 54], vec![0x02, 0x01, 0x00])
        .self_signed();
    Certificate::from_der(inhibit.cert_der()).unwrap();
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

// ---- chain verification through intermediates ----

fn chain_of(leaf: &test_util::TestLeaf) -> CertificateChain {
    CertificateChain::from_pem(leaf.chain_pem().as_bytes()).unwrap()
}

#[test]
fn chain_direct_leaf_verifies() {
    let now = ts(1_700_000_000);
    let root = test_util::p256_ca();
    let leaf = test_util::p256_leaf();
    let chain = chain_of(leaf);
    assert!(chain.intermediates().is_empty());
    let verified = chain.verify(&root.trust_bundle(), now).unwrap();
    assert!(verified.intermediates.is_empty());
    assert_eq!(verified.anchor, root.certificate);
    assert_eq!(verified.to_pem(), leaf.cert_pem());
}

#[test]
fn chain_leaf_via_one_intermediate_verifies() {
    let now = ts(1_700_000_000);
    let root = TestCa::p256("root");
    let inter = CaSpec::new("intermediate").issued_by(&root);
    let leaf = inter.leaf("chassis-x").issue();
    let chain = chain_of(&leaf);
    assert_eq!(
        chain.intermediates(),
        std::slice::from_ref(&inter.certificate)
    );
    let trust = root.trust_bundle();
    let verified = trust
        .verify_chain(chain.leaf(), chain.intermediates(), now)
        .unwrap();
    assert_eq!(
        verified.intermediates,
        std::slice::from_ref(&inter.certificate)
    );
    assert_eq!(verified.to_pem(), leaf.chain_pem());
    // Two levels, intermediates in any order, unneeded ones ignored.
    let inter2 = CaSpec::new("intermediate 2").issued_by(&inter);
    let deep = inter2.leaf("chassis-y").issue();
    let stray = test_util::p256_ca().certificate.clone();
    let shuffled = [stray, inter.certificate.clone(), inter2.certificate.clone()];
    let verified = trust
        .verify_chain(&deep.certificate, &shuffled, now)
        .unwrap();
    assert_eq!(
        verified.intermediates,
        [inter2.certificate.clone(), inter.certificate.clone()]
    );
}

#[test]
fn chain_missing_intermediate_is_refused() {
    let now = ts(1_700_000_000);
    let root = TestCa::p256("root");
    let inter = CaSpec::new("intermediate").issued_by(&root);
    let leaf = inter.leaf("chassis-x").issue();
    let trust = root.trust_bundle();
    assert_eq!(
        trust.verify_leaf(&leaf.certificate, now),
        Err(Error::Untrusted)
    );
    assert_eq!(
        trust.verify_chain(&leaf.certificate, &[], now),
        Err(Error::Untrusted)
    );
    // With the intermediate in the bundle itself, no chain is needed.
    let both =
        TrustBundle::from_certificates(vec![root.certificate.clone(), inter.certificate.clone()])
            .unwrap();
    both.verify_leaf(&leaf.certificate, now).unwrap();
}

#[test]
fn chain_intermediate_that_is_not_a_ca_is_refused() {
    let now = ts(1_700_000_000);
    let root = TestCa::p256("root");
    let trust = root.trust_bundle();
    for spec in [
        CaSpec::new("not a CA").not_a_ca(),
        CaSpec::new("no keyCertSign").without_cert_sign(),
    ] {
        let bogus = spec.issued_by(&root);
        let leaf = bogus.leaf("chassis-x").issue();
        assert_eq!(
            trust.verify_chain(&leaf.certificate, &leaf.chain, now),
            Err(Error::Untrusted)
        );
    }
}

#[test]
fn chain_expired_intermediate_is_refused() {
    let now = ts(1_700_000_000);
    let root = TestCa::p256("root");
    let expired = CaSpec::new("expired intermediate")
        .valid(now.plus_secs(-7200), now.plus_secs(-3600))
        .issued_by(&root);
    let leaf = expired
        .leaf("chassis-x")
        .valid(now.plus_secs(-60), now.plus_secs(3600))
        .issue();
    let trust = root.trust_bundle();
    assert_eq!(
        trust.verify_chain(&leaf.certificate, &leaf.chain, now),
        Err(Error::Untrusted)
    );
    // The same chain verified while the intermediate was valid passes.
    let earlier = now.plus_secs(-5000);
    let early_leaf = expired
        .leaf("chassis-x")
        .valid(earlier.plus_secs(-60), earlier.plus_secs(60))
        .issue();
    trust
        .verify_chain(&early_leaf.certificate, &early_leaf.chain, earlier)
        .unwrap();
}

#[test]
fn chain_to_the_wrong_root_is_refused() {
    let now = ts(1_700_000_000);
    let root = TestCa::p256("root");
    let inter = CaSpec::new("intermediate").issued_by(&root);
    let leaf = inter.leaf("chassis-x").issue();
    // Same name, different key: the signature check decides.
    let impostor = TestCa::p256("root");
    assert_eq!(
        impostor
            .trust_bundle()
            .verify_chain(&leaf.certificate, &leaf.chain, now),
        Err(Error::Untrusted)
    );
    assert_eq!(
        test_util::p256_ca()
            .trust_bundle()
            .verify_chain(&leaf.certificate, &leaf.chain, now),
        Err(Error::Untrusted)
    );
}

#[test]
fn chain_path_length_and_size_are_bounded() {
    let now = ts(1_700_000_000);
    // pathLen 0 on the root: it may issue leaves, not intermediates.
    let root = CaSpec::new("root").path_len(0).self_signed();
    root.trust_bundle()
        .verify_leaf(&root.issue("chassis-x", TestKeyAlg::P256).certificate, now)
        .unwrap();
    let inter = CaSpec::new("intermediate").issued_by(&root);
    let leaf = inter.leaf("chassis-x").issue();
    assert_eq!(
        root.trust_bundle()
            .verify_chain(&leaf.certificate, &leaf.chain, now),
        Err(Error::Untrusted)
    );
    // An oversized chain is refused before any path search.
    let open = TestCa::p256("open root");
    let inter = CaSpec::new("intermediate").issued_by(&open);
    let leaf = inter.leaf("chassis-x").issue();
    let many = vec![inter.certificate.clone(); MAX_CHAIN_CERTIFICATES + 1];
    assert_eq!(
        open.trust_bundle()
            .verify_chain(&leaf.certificate, &many, now),
        Err(Error::Untrusted)
    );
    // The leaf's own validity is reported as such.
    let late = ts(1_700_000_000).plus_secs(100 * 365 * 86400 * 30);
    assert!(matches!(
        open.trust_bundle()
            .verify_chain(&leaf.certificate, &leaf.chain, late),
        Err(Error::CertificateNotValidNow { .. })
    ));
}

#[test]
fn trust_bundle_add_and_retain_only() {
    let a = test_util::rsa_ca().certificate.clone();
    let b = test_util::p256_ca().certificate.clone();
    let mut bundle = TrustBundle::from_certificates(vec![a.clone()]).unwrap();
    assert!(bundle.add(b.clone()).unwrap());
    assert!(!bundle.add(b.clone()).unwrap());
    assert_eq!(bundle.digest(), trust_digest([a.der(), b.der()]));
    assert!(bundle.contains(b.der()));
    assert!(
        bundle
            .add(test_util::p256_leaf().certificate.clone())
            .is_err()
    );
    let only_b = bundle.retain_only(b.der()).unwrap();
    assert_eq!(only_b.certificates(), std::slice::from_ref(&b));
    assert_eq!(only_b.digest(), trust_digest([b.der()]));
    assert!(only_b.retain_only(a.der()).is_err(), "never empty");
}

#[test]
fn pem_blocks_keep_their_labels() {
    let ca = test_util::p256_ca().cert_pem();
    let key = test_util::p256_leaf().key_pem();
    let blocks = parse_pem_blocks(format!("{ca}\n{key}").as_bytes()).unwrap();
    let labels: Vec<&str> = blocks.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(labels, [PEM_CERTIFICATE, PEM_PRIVATE_KEY]);
    assert_eq!(blocks[0].der, test_util::p256_ca().cert_der());
    assert!(!format!("{:?}", blocks[1]).contains(&key[30..40]));
    assert!(matches!(
        parse_pem_blocks(b"junk"),
        Err(Error::InvalidPem { .. })
    ));
    assert!(matches!(
        parse_pem_blocks(b""),
        Err(Error::InvalidPem { reason }) if reason == "no PEM block"
    ));
}

#[test]
fn spki_key_types_and_the_ipsec_eku() {
    let rsa = test_util::rsa_leaf()
        .certificate
        .subject_public_key_info()
        .to_vec();
    assert_eq!(
        SpkiKey::from_der(&rsa).unwrap(),
        SpkiKey::Rsa {
            bits: 2048,
            exponent: Some(65537)
        }
    );
    let ec = test_util::p256_leaf()
        .certificate
        .subject_public_key_info()
        .to_vec();
    let key = SpkiKey::from_der(&ec).unwrap();
    assert_eq!(key, SpkiKey::EcdsaP256 { uncompressed: true });
    assert_eq!(key.key_algorithm().unwrap(), KeyAlgorithm::EcdsaP256);
    assert!(matches!(
        (SpkiKey::Rsa {
            bits: 1024,
            exponent: Some(3)
        })
        .key_algorithm(),
        Err(Error::UnsupportedKey { .. })
    ));
    assert!(SpkiKey::from_der(&[0x30, 0x00]).is_err());
    assert_eq!(ipsec_tunnel_eku_dotted(), "1.3.6.1.5.5.7.3.6");
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

// ---- CA rotation point ----

#[test]
fn rotation_time_moves_only_leaves_older_than_the_signing_ca() {
    let t0 = Timestamp::from_unix(1_800_000_000).unwrap();
    let day = 24 * 3600;
    let old_ca = CaSpec::new("old CA")
        .valid(t0, t0.plus_secs(3650 * day))
        .self_signed();
    let rotated_at = t0.plus_secs(10 * day);
    let new_ca = CaSpec::new("new CA")
        .valid(rotated_at, t0.plus_secs(3650 * day))
        .self_signed();
    let signing = Certificate::from_der(new_ca.cert_der()).unwrap();
    let uid = Uid::new("node-uid-1").unwrap();
    let spread = Duration::from_secs(600);

    // An old-CA leaf from before the rotation: a point in the spread window
    // after the new CA's backdate, the same on every call.
    let before = old_ca.issue_with_validity(
        "chassis-x",
        TestKeyAlg::P256,
        t0.plus_secs(day),
        t0.plus_secs(90 * day),
    );
    let at = before
        .certificate
        .rotation_time(&signing, &uid, spread)
        .expect("an old leaf moves");
    let start = rotated_at.plus_secs(i64::try_from(LEAF_BACKDATE.as_secs()).unwrap());
    let off = at.secs_since(start);
    assert!((0..600).contains(&off), "{off}");
    assert_eq!(
        Some(at),
        before.certificate.rotation_time(&signing, &uid, spread)
    );
    // Nodes spread: 20 Node UIDs do not all land on one second.
    let points: std::collections::BTreeSet<_> = (0..20)
        .map(|i| {
            let u = Uid::new(format!("node-{i}")).unwrap();
            before.certificate.rotation_time(&signing, &u, spread)
        })
        .collect();
    assert!(points.len() > 10, "{points:?}");

    // Issued by the signing CA: nothing to do.
    let renewed = new_ca.issue_with_validity(
        "chassis-x",
        TestKeyAlg::P256,
        rotated_at.plus_secs(60),
        rotated_at.plus_secs(90 * day),
    );
    assert_eq!(
        renewed.certificate.rotation_time(&signing, &uid, spread),
        None
    );
    // An old-CA leaf issued in the new CA's own second may predate it (the
    // times are whole seconds): it moves, at the cost of at most one extra
    // renewal if the controller had not switched yet.
    let same_second = old_ca.issue_with_validity(
        "chassis-x",
        TestKeyAlg::P256,
        rotated_at,
        rotated_at.plus_secs(90 * day),
    );
    assert!(
        same_second
            .certificate
            .rotation_time(&signing, &uid, spread)
            .is_some()
    );
    // An old-CA leaf issued after the new CA existed (the controller had
    // not switched yet): waits for its normal renewal, no loop.
    let late = old_ca.issue_with_validity(
        "chassis-x",
        TestKeyAlg::P256,
        rotated_at.plus_secs(1),
        rotated_at.plus_secs(90 * day),
    );
    assert_eq!(late.certificate.rotation_time(&signing, &uid, spread), None);
}
