//! Test fixtures (feature `test-util`): the one test CA of the workspace and
//! chassis leaves, RSA-2048 and P-256, built with rcgen. The agent, the
//! controller, the benches and `testbed` all mint their test PKI here.
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
//!
//! // Fluent forms: a chain through an intermediate, a leaf with a lifetime,
//! // a CSR signed the way a (possibly misbehaving) signer would.
//! let root = TestCa::p256("root");
//! let inter = CaSpec::new("intermediate").issued_by(&root);
//! let leaf = inter.leaf("chassis-a").key(TestKeyAlg::P256).valid(nb, na).issue();
//! let pem = root.sign_request(&csr_pem).issued_at(now, lifetime).pem();
//! ```
//!
//! Panics on failure: this is test code, and a panic there is a test failure
//! with a backtrace.
#![allow(clippy::expect_used)]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, CustomExtension,
    DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, date_time_ymd,
};

use crate::clock::unix_seconds;
use crate::ident::Chassis;
use crate::names::k8s::SUBJECT_ORGANIZATION;
use crate::pki::{Certificate, LEAF_BACKDATE, PEM_PRIVATE_KEY, TrustBundle, encode_pem};
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
    /// A fresh key of this type.
    pub fn generate(self) -> KeyPair {
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
    let at = |t: Timestamp| {
        let epoch = date_time_ymd(1970, 1, 1);
        let secs = t.unix();
        match u64::try_from(secs) {
            Ok(s) => epoch + Duration::from_secs(s),
            Err(_) => epoch - Duration::from_secs(secs.unsigned_abs()),
        }
    };
    params.not_before = at(not_before);
    params.not_after = at(not_after);
}

/// `[now - LEAF_BACKDATE, now + lifetime]`: the window the project's signer
/// gives a leaf.
fn issued_window(now: SystemTime, lifetime: Duration) -> (Timestamp, Timestamp) {
    let now = unix_seconds(now);
    let back = i64::try_from(LEAF_BACKDATE.as_secs()).expect("small");
    let life = i64::try_from(lifetime.as_secs()).expect("lifetime fits i64");
    (
        Timestamp::from_unix(now - back).expect("representable"),
        Timestamp::from_unix(now + life).expect("representable"),
    )
}

/// How a test CA is made: name, key, validity and the CA bits. Build with
/// [`CaSpec::self_signed`] (a root) or [`CaSpec::issued_by`] (an
/// intermediate). The default is a P-256 root with `O=kube-ovn, CN=<cn>`,
/// unconstrained, keyUsage keyCertSign + cRLSign, valid 1975..4096.
#[derive(Debug, Clone)]
pub struct CaSpec {
    cn: String,
    alg: TestKeyAlg,
    organization: bool,
    validity: Option<(Timestamp, Timestamp)>,
    path_len: Option<u8>,
    is_ca: bool,
    cert_sign: bool,
    critical: Vec<(Vec<u64>, Vec<u8>)>,
}

impl CaSpec {
    /// A CA named `CN=<cn>` with the defaults above.
    pub fn new(cn: &str) -> Self {
        CaSpec {
            cn: cn.to_owned(),
            alg: TestKeyAlg::P256,
            organization: true,
            validity: None,
            path_len: None,
            is_ca: true,
            cert_sign: true,
            critical: Vec::new(),
        }
    }

    /// An extension `oid` with DER `content`, marked critical.
    pub fn critical_extension(mut self, oid: &[u64], content: Vec<u8>) -> Self {
        self.critical.push((oid.to_vec(), content));
        self
    }

    /// Key type of the CA.
    pub fn key(mut self, alg: TestKeyAlg) -> Self {
        self.alg = alg;
        self
    }

    /// Subject `CN=<cn>` only, without `O=kube-ovn` (an external issuer).
    pub fn without_organization(mut self) -> Self {
        self.organization = false;
        self
    }

    /// An explicit validity window (expired or not-yet-valid CAs).
    pub fn valid(mut self, not_before: Timestamp, not_after: Timestamp) -> Self {
        self.validity = Some((not_before, not_after));
        self
    }

    /// basicConstraints pathLenConstraint.
    pub fn path_len(mut self, n: u8) -> Self {
        self.path_len = Some(n);
        self
    }

    /// basicConstraints CA:FALSE: a certificate that must not issue.
    pub fn not_a_ca(mut self) -> Self {
        self.is_ca = false;
        self
    }

    /// keyUsage without keyCertSign (digitalSignature only).
    pub fn without_cert_sign(mut self) -> Self {
        self.cert_sign = false;
        self
    }

    fn params(&self) -> CertificateParams {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        let mut dn = DistinguishedName::new();
        if self.organization {
            dn.push(DnType::OrganizationName, SUBJECT_ORGANIZATION);
        }
        dn.push(DnType::CommonName, self.cn.as_str());
        params.distinguished_name = dn;
        params.is_ca = match (self.is_ca, self.path_len) {
            (false, _) => IsCa::ExplicitNoCa,
            (true, None) => IsCa::Ca(BasicConstraints::Unconstrained),
            (true, Some(n)) => IsCa::Ca(BasicConstraints::Constrained(n)),
        };
        params.key_usages = if self.cert_sign {
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign]
        } else {
            vec![KeyUsagePurpose::DigitalSignature]
        };
        if let Some((nb, na)) = self.validity {
            set_validity(&mut params, nb, na);
        }
        for (oid, content) in &self.critical {
            let mut ext = CustomExtension::from_oid_content(oid, content.clone());
            ext.set_criticality(true);
            params.custom_extensions.push(ext);
        }
        params
    }

    /// A self-signed root.
    pub fn self_signed(self) -> TestCa {
        let key = self.alg.generate();
        let params = self.params();
        let cert = params.self_signed(&key).expect("self-sign CA");
        TestCa::assemble(key, params, cert.der(), Vec::new(), true)
    }

    /// A self-signed root's DER alone, unparsed: for a certificate the
    /// project's parser is meant to refuse.
    pub fn self_signed_der(self) -> Vec<u8> {
        let key = self.alg.generate();
        let cert = self.params().self_signed(&key).expect("self-sign CA");
        cert.der().to_vec()
    }

    /// An intermediate issued by `parent` (its chain is `parent`'s plus
    /// itself, unless `parent` is a root).
    pub fn issued_by(self, parent: &TestCa) -> TestCa {
        let key = self.alg.generate();
        let params = self.params();
        let cert = params
            .signed_by(&key, &parent.issuer())
            .expect("sign intermediate");
        // The CAs above the new one, nearest first, as a server sends them.
        let parents = parent.chain_with_self();
        TestCa::assemble(key, params, cert.der(), parents, false)
    }
}

/// A test CA: key, rcgen parameters and the parsed certificate, plus the
/// intermediates above it when it is not a root.
pub struct TestCa {
    key: KeyPair,
    params: CertificateParams,
    /// The CA certificate.
    pub certificate: Certificate,
    /// The CAs between this one and its root, nearest first (empty for a
    /// root or an intermediate the root issued directly).
    chain: Vec<Certificate>,
    /// Self-signed: a leaf it issues carries no intermediates.
    root: bool,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new self-signed CA named `O=kube-ovn, CN=<cn>`, valid 1975..4096
    /// (rcgen's default, so fixtures never expire under a test).
    pub fn new(alg: TestKeyAlg, cn: &str) -> Self {
        CaSpec::new(cn).key(alg).self_signed()
    }

    /// A P-256 root named `cn` ([`TestCa::new`] with [`TestKeyAlg::P256`]).
    pub fn p256(cn: &str) -> Self {
        Self::new(TestKeyAlg::P256, cn)
    }

    /// An RSA-2048 root named `cn` (what strongSwan tests use).
    pub fn rsa(cn: &str) -> Self {
        Self::new(TestKeyAlg::Rsa2048, cn)
    }

    fn assemble(
        key: KeyPair,
        params: CertificateParams,
        der: &[u8],
        parents: Vec<Certificate>,
        root: bool,
    ) -> Self {
        TestCa {
            key,
            params,
            certificate: Certificate::from_der(der).expect("parse CA"),
            chain: parents,
            root,
        }
    }

    /// The intermediates a leaf of this CA is sent with: this CA (unless it
    /// is a root) and the intermediates above it, nearest first.
    fn chain_with_self(&self) -> Vec<Certificate> {
        if self.root {
            return Vec::new();
        }
        std::iter::once(self.certificate.clone())
            .chain(self.chain.iter().cloned())
            .collect()
    }

    /// rcgen's issuer view of this CA, for tests that build certificates
    /// rcgen-side themselves.
    pub fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }

    /// A bundle holding just this CA.
    pub fn trust_bundle(&self) -> TrustBundle {
        TrustBundle::from_certificates(vec![self.certificate.clone()]).expect("bundle")
    }

    /// The CA certificate as PEM: a one-CA `ca.crt`.
    pub fn cert_pem(&self) -> String {
        self.certificate.to_pem()
    }

    /// The CA certificate's DER.
    pub fn cert_der(&self) -> &[u8] {
        self.certificate.der()
    }

    /// The CA's PKCS#8 private key (e.g. to seed a fake `ovn-ipsec-ca`
    /// Secret in controller tests).
    pub fn key_pkcs8_der(&self) -> Vec<u8> {
        self.key.serialize_der()
    }

    /// The CA's private key as PEM `PRIVATE KEY`.
    pub fn key_pem(&self) -> String {
        encode_pem(PEM_PRIVATE_KEY, &self.key.serialize_der())
    }

    /// Starts a leaf for `chassis` (`O=kube-ovn, CN=<chassis>`, SAN
    /// `DNS:<chassis>`): P-256 with a fresh key, valid 1975..4096 unless
    /// told otherwise.
    pub fn leaf(&self, chassis: &str) -> LeafSpec<'_> {
        LeafSpec {
            ca: self,
            chassis: chassis.to_owned(),
            key: LeafKey::Fresh(TestKeyAlg::P256),
            validity: None,
        }
    }

    /// Issues a chassis leaf (`O=kube-ovn, CN=<chassis>`, SAN
    /// `DNS:<chassis>`) with a fresh key, valid 1975..4096.
    pub fn issue(&self, chassis: &str, alg: TestKeyAlg) -> TestLeaf {
        self.leaf(chassis).key(alg).issue()
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
        self.leaf(chassis)
            .key(alg)
            .valid(not_before, not_after)
            .issue()
    }

    /// Issues a leaf for an existing PKCS#8 key (reuse a slow RSA key for
    /// a second certificate, e.g. a renewal).
    pub fn issue_for_key(
        &self,
        chassis: &str,
        key_pkcs8_der: &[u8],
        validity: Option<(Timestamp, Timestamp)>,
    ) -> TestLeaf {
        let spec = self.leaf(chassis).key_pkcs8(key_pkcs8_der);
        match validity {
            Some((nb, na)) => spec.valid(nb, na).issue(),
            None => spec.issue(),
        }
    }

    /// The CA certificate as `ca.crt` bytes (a one-CA trust bundle).
    pub fn trust_pem(&self) -> Vec<u8> {
        self.cert_pem().into_bytes()
    }

    /// Signs a CSR's subject and SANs, valid from `now_unix` minus the
    /// signer's backdate for `lifetime`, deviating from the request as
    /// `tamper` says: what a fake Kubernetes signer returns.
    pub fn sign(
        &self,
        request_pem: &str,
        now_unix: u64,
        lifetime: Duration,
        tamper: Tamper,
    ) -> String {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now_unix);
        let signing = self.sign_request(request_pem).issued_at(now, lifetime);
        match tamper {
            Tamper::None => signing,
            Tamper::WrongSan => signing.dns_names(&["someone-else"]),
            Tamper::OtherKey => signing.for_other_key(TestKeyAlg::P256),
        }
        .pem()
    }

    /// Signs a PEM PKCS#10 request the way a signer would: subject and SANs
    /// from the request, `CA:FALSE`, valid 1975..4096 unless told
    /// otherwise. The returned builder can deviate from the request, as a
    /// broken or malicious signer would.
    pub fn sign_request(&self, request_pem: &str) -> RequestSigning<'_> {
        let mut request =
            CertificateSigningRequestParams::from_pem(request_pem).expect("CSR parses");
        request.params.is_ca = IsCa::ExplicitNoCa;
        RequestSigning {
            ca: self,
            request,
            other_key: None,
        }
    }
}

/// How a fake issuance deviates from the request ([`TestCa::sign`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tamper {
    /// Faithful.
    None,
    /// The SAN names another chassis (`DNS:someone-else`).
    WrongSan,
    /// The certificate is for a different (fresh P-256) key.
    OtherKey,
}

enum LeafKey<'k> {
    Fresh(TestKeyAlg),
    Pkcs8(&'k [u8]),
}

/// A leaf being built by [`TestCa::leaf`].
pub struct LeafSpec<'a> {
    ca: &'a TestCa,
    chassis: String,
    key: LeafKey<'a>,
    validity: Option<(Timestamp, Timestamp)>,
}

impl std::fmt::Debug for LeafSpec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafSpec")
            .field("chassis", &self.chassis)
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

impl<'a> LeafSpec<'a> {
    /// A fresh key of type `alg`.
    pub fn key(mut self, alg: TestKeyAlg) -> Self {
        self.key = LeafKey::Fresh(alg);
        self
    }

    /// An existing PKCS#8 key (e.g. a renewal for the same key).
    pub fn key_pkcs8(mut self, der: &'a [u8]) -> Self {
        self.key = LeafKey::Pkcs8(der);
        self
    }

    /// An explicit validity window.
    pub fn valid(mut self, not_before: Timestamp, not_after: Timestamp) -> Self {
        self.validity = Some((not_before, not_after));
        self
    }

    /// Valid from `now` minus the signer's backdate for `lifetime`, as the
    /// project's signer issues it.
    pub fn issued_at(self, now: SystemTime, lifetime: Duration) -> Self {
        let (nb, na) = issued_window(now, lifetime);
        self.valid(nb, na)
    }

    /// Signs the leaf.
    pub fn issue(self) -> TestLeaf {
        let key = match self.key {
            LeafKey::Fresh(alg) => alg.generate(),
            LeafKey::Pkcs8(der) => KeyPair::try_from(der).expect("load PKCS#8"),
        };
        let chassis = Chassis::new(&self.chassis).expect("valid chassis");
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
        if let Some((nb, na)) = self.validity {
            set_validity(&mut params, nb, na);
        }
        let cert = params
            .signed_by(&key, &self.ca.issuer())
            .expect("sign leaf");
        TestLeaf {
            chassis,
            certificate: Certificate::from_der(cert.der()).expect("parse leaf"),
            key_pkcs8_der: key.serialize_der(),
            chain: self.ca.chain_with_self(),
        }
    }
}

/// A PKCS#10 request being signed by [`TestCa::sign_request`].
pub struct RequestSigning<'a> {
    ca: &'a TestCa,
    request: CertificateSigningRequestParams,
    other_key: Option<TestKeyAlg>,
}

impl std::fmt::Debug for RequestSigning<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSigning").finish_non_exhaustive()
    }
}

impl RequestSigning<'_> {
    /// An explicit validity window.
    pub fn valid(mut self, not_before: Timestamp, not_after: Timestamp) -> Self {
        set_validity(&mut self.request.params, not_before, not_after);
        self
    }

    /// Valid from `now` minus the signer's backdate for `lifetime`.
    pub fn issued_at(self, now: SystemTime, lifetime: Duration) -> Self {
        let (nb, na) = issued_window(now, lifetime);
        self.valid(nb, na)
    }

    /// Replaces the SANs with these DNS names (a signer that names someone
    /// else).
    pub fn dns_names(mut self, names: &[&str]) -> Self {
        self.request.params.subject_alt_names = names
            .iter()
            .map(|n| SanType::DnsName((*n).to_owned().try_into().expect("DNS name")))
            .collect();
        self
    }

    /// Any other change to the certificate parameters.
    pub fn tweak(mut self, f: impl FnOnce(&mut CertificateParams)) -> Self {
        f(&mut self.request.params);
        self
    }

    /// Certifies a fresh key of type `alg` instead of the request's (a
    /// certificate for the wrong key).
    pub fn for_other_key(mut self, alg: TestKeyAlg) -> Self {
        self.other_key = Some(alg);
        self
    }

    /// The signed certificate, DER.
    pub fn der(self) -> Vec<u8> {
        let issuer = self.ca.issuer();
        let cert = match self.other_key {
            None => self.request.signed_by(&issuer),
            Some(alg) => self.request.params.signed_by(&alg.generate(), &issuer),
        };
        cert.expect("sign request").der().to_vec()
    }

    /// The signed certificate as one PEM block.
    pub fn pem(self) -> String {
        encode_pem(crate::pki::PEM_CERTIFICATE, &self.der())
    }

    /// The signed certificate followed by the CA's intermediates, PEM: what
    /// a signer returns in `status.certificate`.
    pub fn chain_pem(self) -> String {
        let chain = self.ca.chain_with_self();
        let mut out = self.pem();
        for c in &chain {
            out.push_str(&c.to_pem());
        }
        out
    }

    /// The signed certificate, parsed.
    pub fn certificate(self) -> Certificate {
        Certificate::from_der(&self.der()).expect("parse signed request")
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
    /// The intermediates between the leaf and the root, nearest first
    /// (empty when a root issued it).
    pub chain: Vec<Certificate>,
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

    /// The leaf followed by its intermediates, PEM: what a signer returns.
    pub fn chain_pem(&self) -> String {
        std::iter::once(&self.certificate)
            .chain(&self.chain)
            .map(Certificate::to_pem)
            .collect()
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

/// A receipt status with every flag up (it satisfies both barriers), naming
/// the certificate whose digest is `certificate_digest`.
pub fn ready_status(
    certificate_digest: crate::digest::Sha256Digest,
) -> crate::coordination::ReceiptStatus {
    crate::coordination::ReceiptStatus {
        identity_ready: true,
        capability_verified: true,
        protection_armed: true,
        configuration_applied: true,
        runtime_healthy: true,
        certificate_digest,
    }
}

/// A peer of `192.0.2.2` (chassis `node-2`) in `state`, counted `healthy`
/// or not, since 2027-01-15 08:00 UTC, with zero counters: what data-path
/// tests start from (struct update syntax changes the rest).
pub fn peer_health(
    state: crate::datapath::PeerState,
    healthy: bool,
) -> crate::datapath::PeerHealth {
    crate::datapath::PeerHealth {
        peer: std::net::IpAddr::from([192, 0, 2, 2]),
        chassis: Chassis::new("node-2").ok(),
        state,
        reason: state.reason(),
        healthy,
        since: Timestamp::from_unix(1_800_000_000).expect("in range"),
        outbound: crate::datapath::SaCounters::default(),
        inbound: crate::datapath::SaCounters::default(),
        nat_traversal: false,
        enable_window_millis: None,
    }
}

/// SplitMix64: a seeded, dependency-free RNG, so that a randomised test
/// (the crash-consistency kills, the chaos suite's matrix) replays exactly
/// from the seed it prints.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (`n` > 0; 0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform duration in [lo, hi].
    pub fn between(
        &mut self,
        lo: std::time::Duration,
        hi: std::time::Duration,
    ) -> std::time::Duration {
        let hi = hi.max(lo);
        lo + (hi - lo).mul_f64(self.unit())
    }
}

/// The system clock moved by an offset a test adjusts ([`JumpClock::jump`]):
/// a node suspended and resumed, or stepped by NTP, as every reader of the
/// clock sees it.
#[derive(Debug, Default)]
pub struct JumpClock {
    offset_secs: std::sync::atomic::AtomicI64,
}

impl JumpClock {
    /// Moves the clock by `secs` (forward when positive).
    pub fn jump(&self, secs: i64) {
        self.offset_secs
            .fetch_add(secs, std::sync::atomic::Ordering::SeqCst);
    }

    /// The total offset from the system clock, in seconds.
    pub fn offset(&self) -> i64 {
        self.offset_secs.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl crate::clock::Clock for JumpClock {
    fn now(&self) -> SystemTime {
        let now = crate::clock::SystemClock.now();
        let off = self.offset();
        let d = Duration::from_secs(off.unsigned_abs());
        if off >= 0 { now + d } else { now - d }
    }
}
