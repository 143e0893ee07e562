//! Test fixtures (feature `test-util`): a throw-away CA and chassis leaves,
//! RSA-2048 and P-256, built with rcgen.
//!
//! RSA key generation is slow in debug builds, so the shared fixtures are
//! generated once per test process ([`rsa_ca`], [`rsa_leaf`], ...) and
//! reused; mint new ones with [`TestCa::new`] / [`TestCa::issue`] only when a
//! test needs a distinct key.
//!
//! ```ignore
//! let leaf = test_util::rsa_leaf();
//! let receipt_annotation = signed::sign(&receipt, &leaf.signing_key())?;
//! let trust = test_util::rsa_ca().trust_bundle();
//! trust.verify_leaf(&leaf.certificate, now)?;
//! ```
//!
//! Panics on failure: this is test code, and a panic there is a test failure
//! with a backtrace.
#![allow(clippy::expect_used)]

use std::sync::OnceLock;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};

use crate::ident::Chassis;
use crate::names::k8s::SUBJECT_ORGANIZATION;
use crate::pki::{Certificate, PEM_PRIVATE_KEY, TrustBundle, encode_pem};
use crate::signed::SigningKey;
use crate::time::Timestamp;

/// Key type of a fixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKeyAlg {
    /// RSA-2048 (the default identity key).
    Rsa2048,
    /// ECDSA P-256.
    P256,
}

impl TestKeyAlg {
    fn generate(self) -> KeyPair {
        let alg = match self {
            TestKeyAlg::Rsa2048 => &rcgen::PKCS_RSA_SHA256,
            TestKeyAlg::P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        };
        KeyPair::generate_for(alg).expect("generate test key")
    }
}

/// Sets rcgen's validity from our timestamps without naming the `time`
/// crate's type (rcgen does not re-export it).
fn set_validity(params: &mut CertificateParams, not_before: Timestamp, not_after: Timestamp) {
    let secs = |t: Timestamp| Duration::from_secs(u64::try_from(t.unix()).expect("post-1970"));
    params.not_before = date_time_ymd(1970, 1, 1) + secs(not_before);
    params.not_after = date_time_ymd(1970, 1, 1) + secs(not_after);
}

/// A test CA: key, rcgen parameters and the parsed certificate.
pub struct TestCa {
    key: KeyPair,
    params: CertificateParams,
    /// The CA certificate.
    pub certificate: Certificate,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new self-signed CA named `CN=<cn>`, valid 1975..4096 (rcgen's
    /// default, so fixtures never expire under a test).
    pub fn new(alg: TestKeyAlg, cn: &str) -> Self {
        let key = alg.generate();
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, SUBJECT_ORGANIZATION);
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("self-sign CA");
        let certificate = Certificate::from_der(cert.der()).expect("parse CA");
        TestCa {
            key,
            params,
            certificate,
        }
    }

    /// A bundle holding just this CA.
    pub fn trust_bundle(&self) -> TrustBundle {
        TrustBundle::from_certificates(vec![self.certificate.clone()]).expect("bundle")
    }

    /// The CA's PKCS#8 private key (e.g. to seed a fake `ovn-ipsec-ca`
    /// Secret in controller tests).
    pub fn key_pkcs8_der(&self) -> Vec<u8> {
        self.key.serialize_der()
    }

    /// Issues a chassis leaf (`O=kube-ovn, CN=<chassis>`, SAN
    /// `DNS:<chassis>`) with a fresh key, valid 1975..4096.
    pub fn issue(&self, chassis: &str, alg: TestKeyAlg) -> TestLeaf {
        self.issue_with(chassis, alg.generate(), None)
    }

    /// Like [`TestCa::issue`] with an explicit validity window (for expiry
    /// and renewal tests).
    pub fn issue_with_validity(
        &self,
        chassis: &str,
        alg: TestKeyAlg,
        not_before: Timestamp,
        not_after: Timestamp,
    ) -> TestLeaf {
        self.issue_with(chassis, alg.generate(), Some((not_before, not_after)))
    }

    /// Issues a leaf for an existing PKCS#8 key (reuse a slow RSA key for
    /// a second certificate, e.g. a renewal).
    pub fn issue_for_key(
        &self,
        chassis: &str,
        key_pkcs8_der: &[u8],
        validity: Option<(Timestamp, Timestamp)>,
    ) -> TestLeaf {
        let key = KeyPair::try_from(key_pkcs8_der).expect("load PKCS#8");
        self.issue_with(chassis, key, validity)
    }

    fn issue_with(
        &self,
        chassis: &str,
        key: KeyPair,
        validity: Option<(Timestamp, Timestamp)>,
    ) -> TestLeaf {
        let chassis = Chassis::new(chassis).expect("valid chassis");
        let mut params =
            CertificateParams::new(vec![chassis.as_str().to_owned()]).expect("leaf params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, SUBJECT_ORGANIZATION);
        dn.push(DnType::CommonName, chassis.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if key.algorithm() == &rcgen::PKCS_RSA_SHA256 {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        if let Some((nb, na)) = validity {
            set_validity(&mut params, nb, na);
        }
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        TestLeaf {
            chassis,
            certificate: Certificate::from_der(cert.der()).expect("parse leaf"),
            key_pkcs8_der: key.serialize_der(),
        }
    }
}

/// A chassis leaf with its private key.
#[derive(Clone)]
pub struct TestLeaf {
    /// The chassis the leaf names.
    pub chassis: Chassis,
    /// The leaf certificate.
    pub certificate: Certificate,
    /// The PKCS#8 private key (test fixture: not secret).
    pub key_pkcs8_der: Vec<u8>,
}

impl std::fmt::Debug for TestLeaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestLeaf")
            .field("chassis", &self.chassis)
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

impl TestLeaf {
    /// The private key as a [`SigningKey`].
    pub fn signing_key(&self) -> SigningKey {
        SigningKey::from_pkcs8_der(&self.key_pkcs8_der).expect("fixture key loads")
    }

    /// The private key as PEM `PRIVATE KEY`.
    pub fn key_pem(&self) -> String {
        encode_pem(PEM_PRIVATE_KEY, &self.key_pkcs8_der)
    }

    /// The certificate as PEM.
    pub fn cert_pem(&self) -> String {
        self.certificate.to_pem()
    }
}

macro_rules! shared {
    ($(#[$doc:meta])* $name:ident: $t:ty = $init:expr) => {
        $(#[$doc])*
        pub fn $name() -> &'static $t {
            static CELL: OnceLock<$t> = OnceLock::new();
            CELL.get_or_init(|| $init)
        }
    };
}

shared!(
    /// Shared RSA-2048 CA (`CN=kube-ovn IPsec test CA (RSA)`).
    rsa_ca: TestCa = TestCa::new(TestKeyAlg::Rsa2048, "kube-ovn IPsec test CA (RSA)")
);
shared!(
    /// Shared P-256 CA (`CN=kube-ovn IPsec test CA (P-256)`).
    p256_ca: TestCa = TestCa::new(TestKeyAlg::P256, "kube-ovn IPsec test CA (P-256)")
);
shared!(
    /// Shared RSA-2048 leaf for chassis `chassis-rsa-a`, issued by [`rsa_ca`].
    rsa_leaf: TestLeaf = rsa_ca().issue("chassis-rsa-a", TestKeyAlg::Rsa2048)
);
shared!(
    /// A second RSA-2048 leaf (`chassis-rsa-b`, distinct key), by [`rsa_ca`].
    rsa_leaf_b: TestLeaf = rsa_ca().issue("chassis-rsa-b", TestKeyAlg::Rsa2048)
);
shared!(
    /// Shared P-256 leaf for chassis `chassis-p256-a`, issued by [`p256_ca`].
    p256_leaf: TestLeaf = p256_ca().issue("chassis-p256-a", TestKeyAlg::P256)
);
shared!(
    /// A second P-256 leaf (`chassis-p256-b`, distinct key), by [`p256_ca`].
    p256_leaf_b: TestLeaf = p256_ca().issue("chassis-p256-b", TestKeyAlg::P256)
);
