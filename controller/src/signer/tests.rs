use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::ident::Chassis;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::time::Timestamp;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::*;
use crate::validate::tests::{CHASSIS, Fx, request, rsa2048};

/// A bundle of these CA certificates (DER), in order.
fn bundle_of(ders: &[&[u8]]) -> TrustBundle {
    TrustBundle::from_certificates(
        ders.iter()
            .map(|d| Certificate::from_der(d).unwrap())
            .collect(),
    )
    .unwrap()
}

/// Whether the leaf (DER) chains to `bundle` at `at`.
fn verifies(bundle: &TrustBundle, leaf_der: &[u8], at: SystemTime) -> bool {
    bundle
        .verify_leaf(&Certificate::from_der(leaf_der).unwrap(), ts(at))
        .is_ok()
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000)
}

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate(
        CaKeyAlgorithm::EcdsaP256,
        Duration::from_secs(3650 * 86400),
        now(),
    )
    .unwrap()
}

fn ts(t: SystemTime) -> Timestamp {
    Timestamp::from_unix(unix_seconds(t)).unwrap()
}

#[test]
fn p256_leaf_has_the_spec_profile_and_verifies_with_the_agents_checks() {
    let ca = ca();
    let v = Fx::new().run().unwrap();
    let der = ca.sign(&v, now()).unwrap();
    // The agent's own checks (api crate) accept it.
    let leaf = Certificate::from_der(&der).unwrap();
    leaf.check_chassis_identity(&Chassis::new(CHASSIS).unwrap())
        .unwrap();
    let bundle = TrustBundle::from_pem(ca.cert_pem().as_bytes()).unwrap();
    bundle.verify_leaf(&leaf, ts(now())).unwrap();
    assert_eq!(leaf.not_before().unix(), unix_seconds(now()) - 300);
    assert_eq!(leaf.not_after().unix(), unix_seconds(now()) + 7 * 86400);

    let (_, x) = X509Certificate::from_der(&der).unwrap();
    let ku = x.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && !ku.key_encipherment() && !ku.key_cert_sign());
    let eku = x.extended_key_usage().unwrap().unwrap().value;
    assert_eq!(eku.other.len(), 1);
    assert_eq!(eku.other[0].to_id_string(), "1.3.6.1.5.5.7.3.6");
    assert!(!eku.server_auth && !eku.client_auth);
    assert!(!x.is_ca());
    assert!(
        x.basic_constraints().unwrap().is_some(),
        "explicit CA:FALSE"
    );
    assert_eq!(x.public_key().raw, v.spki_der.as_slice());
}

#[test]
fn rsa_leaf_also_has_key_encipherment() {
    let ca = ca();
    let v = Fx::with_request(request(rsa2048())).run().unwrap();
    let der = ca.sign(&v, now()).unwrap();
    let (_, x) = X509Certificate::from_der(&der).unwrap();
    let ku = x.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment());
    assert_eq!(x.public_key().raw, v.spki_der.as_slice());
    assert!(verifies(&bundle_of(&[ca.cert_der()]), &der, now()));
}

#[test]
fn leaf_never_outlives_its_ca() {
    let ca = CertificateAuthority::generate(
        CaKeyAlgorithm::EcdsaP256,
        Duration::from_secs(86400),
        now(),
    )
    .unwrap();
    let v = Fx::new().run().unwrap();
    let leaf = Certificate::from_der(&ca.sign(&v, now()).unwrap()).unwrap();
    assert_eq!(leaf.not_after().unix(), ca.not_after_unix());
}

#[test]
fn serials_are_unique() {
    let ca = ca();
    let v = Fx::new().run().unwrap();
    let a = X509Certificate::from_der(&ca.sign(&v, now()).unwrap())
        .unwrap()
        .1
        .serial
        .clone();
    let b = X509Certificate::from_der(&ca.sign(&v, now()).unwrap())
        .unwrap()
        .1
        .serial
        .clone();
    assert_ne!(a, b);
}

#[test]
fn ca_round_trips_through_pem_and_rejects_a_foreign_key() {
    let a = ca();
    let b = ca();
    let again = CertificateAuthority::from_pem(&a.cert_pem(), &a.key_pem()).unwrap();
    assert_eq!(again.cert_der(), a.cert_der());
    let err = CertificateAuthority::from_pem(&a.cert_pem(), &b.key_pem()).unwrap_err();
    assert_eq!(err.metric_label(), "ca_secret_invalid");
    assert!(!format!("{a:?}").contains("PRIVATE"));
}

#[test]
fn rsa_ca_signs_too() {
    let ca = CertificateAuthority::generate(
        CaKeyAlgorithm::Rsa3072,
        Duration::from_secs(86400 * 365),
        now(),
    )
    .unwrap();
    let v = Fx::new().run().unwrap();
    let der = ca.sign(&v, now()).unwrap();
    assert!(verifies(&bundle_of(&[ca.cert_der()]), &der, now()));
}

#[test]
fn rotation_bundle_verifies_leaves_of_both_cas_and_retire_needs_the_acknowledged_digest() {
    let old = ca();
    let new = ca();
    let v = Fx::new().run().unwrap();
    let mut bundle = bundle_of(&[old.cert_der()]);
    assert!(bundle.add(new.certificate().clone()).unwrap());
    assert!(!bundle.add(new.certificate().clone()).unwrap());
    for ca in [&old, &new] {
        assert!(verifies(&bundle, &ca.sign(&v, now()).unwrap(), now()));
    }
    let parsed = TrustBundle::from_pem(bundle.to_pem().as_bytes()).unwrap();
    assert_eq!(parsed.digest(), bundle.digest());
    assert_eq!(
        bundle.digest().to_hex(),
        TrustBundle::from_pem(bundle.to_pem().as_bytes())
            .unwrap()
            .digest()
            .to_hex()
    );

    let old_digest = bundle_of(&[old.cert_der()]).digest().to_hex();
    let refused = crate::ca::plan_retire(&bundle, new.cert_der(), &old_digest).unwrap_err();
    assert_eq!(refused.metric_label(), "rotation_refused");
    let retired =
        crate::ca::plan_retire(&bundle, new.cert_der(), &bundle.digest().to_hex()).unwrap();
    assert_eq!(
        retired.certificates(),
        std::slice::from_ref(new.certificate())
    );
    assert!(!verifies(&retired, &old.sign(&v, now()).unwrap(), now()));
    assert!(crate::ca::plan_retire(&retired, new.cert_der(), &retired.digest().to_hex()).is_err());
}
