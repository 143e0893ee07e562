use super::*;

use kube_ovn_ipsec_api::Sha256Digest;
use kube_ovn_ipsec_api::test_util::TestCa;

fn bundle(cas: &[&TestCa]) -> TrustBundle {
    TrustBundle::from_certificates(cas.iter().map(|c| c.certificate.clone()).collect()).unwrap()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn ca_file_name_is_the_prefix_and_16_hex_of_the_der_digest() {
    let ca = TestCa::p256("name test CA");
    let name = ca_file_name(&ca.certificate);
    let hex = Sha256Digest::of(ca.cert_der()).to_hex();
    assert_eq!(name, format!("kube-ovn-ipsec-ca-{}.pem", &hex[..16]));
    assert!(is_ca_file_name(&name));
    // Stable: the same CA gets the same name from any bundle.
    let other = TestCa::p256("other CA");
    assert_ne!(ca_file_name(&other.certificate), name);
    assert_eq!(
        plan_ca_dir(&bundle(&[&other, &ca]), &[], 1).write[1].0,
        name
    );
}

#[test]
fn only_exact_own_names_are_own() {
    assert!(is_ca_file_name("kube-ovn-ipsec-ca-0123456789abcdef.pem"));
    for foreign in [
        "kube-ovn-ipsec-ca.pem",
        "kube-ovn-ipsec-ca-0123456789ABCDEF.pem",
        "kube-ovn-ipsec-ca-0123456789abcde.pem",
        "kube-ovn-ipsec-ca-0123456789abcdef0.pem",
        "kube-ovn-ipsec-ca-0123456789abcdeg.pem",
        "kube-ovn-ipsec-ca-0123456789abcdef.pem.bak",
        "kube-ovn-ipsec-ca-0123456789abcdef.crt",
        "operator-root.pem",
    ] {
        assert!(!is_ca_file_name(foreign), "{foreign}");
    }
}

#[test]
fn plan_writes_every_ca_and_removes_only_own_files_that_left_the_bundle() {
    let (old, new) = (TestCa::p256("old CA"), TestCa::p256("new CA"));
    let (old_file, new_file) = (
        ca_file_name(&old.certificate),
        ca_file_name(&new.certificate),
    );
    let gone = "kube-ovn-ipsec-ca-00000000000000aa.pem";
    let existing = names(&[
        &old_file,
        gone,
        "operator-root.pem",
        "kube-ovn-ipsec-ca.pem",
        LEGACY_TRUST_FILE,
        ".kube-ovn-ipsec-ca-00000000000000bb.pem.tmp-4242",
        ".kube-ovn-ipsec-trust.pem.tmp-17",
        ".kube-ovn-ipsec-ca-00000000000000cc.pem.tmp-7",
        ".operator-root.pem.tmp-4242",
        "kube-ovn-ipsec-ca-00000000000000dd.pem.tmp-4242",
    ]);

    // Rotation: [old, new].
    let plan = plan_ca_dir(&bundle(&[&old, &new]), &existing, 7);
    let written: Vec<&str> = plan.write.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(written, [old_file.as_str(), new_file.as_str()]);
    assert_eq!(plan.write[0].1, old.cert_pem());
    assert_eq!(plan.write[1].1, new.cert_pem());
    assert_eq!(
        plan.remove,
        names(&[
            ".kube-ovn-ipsec-ca-00000000000000bb.pem.tmp-4242",
            ".kube-ovn-ipsec-trust.pem.tmp-17",
            gone,
            LEGACY_TRUST_FILE,
        ]),
        "own PID 7's temporary file is in flight; foreign files stay"
    );

    // Retirement: [new] only; the old CA's file goes.
    let plan = plan_ca_dir(&bundle(&[&new]), &names(&[&old_file, &new_file]), 7);
    assert_eq!(plan.write.len(), 1);
    assert_eq!(plan.write[0].0, new_file);
    assert_eq!(plan.remove, vec![old_file]);

    // A bundle already in place: nothing to remove.
    let plan = plan_ca_dir(&bundle(&[&new]), &names(&[&new_file]), 7);
    assert!(plan.remove.is_empty(), "{plan:?}");
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn install_writes_one_file_per_ca_is_idempotent_and_keeps_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("operator-root.pem"), b"operator's").unwrap();
    std::fs::write(d.join(LEGACY_TRUST_FILE), b"one-file bundle").unwrap();
    let (old, new) = (TestCa::p256("old CA"), TestCa::p256("new CA"));

    let got = install_trust_bundle(d, &bundle(&[&old, &new])).unwrap();
    let (old_file, new_file) = (
        ca_file_name(&old.certificate),
        ca_file_name(&new.certificate),
    );
    assert_eq!(got.files, vec![d.join(&old_file), d.join(&new_file)]);
    assert_eq!(got.written, got.files);
    assert_eq!(got.removed, vec![d.join(LEGACY_TRUST_FILE)]);
    assert_eq!(got.retired(), 0, "the one-file bundle is no retired CA");
    let mut want = names(&[&old_file, &new_file, "operator-root.pem"]);
    want.sort();
    assert_eq!(dir_names(d), want);
    // Each file holds exactly its one CA.
    for (file, ca) in [(&old_file, &old), (&new_file, &new)] {
        let b = TrustBundle::from_pem(&std::fs::read(d.join(file)).unwrap()).unwrap();
        assert_eq!(b.certificates().len(), 1);
        assert_eq!(b.certificates()[0].der(), ca.cert_der());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(d.join(file)).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o644);
    }

    // Again: nothing changes.
    let again = install_trust_bundle(d, &bundle(&[&old, &new])).unwrap();
    assert!(!again.changed(), "{again:?}");

    // Retirement of the old CA.
    let retired = install_trust_bundle(d, &bundle(&[&new])).unwrap();
    assert!(retired.written.is_empty(), "{retired:?}");
    assert_eq!(retired.removed, vec![d.join(&old_file)]);
    assert_eq!(retired.retired(), 1);
    let mut want = names(&[&new_file, "operator-root.pem"]);
    want.sort();
    assert_eq!(dir_names(d), want);
    assert_eq!(
        std::fs::read(d.join("operator-root.pem")).unwrap(),
        b"operator's"
    );
}

#[test]
fn a_missing_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("cacerts");
    let ca = TestCa::p256("CA");
    let e = install_trust_bundle(&missing, &bundle(&[&ca])).unwrap_err();
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
}

#[test]
fn a_bundle_file_with_a_non_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::p256("CA");
    let leaf = ca.issue("chass-a", kube_ovn_ipsec_api::test_util::TestKeyAlg::P256);
    let p = dir.path().join("ca.pem");
    std::fs::write(&p, format!("{}{}", ca.cert_pem(), leaf.cert_pem())).unwrap();
    let e = read_trust_bundle(&p).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}
