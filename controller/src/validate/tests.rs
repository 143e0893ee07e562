//! The bad-input list of SPEC §6, one test each, plus the happy paths. Every
//! denial test asserts the exact reason: a CSR denied for the wrong reason
//! would hide a missing check. (The parser's never-panics proptests live in
//! `pkcs10/tests.rs`.)

use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, DnType, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384,
    PKCS_ED25519, PKCS_RSA_SHA256, SanType,
};

use kube_ovn_ipsec_api::pki::{PEM_CERTIFICATE, PEM_CERTIFICATE_REQUEST, encode_pem, parse_pem};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use super::*;
use crate::pkcs10::MAX_REQUEST_BYTES;

pub(crate) use crate::fixtures::CHASSIS;
pub(crate) const NODE: &str = "node-1";
pub(crate) const NODE_UID: &str = "0b7c0c55-1111-4c3a-9d6e-000000000001";
const POD: &str = "kube-ovn-cni-abcde";
const POD_UID: &str = "5f0e0c55-2222-4c3a-9d6e-000000000002";
const DS_UID: &str = "7a0e0c55-3333-4c3a-9d6e-000000000003";
const HASH: &str = "6d8f9c7b5";

pub(crate) fn p256() -> &'static KeyPair {
    static K: OnceLock<KeyPair> = OnceLock::new();
    K.get_or_init(|| KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap())
}

pub(crate) fn rsa2048() -> &'static KeyPair {
    static K: OnceLock<KeyPair> = OnceLock::new();
    K.get_or_init(|| KeyPair::generate_for(&PKCS_RSA_SHA256).unwrap())
}

pub(crate) use crate::fixtures::{request, request_with};

/// A CSR, live state and policy that pass; each test breaks one thing.
pub(crate) struct Fx {
    pub(crate) csr: CsrView,
    pub(crate) live: LiveContext,
    pub(crate) policy: Policy,
}

impl Fx {
    pub(crate) fn new() -> Self {
        Self::with_request(request(p256()))
    }

    pub(crate) fn with_request(request: Vec<u8>) -> Self {
        let policy = Policy::default();
        let csr = CsrView {
            name: "ovn-ipsec-0123456789abcdef".into(),
            signer_name: names::SIGNER_NAME.into(),
            username: policy.requester(),
            extra: BTreeMap::from([
                (names::EXTRA_POD_UID.to_owned(), vec![POD_UID.to_owned()]),
                (names::EXTRA_POD_NAME.to_owned(), vec![POD.to_owned()]),
                (names::EXTRA_NODE_NAME.to_owned(), vec![NODE.to_owned()]),
            ]),
            usages: vec!["ipsec tunnel".into()],
            expiration_seconds: Some(7 * 24 * 3600),
            annotations: BTreeMap::from([
                (names::ANNOTATION_NODE.to_owned(), NODE.to_owned()),
                (names::ANNOTATION_NODE_UID.to_owned(), NODE_UID.to_owned()),
                (names::ANNOTATION_CHASSIS.to_owned(), CHASSIS.to_owned()),
                (names::ANNOTATION_GENERATION.to_owned(), "1".to_owned()),
            ]),
            request,
        };
        let live = LiveContext {
            pod: Some(PodView {
                name: POD.into(),
                uid: POD_UID.into(),
                node_name: NODE.into(),
                owner_daemon_set_uid: Some(DS_UID.into()),
                template_hash: Some(HASH.into()),
                terminating: false,
                finished: false,
            }),
            node: Some(NodeView {
                name: NODE.into(),
                uid: NODE_UID.into(),
                chassis: Some(CHASSIS.into()),
            }),
            daemon_set: Some(DaemonSetView {
                uid: DS_UID.into(),
                current_template_hash: Some(HASH.into()),
            }),
        };
        Fx { csr, live, policy }
    }

    fn pod(mut self, f: impl FnOnce(&mut PodView)) -> Self {
        f(self.live.pod.as_mut().unwrap());
        self
    }

    fn node(mut self, f: impl FnOnce(&mut NodeView)) -> Self {
        f(self.live.node.as_mut().unwrap());
        self
    }

    fn csr(mut self, f: impl FnOnce(&mut CsrView)) -> Self {
        f(&mut self.csr);
        self
    }

    pub(crate) fn run(&self) -> Result<ValidatedCsr, Denial> {
        validate(&self.csr, &self.live, &self.policy)
    }

    /// Asserts a denial with `reason` and a message naming a check.
    fn denied(&self, reason: &str) -> Denial {
        let d = self.run().expect_err("must be denied");
        assert_eq!(d.reason(), reason, "denied for another reason: {d}");
        assert!(
            d.to_string().contains("check failed"),
            "message names no check: {d}"
        );
        assert!(!d.to_string().contains("BEGIN"), "message echoes PEM: {d}");
        d
    }
}

#[test]
fn p256_request_from_the_live_cni_pod_passes() {
    let v = Fx::new().run().unwrap();
    assert_eq!(v.chassis, CHASSIS);
    assert_eq!(v.node_name, NODE);
    assert_eq!(v.node_uid, NODE_UID);
    assert_eq!(v.pod_uid, POD_UID);
    assert_eq!(v.key_kind, KeyKind::EcdsaP256);
    assert_eq!(v.lifetime, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(v.public_key, p256().public_key_raw());
}

#[test]
fn rsa2048_request_passes() {
    let v = Fx::with_request(request(rsa2048())).run().unwrap();
    assert_eq!(v.key_kind, KeyKind::Rsa(2048));
}

#[test]
fn rsa3072_and_4096_pass() {
    for size in [rcgen::RsaKeySize::_3072, rcgen::RsaKeySize::_4096] {
        let key = KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, size).unwrap();
        Fx::with_request(request(&key)).run().unwrap();
    }
}

// ---- who asked ----

#[test]
fn requester_other_than_cni_service_account_is_denied() {
    Fx::new()
        .csr(|c| c.username = "system:serviceaccount:kube-system:default".into())
        .denied("RequesterNotCniServiceAccount");
    Fx::new()
        .csr(|c| c.username = "kubernetes-admin".into())
        .denied("RequesterNotCniServiceAccount");
    // Same ServiceAccount name in another namespace is another identity.
    Fx::new()
        .csr(|c| c.username = "system:serviceaccount:default:kube-ovn-cni".into())
        .denied("RequesterNotCniServiceAccount");
}

#[test]
fn request_without_pod_bound_token_is_denied() {
    Fx::new()
        .csr(|c| c.extra.clear())
        .denied("PodBindingMissing");
    Fx::new()
        .csr(|c| {
            c.extra.insert(
                names::EXTRA_POD_UID.into(),
                vec![POD_UID.into(), "other".into()],
            );
        })
        .denied("PodBindingMissing");
}

#[test]
fn token_bound_pod_that_was_deleted_is_denied() {
    let mut fx = Fx::new();
    fx.live.pod = None;
    fx.denied("PodNotLive");
}

#[test]
fn token_bound_pod_uid_of_a_replaced_pod_is_denied() {
    // Same name, new Pod: the token was bound to the old one.
    Fx::new()
        .pod(|p| p.uid = "a-newer-pod-uid".into())
        .denied("PodNotLive");
}

#[test]
fn terminating_or_finished_pod_is_denied() {
    Fx::new().pod(|p| p.terminating = true).denied("PodNotLive");
    Fx::new().pod(|p| p.finished = true).denied("PodNotLive");
}

#[test]
fn pod_on_another_node_is_denied() {
    Fx::new()
        .pod(|p| p.node_name = "node-2".into())
        .denied("PodNodeMismatch");
}

#[test]
fn pod_of_another_daemonset_is_denied() {
    Fx::new()
        .pod(|p| p.owner_daemon_set_uid = Some("other-ds".into()))
        .denied("PodNotOwnedByDaemonSet");
    Fx::new()
        .pod(|p| p.owner_daemon_set_uid = None)
        .denied("PodNotOwnedByDaemonSet");
}

#[test]
fn pod_with_an_old_template_is_denied() {
    Fx::new()
        .pod(|p| p.template_hash = Some("oldhash".into()))
        .denied("PodTemplateOutdated");
    Fx::new()
        .pod(|p| p.template_hash = None)
        .denied("PodTemplateOutdated");
}

#[test]
fn missing_daemonset_or_revision_is_denied() {
    let mut fx = Fx::new();
    fx.live.daemon_set = None;
    fx.denied("DaemonSetMissing");
    let mut fx = Fx::new();
    fx.live.daemon_set.as_mut().unwrap().current_template_hash = None;
    fx.denied("DaemonSetMissing");
}

// ---- which node ----

#[test]
fn request_name_matching_but_binding_wrong_is_denied() {
    // Name and annotations say node-1; the token was issued to a Pod on
    // node-2 (the live Pod agrees with the token). The name proves nothing.
    Fx::new()
        .csr(|c| {
            c.extra
                .insert(names::EXTRA_NODE_NAME.into(), vec!["node-2".into()]);
        })
        .pod(|p| p.node_name = "node-2".into())
        .denied("NodeBindingMismatch");
}

#[test]
fn wrong_node_uid_is_denied() {
    // The Node was deleted and re-created under the same name.
    Fx::new()
        .node(|n| n.uid = "a-new-node-uid".into())
        .denied("NodeUIDMismatch");
}

#[test]
fn token_bound_node_uid_of_a_recreated_node_is_denied() {
    Fx::new()
        .csr(|c| {
            c.extra
                .insert(names::EXTRA_NODE_UID.into(), vec!["old-node-uid".into()]);
        })
        .denied("NodeUIDMismatch");
}

#[test]
fn missing_node_is_denied() {
    let mut fx = Fx::new();
    fx.live.node = None;
    fx.denied("NodeNotFound");
}

#[test]
fn missing_annotations_are_denied() {
    for key in [
        names::ANNOTATION_NODE,
        names::ANNOTATION_NODE_UID,
        names::ANNOTATION_CHASSIS,
    ] {
        let d = Fx::new().csr(|c| {
            c.annotations.remove(key);
        });
        assert_eq!(
            d.denied("AnnotationMissing"),
            Denial::AnnotationMissing { key }
        );
    }
}

#[test]
fn chassis_annotation_differing_from_the_node_is_denied() {
    Fx::new()
        .node(|n| n.chassis = Some("chassis-2".into()))
        .denied("ChassisMismatch");
    Fx::new()
        .node(|n| n.chassis = None)
        .denied("ChassisMismatch");
}

#[test]
fn invalid_chassis_is_denied() {
    Fx::new()
        .csr(|c| {
            c.annotations
                .insert(names::ANNOTATION_CHASSIS.into(), "evil chassis\n".into());
        })
        .denied("InvalidChassis");
}

// ---- what was asked ----

#[test]
fn cn_of_another_chassis_is_denied() {
    let req = request_with(p256(), |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::OrganizationName, "kube-ovn");
        p.distinguished_name.push(DnType::CommonName, "chassis-2");
    });
    Fx::with_request(req).denied("SubjectMismatch");
}

#[test]
fn subject_with_extra_or_missing_attributes_is_denied() {
    let req = request_with(p256(), |p| {
        p.distinguished_name
            .push(DnType::OrganizationalUnitName, "x")
    });
    Fx::with_request(req).denied("SubjectMismatch");
    let req = request_with(p256(), |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, CHASSIS);
    });
    Fx::with_request(req).denied("SubjectMismatch");
    let req = request_with(p256(), |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        p.distinguished_name.push(DnType::CommonName, CHASSIS);
    });
    Fx::with_request(req).denied("SubjectMismatch");
}

#[test]
fn extra_dns_san_is_denied() {
    let req = request_with(p256(), |p| {
        p.subject_alt_names
            .push(SanType::DnsName("chassis-2".try_into().unwrap()));
    });
    Fx::with_request(req).denied("SubjectAltNameMismatch");
}

#[test]
fn ip_san_is_denied() {
    let req = request_with(p256(), |p| {
        p.subject_alt_names
            .push(SanType::IpAddress("10.0.0.1".parse().unwrap()));
    });
    Fx::with_request(req).denied("SubjectAltNameMismatch");
}

#[test]
fn uri_and_email_sans_and_no_san_are_denied() {
    let req = request_with(p256(), |p| {
        p.subject_alt_names
            .push(SanType::URI("spiffe://x/y".try_into().unwrap()));
    });
    Fx::with_request(req).denied("SubjectAltNameMismatch");
    let req = request_with(p256(), |p| {
        p.subject_alt_names
            .push(SanType::Rfc822Name("a@b.c".try_into().unwrap()));
    });
    Fx::with_request(req).denied("SubjectAltNameMismatch");
    let req = request_with(p256(), |p| p.subject_alt_names.clear());
    Fx::with_request(req).denied("SubjectAltNameMismatch");
}

#[test]
fn ca_true_is_denied() {
    let req = request_with(p256(), |p| {
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained)
    });
    Fx::with_request(req).denied("CARequested");
    let req = request_with(p256(), |p| {
        p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign]
    });
    Fx::with_request(req).denied("CARequested");
}

#[test]
fn explicit_ca_false_and_ipsec_eku_are_accepted() {
    let req = request_with(p256(), |p| {
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::Other(vec![
            1, 3, 6, 1, 5, 5, 7, 3, 6,
        ])];
    });
    Fx::with_request(req).run().unwrap();
}

#[test]
fn server_auth_eku_in_the_request_is_denied() {
    let req = request_with(p256(), |p| {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    });
    Fx::with_request(req).denied("UnexpectedExtension");
}

#[test]
fn rsa_1024_is_denied() {
    // rcgen cannot make RSA-1024 keys; openssl made this one (CN=chassis-1).
    Fx::with_request(include_bytes!("testdata/rsa1024.csr").to_vec()).denied("KeySizeNotAllowed");
}

#[test]
fn sha1_signature_is_denied() {
    Fx::with_request(include_bytes!("testdata/rsa2048-sha1.csr").to_vec())
        .denied("SignatureAlgorithmNotAllowed");
}

#[test]
fn unknown_key_types_are_denied() {
    let ed = KeyPair::generate_for(&PKCS_ED25519).unwrap();
    Fx::with_request(request(&ed)).denied("UnsupportedKeyType");
    let p384 = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).unwrap();
    Fx::with_request(request(&p384)).denied("UnsupportedKeyType");
}

#[test]
fn garbage_pem_is_denied() {
    for garbage in [
        b"".to_vec(),
        b"hello".to_vec(),
        b"-----BEGIN CERTIFICATE REQUEST-----\nnot base64!\n-----END CERTIFICATE REQUEST-----\n"
            .to_vec(),
        encode_pem(PEM_CERTIFICATE_REQUEST, &[0x30, 0x03, 1, 2, 3]).into_bytes(),
        encode_pem(PEM_CERTIFICATE, &[0x30, 0x00]).into_bytes(),
        vec![0xff; MAX_REQUEST_BYTES + 1],
    ] {
        Fx::with_request(garbage).denied("MalformedRequest");
    }
    // Two requests in one: which would be signed?
    let mut two = request(p256());
    two.extend(request(p256()));
    Fx::with_request(two).denied("MalformedRequest");
}

#[test]
fn csr_whose_signature_does_not_verify_is_denied() {
    let pem_text = String::from_utf8(request(p256())).unwrap();
    let mut der = der_of(pem_text.as_bytes());
    let last = der.len() - 3;
    der[last] ^= 0x01;
    let tampered = encode_pem(PEM_CERTIFICATE_REQUEST, &der).into_bytes();
    Fx::with_request(tampered).denied("SignatureInvalid");
}

#[test]
fn request_signed_by_another_key_is_denied() {
    // Subject and key of one request, signature from another key: splice
    // the signature of a second request onto the first's info.
    let a = der_of(&request(p256()));
    let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let b = der_of(&request(&other));
    let (_, ca) = X509CertificationRequest::from_der(&a).unwrap();
    let (_, cb) = X509CertificationRequest::from_der(&b).unwrap();
    let info_a = ca.certification_request_info.raw;
    let tail_b = &b[cb.certification_request_info.raw.as_ptr() as usize - b.as_ptr() as usize
        + cb.certification_request_info.raw.len()..];
    let body: Vec<u8> = [info_a, tail_b].concat();
    let der = der_sequence(&body);
    let spliced = encode_pem(PEM_CERTIFICATE_REQUEST, &der).into_bytes();
    Fx::with_request(spliced).denied("SignatureInvalid");
}

/// The DER of a one-request PEM.
pub(crate) fn der_of(pem: &[u8]) -> Vec<u8> {
    parse_pem(pem, PEM_CERTIFICATE_REQUEST).unwrap().remove(0)
}

fn der_sequence(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0x30];
    let len = body.len();
    if len < 128 {
        out.push(len as u8);
    } else if len < 256 {
        out.extend([0x81, len as u8]);
    } else {
        out.extend([0x82, (len >> 8) as u8, len as u8]);
    }
    out.extend_from_slice(body);
    out
}

// ---- how ----

#[test]
fn usages_with_server_auth_are_denied() {
    Fx::new()
        .csr(|c| c.usages = vec!["ipsec tunnel".into(), "server auth".into()])
        .denied("UsagesNotAllowed");
    Fx::new()
        .csr(|c| c.usages = vec!["server auth".into()])
        .denied("UsagesNotAllowed");
    Fx::new()
        .csr(|c| c.usages.clear())
        .denied("UsagesNotAllowed");
}

#[test]
fn lifetime_over_the_maximum_is_denied() {
    Fx::new()
        .csr(|c| c.expiration_seconds = Some(31 * 24 * 3600))
        .denied("LifetimeOutOfBounds");
}

#[test]
fn lifetime_missing_or_too_short_is_denied() {
    Fx::new()
        .csr(|c| c.expiration_seconds = None)
        .denied("LifetimeOutOfBounds");
    Fx::new()
        .csr(|c| c.expiration_seconds = Some(600))
        .denied("LifetimeOutOfBounds");
    Fx::new()
        .csr(|c| c.expiration_seconds = Some(-1))
        .denied("LifetimeOutOfBounds");
}

#[test]
fn other_signer_is_never_validated_as_ours() {
    Fx::new()
        .csr(|c| c.signer_name = "kubernetes.io/kube-apiserver-client".into())
        .denied("WrongSigner");
}

#[test]
fn every_reason_is_listed_once() {
    let mut seen = std::collections::BTreeSet::new();
    for r in Denial::ALL_REASONS {
        assert!(seen.insert(*r), "duplicate reason {r}");
    }
}
