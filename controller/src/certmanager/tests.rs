//! cert-manager mode against an in-test stand-in: one that issues honestly,
//! and ones that return a wrong chain, a wrong lifetime, a foreign issuer or
//! a foreign requester; and a CertificateRequest someone else created.

use std::sync::Mutex;
use std::time::Duration;

use kube_ovn_ipsec_api::pki::{PEM_CERTIFICATE, parse_pem};
use kube_ovn_ipsec_api::test_util::{CaSpec, TestCa};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256};

use super::*;
use crate::validate::tests::{Fx, request, rsa2048};
use kube_ovn_ipsec_api::clock::{Clock, SystemClock};

const NS: &str = "kube-system";
const ISSUER: &str = "kube-ovn-ipsec";
const ME: &str = "system:serviceaccount:kube-system:ovn";

/// A CA the stand-in issues from: an external issuer's (`CN` only).
fn test_ca(cn: &str) -> TestCa {
    CaSpec::new(cn).without_organization().self_signed()
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Honest,
    WrongChain,
    TooLong,
    ForeignIssuer,
    ForeignRequester,
    NeverIssues,
}

/// cert-manager stand-in: a webhook (stamps the requester) and a CA issuer.
struct StandIn {
    mode: Mode,
    ca: TestCa,
    other_ca: TestCa,
    store: Mutex<HashMap<String, CertificateRequestView>>,
    deleted: Mutex<Vec<String>>,
    next_uid: Mutex<u32>,
}

impl StandIn {
    fn new(mode: Mode) -> Self {
        Self {
            mode,
            ca: test_ca("issuer CA"),
            other_ca: test_ca("someone else's CA"),
            store: Mutex::default(),
            deleted: Mutex::default(),
            next_uid: Mutex::new(0),
        }
    }

    fn trust(&self) -> TrustBundle {
        self.ca.trust_bundle()
    }

    fn issue(&self, cr: &mut CertificateRequestView, lifetime: Duration) {
        let now = time::OffsetDateTime::now_utc();
        let lifetime = if self.mode == Mode::TooLong {
            lifetime * 10
        } else {
            lifetime
        };
        let issuer = if self.mode == Mode::WrongChain {
            &self.other_ca
        } else {
            &self.ca
        };
        let pem = issuer
            .sign_request(std::str::from_utf8(&cr.request).unwrap())
            .tweak(|p| {
                p.not_before = now;
                p.not_after = now + lifetime;
            })
            .pem();
        cr.certificate = Some(pem.into_bytes());
        cr.ready = Some(true);
    }
}

impl CertificateRequestApi for StandIn {
    async fn create(&self, new: &NewCertificateRequest) -> Result<CertificateRequestView> {
        let mut uid = self.next_uid.lock().unwrap();
        *uid += 1;
        let view = CertificateRequestView {
            name: new.name.clone(),
            namespace: new.namespace.clone(),
            uid: format!("cr-uid-{uid}"),
            csr_uid_label: Some(new.csr_uid.clone()),
            issuer_name: if self.mode == Mode::ForeignIssuer {
                "letsencrypt".into()
            } else {
                new.issuer_name.clone()
            },
            issuer_kind: "ClusterIssuer".into(),
            issuer_group: GROUP.into(),
            username: if self.mode == Mode::ForeignRequester {
                "system:serviceaccount:kube-system:kube-ovn-cni".into()
            } else {
                ME.into()
            },
            usages: vec!["ipsec tunnel".into()],
            request: new.request.clone(),
            certificate: None,
            ready: Some(false),
            ready_reason: Some("Pending".into()),
        };
        self.store
            .lock()
            .unwrap()
            .insert(new.name.clone(), view.clone());
        Ok(view)
    }

    async fn get(&self, name: &str) -> Result<Option<CertificateRequestView>> {
        Ok(self.store.lock().unwrap().get(name).cloned())
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.store.lock().unwrap().remove(name);
        self.deleted.lock().unwrap().push(name.to_owned());
        Ok(())
    }

    async fn approve(&self, name: &str) -> Result<()> {
        if self.mode == Mode::NeverIssues {
            return Ok(());
        }
        let mut store = self.store.lock().unwrap();
        let cr = store.get_mut(name).unwrap();
        self.issue(cr, Duration::from_secs(7 * 86400));
        Ok(())
    }
}

fn config() -> CertManagerConfig {
    CertManagerConfig {
        namespace: NS.into(),
        issuer_name: ISSUER.into(),
        requester: ME.into(),
    }
}

async fn forward(mode: Mode, fx: &Fx) -> (Result<Forwarded>, StandIn) {
    let stand_in = StandIn::new(mode);
    let trust = stand_in.trust();
    let fwd = CertManagerForwarder::new(stand_in, config());
    let v = fx.run().unwrap();
    let out = fwd
        .forward(
            "ovn-ipsec-abc",
            "csr-uid-1",
            &fx.csr.request,
            &v,
            &trust,
            SystemClock.now(),
        )
        .await;
    (out, fwd.api)
}

fn rejected(out: Result<Forwarded>) -> Rejection {
    match out {
        Err(Error::CertManagerRejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn honest_issuer_result_is_accepted_for_p256_and_rsa() {
    for fx in [Fx::new(), Fx::with_request(request(rsa2048()))] {
        let (out, stand_in) = forward(Mode::Honest, &fx).await;
        let Forwarded::Issued(pem) = out.unwrap() else {
            panic!("not issued")
        };
        let der = parse_pem(pem.as_bytes(), PEM_CERTIFICATE)
            .unwrap()
            .remove(0);
        let leaf = kube_ovn_ipsec_api::pki::Certificate::from_der(&der).unwrap();
        let now = kube_ovn_ipsec_api::clock::timestamp(SystemClock.now()).unwrap();
        assert!(stand_in.trust().verify_leaf(&leaf, now).is_ok());
    }
}

#[tokio::test]
async fn wrong_chain_is_rejected() {
    let (out, _) = forward(Mode::WrongChain, &Fx::new()).await;
    assert_eq!(rejected(out).reason(), "CertManagerChainUntrusted");
}

#[tokio::test]
async fn wrong_lifetime_is_rejected() {
    let (out, _) = forward(Mode::TooLong, &Fx::new()).await;
    assert_eq!(rejected(out).reason(), "CertManagerLifetime");
}

#[tokio::test]
async fn foreign_issuer_is_rejected() {
    let (out, _) = forward(Mode::ForeignIssuer, &Fx::new()).await;
    assert_eq!(rejected(out).reason(), "CertManagerIssuer");
}

#[tokio::test]
async fn foreign_requester_is_rejected() {
    let (out, _) = forward(Mode::ForeignRequester, &Fx::new()).await;
    assert_eq!(rejected(out).reason(), "CertManagerRequester");
}

#[tokio::test]
async fn not_yet_issued_is_pending() {
    let (out, _) = forward(Mode::NeverIssues, &Fx::new()).await;
    assert!(matches!(out.unwrap(), Forwarded::Pending(_)));
}

#[tokio::test]
async fn request_someone_else_created_and_approved_is_replaced_not_read() {
    let fx = Fx::new();
    let v = fx.run().unwrap();
    let stand_in = StandIn::new(Mode::Honest);
    let trust = stand_in.trust();
    // Someone pre-creates the request under the controller's name, gets it
    // approved and issued by the real issuer — for the same CSR bytes.
    let planted = NewCertificateRequest {
        name: "ovn-ipsec-abc".into(),
        namespace: NS.into(),
        csr_uid: "csr-uid-1".into(),
        issuer_name: ISSUER.into(),
        request: fx.csr.request.clone(),
        duration: v.lifetime,
    };
    stand_in.create(&planted).await.unwrap();
    stand_in.approve("ovn-ipsec-abc").await.unwrap();
    let planted_cert = stand_in
        .get("ovn-ipsec-abc")
        .await
        .unwrap()
        .unwrap()
        .certificate;
    let fwd = CertManagerForwarder::new(stand_in, config());
    let out = fwd
        .forward(
            "ovn-ipsec-abc",
            "csr-uid-1",
            &fx.csr.request,
            &v,
            &trust,
            SystemClock.now(),
        )
        .await
        .unwrap();
    assert_eq!(
        *fwd.api.deleted.lock().unwrap(),
        vec!["ovn-ipsec-abc".to_owned()]
    );
    let Forwarded::Issued(pem) = out else {
        panic!("not issued")
    };
    assert_ne!(
        Some(pem.into_bytes()),
        planted_cert,
        "the planted certificate was copied"
    );
}

#[test]
fn pure_checks_reject_key_and_name_substitution_and_ca_results() {
    let ca = test_ca("issuer CA");
    let trust = ca.trust_bundle();
    let fx = Fx::new();
    let v = fx.run().unwrap();
    let cfg = config();
    let expected = Expected {
        config: &cfg,
        created_uid: "u",
        csr_uid: "c",
        request: &fx.csr.request,
        csr: &v,
    };
    let base = CertificateRequestView {
        name: "n".into(),
        namespace: NS.into(),
        uid: "u".into(),
        csr_uid_label: Some("c".into()),
        issuer_name: ISSUER.into(),
        issuer_kind: "ClusterIssuer".into(),
        issuer_group: GROUP.into(),
        username: ME.into(),
        usages: vec!["ipsec tunnel".into()],
        request: fx.csr.request.clone(),
        ..Default::default()
    };
    let issue = |tweak: &dyn Fn(&mut CertificateParams), key: Option<&KeyPair>| {
        let req = request(key.unwrap_or(crate::validate::tests::p256()));
        let now = time::OffsetDateTime::now_utc();
        let pem = ca
            .sign_request(std::str::from_utf8(&req).unwrap())
            .tweak(|p| {
                p.not_before = now;
                p.not_after = now + Duration::from_secs(86400);
                tweak(p);
            })
            .pem();
        let mut cr = base.clone();
        cr.certificate = Some(pem.into_bytes());
        cr.ready = Some(true);
        check_issued(&cr, expected, &trust, SystemClock.now())
    };
    issue(&|_| {}, None).unwrap();
    let other = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    assert_eq!(
        issue(&|_| {}, Some(&other)).unwrap_err().reason(),
        "CertManagerKeyMismatch"
    );
    assert_eq!(
        issue(
            &|p| p
                .subject_alt_names
                .push(rcgen::SanType::DnsName("x".try_into().unwrap())),
            None
        )
        .unwrap_err()
        .reason(),
        "CertManagerNames"
    );
    assert_eq!(
        issue(
            &|p| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained),
            None
        )
        .unwrap_err()
        .reason(),
        "CertManagerIsCA"
    );
    let mut wrong_ns = base.clone();
    wrong_ns.namespace = "default".into();
    assert_eq!(
        check_ownership(&wrong_ns, expected).unwrap_err().reason(),
        "CertManagerNamespace"
    );
    let mut usages = base.clone();
    usages.usages.push("server auth".into());
    assert_eq!(
        check_ownership(&usages, expected).unwrap_err().reason(),
        "CertManagerUsages"
    );
    let mut other_uid = base.clone();
    other_uid.uid = "someone-elses".into();
    assert_eq!(
        check_ownership(&other_uid, expected).unwrap_err().reason(),
        "CertManagerRequestNotOurs"
    );
}

#[test]
fn new_request_json_names_the_cluster_issuer() {
    let j = NewCertificateRequest {
        name: "n".into(),
        namespace: NS.into(),
        csr_uid: "c".into(),
        issuer_name: ISSUER.into(),
        request: b"pem".to_vec(),
        duration: Duration::from_secs(3600),
    }
    .to_json();
    assert_eq!(j["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    assert_eq!(j["spec"]["duration"], "3600s");
    assert_eq!(j["spec"]["usages"][0], "ipsec tunnel");
    let obj: kube::api::DynamicObject = serde_json::from_value(j).unwrap();
    let v = view_from_dynamic(&obj);
    assert_eq!(v.request, b"pem");
    assert_eq!(v.csr_uid_label.as_deref(), Some("c"));
}
