//! Certificates, trust bundles and the digests everyone compares.
//!
//! * [`parse_pem`] is the one strict PEM reader: it rejects anything but
//!   well-formed blocks with the expected label separated by blank lines, and
//!   says why (with a line number, never the content).
//! * [`Certificate`] is an owned, pre-parsed X.509 certificate with the facts
//!   the agent and controller check: key algorithm, validity, subject, SANs,
//!   CA flag, and [`Certificate::digest`] = SHA-256 over the DER.
//! * [`SpkiKey`] is the one SubjectPublicKeyInfo key-type parser (RSA size,
//!   EC curve); callers apply their own policy to what it reports.
//! * [`CertificateChain`] is a PEM chain as a signer returns it: the leaf
//!   first, then the intermediates that came with it.
//! * [`IPSEC_TUNNEL_EKU`], [`LEAF_BACKDATE`] and [`LEAF_LIFETIME_SLACK`]
//!   describe the leaf this project issues, for the signer and every check of
//!   an issued leaf.
//! * [`TrustBundle`] is the `ovn-ipsec-trust` `ca.crt` content and the one
//!   chain verifier ([`TrustBundle::verify_chain`]): every trust decision in
//!   the agent and the controller goes through it. Its digest is
//!   **SHA-256 over the concatenation of the DER certificates in bundle
//!   order** (SPEC §2). Concatenation is unambiguous without extra framing
//!   because every DER certificate is a self-delimiting SEQUENCE with its own
//!   length. Reordering the bundle changes the digest on purpose: the digest
//!   names exactly the file the monitor loaded.
//!
//! Signature checks use aws-lc-rs only, so one crypto library makes every
//! trust decision in this project.

use std::fmt;
use std::time::Duration;

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use x509_parser::oid_registry::{
    OID_PKCS1_SHA256WITHRSA, OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA,
    OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384,
};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509Certificate};

use crate::digest::Sha256Digest;
use crate::error::{Error, Result};
use crate::ident::{Chassis, Uid};
use crate::names::k8s;
use crate::time::Timestamp;

mod spki;
pub use spki::SpkiKey;

/// PEM label of a certificate block.
pub const PEM_CERTIFICATE: &str = "CERTIFICATE";
/// PEM label of a PKCS#8 private key block.
pub const PEM_PRIVATE_KEY: &str = "PRIVATE KEY";
/// PEM label of a PKCS#10 CSR block (what goes into CSR `spec.request`).
pub const PEM_CERTIFICATE_REQUEST: &str = "CERTIFICATE REQUEST";

/// One PEM block: its label and the decoded DER.
#[derive(Clone, PartialEq, Eq)]
pub struct PemBlock {
    /// The label between `-----BEGIN ` and `-----` (e.g. `CERTIFICATE`).
    pub label: String,
    /// The decoded body.
    pub der: Vec<u8>,
}

impl fmt::Debug for PemBlock {
    // The body may be a private key: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemBlock")
            .field("label", &self.label)
            .field("len", &self.der.len())
            .finish()
    }
}

/// Parses a PEM text that must consist only of `label` blocks and blank
/// lines, returning each block's DER in order.
///
/// Strict on purpose: a trust bundle with stray text is more likely a
/// truncated or mis-pasted file than a decorated one. Accepts LF or CRLF and
/// trailing spaces; rejects headers (`Proc-Type:`), other labels, bad or
/// unpadded base64, empty blocks, unterminated blocks and an input with no
/// block.
pub fn parse_pem(input: &[u8], label: &str) -> Result<Vec<Vec<u8>>> {
    parse_pem_inner(input, Some(label)).map(|blocks| blocks.into_iter().map(|b| b.der).collect())
}

/// Like [`parse_pem`], but accepts blocks of any label and returns each with
/// its label, so the caller can say *which* label was wrong.
pub fn parse_pem_blocks(input: &[u8]) -> Result<Vec<PemBlock>> {
    parse_pem_inner(input, None)
}

fn parse_pem_inner(input: &[u8], label: Option<&str>) -> Result<Vec<PemBlock>> {
    let text = std::str::from_utf8(input).map_err(|_| Error::InvalidPem {
        reason: "input is not UTF-8".into(),
    })?;
    let bad = |line: usize, what: &str| Error::InvalidPem {
        reason: format!("line {line}: {what}"),
    };

    let mut blocks = Vec::new();
    // Some(start line, label, body) while inside a block.
    let mut open: Option<(usize, String, String)> = None;
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches(['\r', ' ', '\t']);
        match open.as_mut() {
            None if line.is_empty() => {}
            None => {
                let found = line
                    .strip_prefix("-----BEGIN ")
                    .and_then(|l| l.strip_suffix("-----"))
                    .filter(|l| !l.is_empty() && !l.contains("-----"));
                match (found, label) {
                    (Some(found), Some(want)) if found != want => {
                        return Err(bad(n, &format!("unexpected block, expected {want}")));
                    }
                    (Some(found), _) => open = Some((n, found.to_owned(), String::new())),
                    (None, Some(want)) if line.starts_with("-----BEGIN ") => {
                        return Err(bad(n, &format!("unexpected block, expected {want}")));
                    }
                    (None, _) => return Err(bad(n, "text outside a PEM block")),
                }
            }
            Some((start, found, body))
                if line
                    .strip_prefix("-----END ")
                    .and_then(|l| l.strip_suffix("-----"))
                    == Some(found.as_str()) =>
            {
                let der = STANDARD
                    .decode(body.as_bytes())
                    .map_err(|_| bad(*start, "block body is not valid padded base64"))?;
                if der.is_empty() {
                    return Err(bad(*start, "empty block"));
                }
                blocks.push(PemBlock {
                    label: std::mem::take(found),
                    der,
                });
                open = None;
            }
            Some(_) if line.starts_with("-----") => {
                return Err(bad(n, "unexpected boundary inside a block"));
            }
            Some((_, _, body)) => {
                if !line
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                {
                    return Err(bad(n, "not a base64 line (headers are not accepted)"));
                }
                body.push_str(line);
            }
        }
    }
    if let Some((start, _, _)) = open {
        return Err(bad(start, "block is not terminated"));
    }
    if blocks.is_empty() {
        return Err(Error::InvalidPem {
            reason: match label {
                Some(label) => format!("no {label} block"),
                None => "no PEM block".into(),
            },
        });
    }
    Ok(blocks)
}

/// Encodes DER as one PEM block with 64-column base64 lines and a trailing
/// newline (the form OpenSSL and strongSwan expect).
pub fn encode_pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 2 * label.len() + 40);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    // base64 output is ASCII, so byte chunks are char boundaries.
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// `id-kp-ipsecTunnel` (1.3.6.1.5.5.7.3.6, RFC 2459), as OID arcs: the X.509
/// meaning of the Kubernetes usage `ipsec tunnel`, and the one extended key
/// usage a leaf of this project carries. The dotted form is
/// [`ipsec_tunnel_eku_dotted`].
pub const IPSEC_TUNNEL_EKU: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 3, 6];

/// [`IPSEC_TUNNEL_EKU`] in dotted form (`"1.3.6.1.5.5.7.3.6"`), as
/// x509-parser's `Oid::to_id_string` spells it.
pub fn ipsec_tunnel_eku_dotted() -> String {
    let arcs: Vec<String> = IPSEC_TUNNEL_EKU.iter().map(u64::to_string).collect();
    arcs.join(".")
}

/// How far a leaf's `notBefore` is backdated before the signing time, to
/// tolerate clock skew between nodes (SPEC §6).
pub const LEAF_BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Slack allowed on an issued leaf's lifetime beyond what was requested plus
/// [`LEAF_BACKDATE`] (issuer clocks and rounding).
pub const LEAF_LIFETIME_SLACK: Duration = Duration::from_secs(60);

/// Longest chain of intermediates [`TrustBundle::verify_chain`] follows
/// between a leaf and a trust anchor.
pub const MAX_INTERMEDIATES: usize = 4;

/// Most intermediates a chain may carry at all: the path search is
/// exponential in the worst case, so an oversized chain is refused before
/// any signature is checked.
pub const MAX_CHAIN_CERTIFICATES: usize = 8;

/// A public key algorithm this project accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// RSA with the given modulus size in bits (>= 2048).
    Rsa {
        /// Modulus size in bits.
        bits: usize,
    },
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384 (accepted for CAs, e.g. an external issuer).
    EcdsaP384,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyAlgorithm::Rsa { bits } => write!(f, "RSA-{bits}"),
            KeyAlgorithm::EcdsaP256 => f.write_str("ECDSA-P256"),
            KeyAlgorithm::EcdsaP384 => f.write_str("ECDSA-P384"),
        }
    }
}

/// An X.509 certificate, parsed once and kept with its DER.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    der: Vec<u8>,
    digest: Sha256Digest,
    key: KeyAlgorithm,
    /// SubjectPublicKeyInfo's BIT STRING: PKCS#1 RSAPublicKey or EC point,
    /// the form aws-lc-rs `UnparsedPublicKey` takes.
    public_key: Vec<u8>,
    /// The whole SubjectPublicKeyInfo, DER.
    spki_der: Vec<u8>,
    not_before: Timestamp,
    not_after: Timestamp,
    is_ca: bool,
    /// basicConstraints pathLenConstraint.
    path_len: Option<u32>,
    /// keyUsage keyCertSign, `None` when the certificate has no keyUsage.
    key_cert_sign: Option<bool>,
    subject_raw: Vec<u8>,
    issuer_raw: Vec<u8>,
    subject_attributes: usize,
    common_names: Vec<String>,
    organizations: Vec<String>,
    dns_names: Vec<String>,
    other_sans: usize,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("digest", &self.digest)
            .field("cn", &self.common_names)
            .field("key", &self.key)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

fn bad_cert(reason: impl fmt::Display) -> Error {
    Error::InvalidCertificate {
        reason: reason.to_string(),
    }
}

/// The extensions the IKE daemon loads a certificate with when they are
/// marked critical, by OID (dotted) and name.
///
/// strongSwan's x509 plugin refuses to load a certificate with any other
/// critical extension (its `x509.enforce_critical`, on by default): a CA
/// it refuses is silently absent from `ipsec listcacerts`, and every leaf
/// it issued fails authentication. Measured against the image's charon
/// (5.9.8, its plugin list) by runtime/tests/ca_bundle.rs, which fails
/// when this list and the daemon disagree: Netscape certificate type,
/// TLS feature, subject information access, freshest CRL, AS identifiers,
/// subject directory attributes and private OIDs are refused.
pub const IKE_CRITICAL_EXTENSIONS: &[(&str, &str)] = &[
    ("2.5.29.14", "subjectKeyIdentifier"),
    ("2.5.29.15", "keyUsage"),
    ("2.5.29.17", "subjectAltName"),
    ("2.5.29.18", "issuerAltName"),
    ("2.5.29.19", "basicConstraints"),
    ("2.5.29.30", "nameConstraints"),
    ("2.5.29.31", "cRLDistributionPoints"),
    ("2.5.29.32", "certificatePolicies"),
    ("2.5.29.33", "policyMappings"),
    ("2.5.29.35", "authorityKeyIdentifier"),
    ("2.5.29.36", "policyConstraints"),
    ("2.5.29.37", "extKeyUsage"),
    ("2.5.29.54", "inhibitAnyPolicy"),
    ("1.3.6.1.5.5.7.1.1", "authorityInfoAccess"),
    ("1.3.6.1.5.5.7.1.7", "ipAddrBlocks"),
];

impl Certificate {
    /// Parses one DER certificate. Rejects trailing bytes, keys other
    /// than RSA >= 2048, P-256 and P-384, and a critical extension the IKE
    /// daemon would refuse the certificate for
    /// ([`IKE_CRITICAL_EXTENSIONS`]): accepting it would mean a
    /// certificate that every check here passes and the daemon never
    /// loads.
    pub fn from_der(der: &[u8]) -> Result<Self> {
        let (rest, x) = X509Certificate::from_der(der).map_err(bad_cert)?;
        if !rest.is_empty() {
            return Err(bad_cert("trailing bytes after the certificate"));
        }
        for ext in x.extensions().iter().filter(|e| e.critical) {
            let oid = ext.oid.to_id_string();
            if !IKE_CRITICAL_EXTENSIONS.iter().any(|(o, _)| *o == oid) {
                return Err(bad_cert(format!(
                    "critical extension {oid} is one the IKE daemon does not implement, \
                     and it refuses to load a certificate with it (reissue it without that \
                     extension, or with the extension not critical)"
                )));
            }
        }
        let spki = x.public_key();
        let key = SpkiKey::from_spki(spki)?.key_algorithm()?;
        let path_len = x
            .basic_constraints()
            .map_err(bad_cert)?
            .and_then(|bc| bc.value.path_len_constraint);
        let key_cert_sign = x
            .key_usage()
            .map_err(bad_cert)?
            .map(|ku| ku.value.key_cert_sign());

        let validity = x.validity();
        let not_before = Timestamp::from_unix(validity.not_before.timestamp())?;
        let not_after = Timestamp::from_unix(validity.not_after.timestamp())?;

        let mut common_names = Vec::new();
        for a in x.subject().iter_common_name() {
            common_names.push(a.as_str().map_err(bad_cert)?.to_owned());
        }
        let mut organizations = Vec::new();
        for a in x.subject().iter_organization() {
            organizations.push(a.as_str().map_err(bad_cert)?.to_owned());
        }
        let subject_attributes = x.subject().iter_attributes().count();

        let mut dns_names = Vec::new();
        let mut other_sans = 0;
        for ext in x.extensions() {
            if let ParsedExtension::SubjectAlternativeName(san) = ext.parsed_extension() {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
                        _ => other_sans += 1,
                    }
                }
            }
        }

        Ok(Certificate {
            der: der.to_vec(),
            digest: Sha256Digest::of(der),
            key,
            public_key: spki.subject_public_key.data.to_vec(),
            spki_der: spki.raw.to_vec(),
            not_before,
            not_after,
            is_ca: x.is_ca(),
            path_len,
            key_cert_sign,
            subject_raw: x.subject().as_raw().to_vec(),
            issuer_raw: x.issuer().as_raw().to_vec(),
            subject_attributes,
            common_names,
            organizations,
            dns_names,
            other_sans,
        })
    }

    /// Parses a PEM text holding exactly one certificate.
    pub fn from_pem(pem: &[u8]) -> Result<Self> {
        let mut blocks = parse_pem(pem, PEM_CERTIFICATE)?;
        match (blocks.pop(), blocks.is_empty()) {
            (Some(der), true) => Certificate::from_der(&der),
            _ => Err(Error::InvalidPem {
                reason: "expected exactly one certificate".into(),
            }),
        }
    }

    /// The DER bytes.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// PEM encoding of the certificate.
    pub fn to_pem(&self) -> String {
        encode_pem(PEM_CERTIFICATE, &self.der)
    }

    /// SHA-256 over the DER: the `certificateDigest` of status and receipts.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// The subject key's algorithm.
    pub fn key_algorithm(&self) -> KeyAlgorithm {
        self.key
    }

    /// The subject public key (the SubjectPublicKeyInfo BIT STRING: PKCS#1
    /// RSAPublicKey or EC point), the form aws-lc-rs verifies with.
    pub fn public_key_bytes(&self) -> &[u8] {
        &self.public_key
    }

    /// The whole SubjectPublicKeyInfo, DER (what a CSR's key is compared by).
    pub fn subject_public_key_info(&self) -> &[u8] {
        &self.spki_der
    }

    /// notBefore.
    pub fn not_before(&self) -> Timestamp {
        self.not_before
    }

    /// notAfter: the status `expires`.
    pub fn not_after(&self) -> Timestamp {
        self.not_after
    }

    /// Whether basicConstraints says CA.
    pub fn is_ca(&self) -> bool {
        self.is_ca
    }

    /// Subject CN values, in order.
    pub fn common_names(&self) -> &[String] {
        &self.common_names
    }

    /// Subject O values, in order.
    pub fn organizations(&self) -> &[String] {
        &self.organizations
    }

    /// `DNS:` SANs, in order.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// How many SANs are not `DNS:` names (IP, URI, email, ...).
    pub fn other_san_count(&self) -> usize {
        self.other_sans
    }

    /// basicConstraints pathLenConstraint, if any.
    pub fn path_len_constraint(&self) -> Option<u32> {
        self.path_len
    }

    /// Whether this certificate may sign certificates: a CA whose keyUsage,
    /// when present, includes keyCertSign (RFC 5280 §4.2.1.3).
    pub fn may_sign_certificates(&self) -> bool {
        self.is_ca && self.key_cert_sign != Some(false)
    }

    /// Fails unless `not_before <= at <= not_after`.
    pub fn check_valid_at(&self, at: Timestamp) -> Result<()> {
        if self.not_before <= at && at <= self.not_after {
            Ok(())
        } else {
            Err(Error::CertificateNotValidNow {
                at: at.to_string(),
                not_before: self.not_before.to_string(),
                not_after: self.not_after.to_string(),
            })
        }
    }

    /// Fails unless this is an IPsec leaf for `chassis` exactly: not a CA,
    /// subject exactly `O=kube-ovn, CN=<chassis>` (two attributes), SANs
    /// exactly one `DNS:<chassis>` (SPEC §2, §6).
    pub fn check_chassis_identity(&self, chassis: &Chassis) -> Result<()> {
        let mismatch = |reason: &str| {
            Err(Error::IdentityMismatch {
                reason: reason.into(),
            })
        };
        if self.is_ca {
            return mismatch("leaf is a CA certificate");
        }
        if self.subject_attributes != 2
            || self.common_names != [chassis.as_str()]
            || self.organizations != [k8s::SUBJECT_ORGANIZATION]
        {
            return mismatch("subject is not exactly O=kube-ovn, CN=<chassis>");
        }
        if self.other_sans != 0 || self.dns_names != [chassis.as_str()] {
            return mismatch("SANs are not exactly DNS:<chassis>");
        }
        Ok(())
    }

    /// Verifies that `issuer` signed this certificate (issuer name matches
    /// the issuer's subject and the signature verifies with its key).
    pub fn verify_issued_by(&self, issuer: &Certificate) -> Result<()> {
        if self.issuer_raw != issuer.subject_raw {
            return Err(Error::Untrusted);
        }
        let (_, x) = X509Certificate::from_der(&self.der).map_err(bad_cert)?;
        let sig_oid = &x.signature_algorithm.algorithm;
        let alg: &'static dyn VerificationAlgorithm = match issuer.key {
            KeyAlgorithm::Rsa { .. } if *sig_oid == OID_PKCS1_SHA256WITHRSA => {
                &signature::RSA_PKCS1_2048_8192_SHA256
            }
            KeyAlgorithm::Rsa { .. } if *sig_oid == OID_PKCS1_SHA384WITHRSA => {
                &signature::RSA_PKCS1_2048_8192_SHA384
            }
            KeyAlgorithm::Rsa { .. } if *sig_oid == OID_PKCS1_SHA512WITHRSA => {
                &signature::RSA_PKCS1_2048_8192_SHA512
            }
            KeyAlgorithm::EcdsaP256 if *sig_oid == OID_SIG_ECDSA_WITH_SHA256 => {
                &signature::ECDSA_P256_SHA256_ASN1
            }
            KeyAlgorithm::EcdsaP256 if *sig_oid == OID_SIG_ECDSA_WITH_SHA384 => {
                &signature::ECDSA_P256_SHA384_ASN1
            }
            KeyAlgorithm::EcdsaP384 if *sig_oid == OID_SIG_ECDSA_WITH_SHA256 => {
                &signature::ECDSA_P384_SHA256_ASN1
            }
            KeyAlgorithm::EcdsaP384 if *sig_oid == OID_SIG_ECDSA_WITH_SHA384 => {
                &signature::ECDSA_P384_SHA384_ASN1
            }
            _ => {
                return Err(Error::UnsupportedKey {
                    reason: format!(
                        "signature algorithm {sig_oid} with issuer key {}",
                        issuer.key
                    ),
                });
            }
        };
        UnparsedPublicKey::new(alg, &issuer.public_key)
            .verify(x.tbs_certificate.as_ref(), &x.signature_value.data)
            .map_err(|_| Error::Untrusted)
    }

    /// When this leaf should be renewed: a point between 40% and 60% of its
    /// lifetime, from a hash of (Node UID, certificate) — stable across
    /// restarts, spread uniformly across nodes (SPEC §2).
    ///
    /// Offset = `lifetime * 2/5 + (u * lifetime/5) >> 64` where `u` is the
    /// first 8 bytes (big-endian) of
    /// `SHA-256("kube-ovn IPsec renewal v1\0" || be64(len uid) || uid || be64(len der) || der)`.
    pub fn renewal_time(&self, node_uid: &Uid) -> Timestamp {
        let lifetime = u64::try_from(self.not_after.secs_since(self.not_before)).unwrap_or(0);
        let start = self
            .not_before
            .plus_secs(i64::try_from(lifetime * 2 / 5).unwrap_or(0));
        spread_point(
            b"kube-ovn IPsec renewal v1\0",
            &[node_uid.as_str().as_bytes(), &self.der],
            start,
            lifetime / 5,
        )
    }

    /// When a node whose active leaf is this one should renew onto
    /// `signing`, the CA the controller signs with now (a CA rotation):
    /// `None` when `signing` issued this leaf, or when this leaf was issued
    /// after `signing` existed (its `NotBefore` is later: both are
    /// backdated alike) — then the controller had not switched yet, and a
    /// second early renewal would get the same answer, so the leaf waits
    /// for its normal renewal point. A leaf of the CA's own second (times
    /// are whole seconds) may predate it and moves: at worst one extra
    /// renewal, whose leaf is then later. Otherwise a point in
    /// `[signing.NotBefore + backdate, + spread)` from a hash of (Node UID,
    /// signing CA): stable across restarts, spread uniformly across nodes
    /// so that a rotation does not send every node's CSR at once.
    pub fn rotation_time(
        &self,
        signing: &Certificate,
        node_uid: &Uid,
        spread: Duration,
    ) -> Option<Timestamp> {
        if self.verify_issued_by(signing).is_ok() || self.not_before > signing.not_before {
            return None;
        }
        let backdate = i64::try_from(LEAF_BACKDATE.as_secs()).unwrap_or(0);
        Some(spread_point(
            b"kube-ovn IPsec CA rotation v1\0",
            &[node_uid.as_str().as_bytes(), &signing.der],
            signing.not_before.plus_secs(backdate),
            spread.as_secs(),
        ))
    }
}

/// `start` plus a fraction of `window` seconds taken from the first 8 bytes
/// (big-endian) of the framed digest of `parts` under `domain`: the same
/// inputs always give the same point, different inputs spread uniformly.
fn spread_point(domain: &[u8], parts: &[&[u8]], start: Timestamp, window: u64) -> Timestamp {
    let h = crate::csr::framed_digest(domain, parts);
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    let u = u128::from(u64::from_be_bytes(first));
    let offset = (u * u128::from(window)) >> 64;
    start.plus_secs(i64::try_from(offset).unwrap_or(i64::MAX))
}

/// The trust bundle: one or more CA certificates (several during a CA
/// rotation), in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    certificates: Vec<Certificate>,
    digest: Sha256Digest,
}

impl TrustBundle {
    /// Parses the `ca.crt` PEM. Every block must be a CA certificate.
    pub fn from_pem(pem: &[u8]) -> Result<Self> {
        let ders = parse_pem(pem, PEM_CERTIFICATE)?;
        let mut certificates = Vec::with_capacity(ders.len());
        for (i, der) in ders.iter().enumerate() {
            let cert = Certificate::from_der(der).map_err(|e| Error::InvalidTrustBundle {
                reason: format!("certificate {}: {e}", i + 1),
            })?;
            certificates.push(cert);
        }
        Self::from_certificates(certificates)
    }

    /// Builds a bundle from parsed certificates, in the given order.
    pub fn from_certificates(certificates: Vec<Certificate>) -> Result<Self> {
        if certificates.is_empty() {
            return Err(Error::InvalidTrustBundle {
                reason: "no certificate".into(),
            });
        }
        if let Some(i) = certificates.iter().position(|c| !c.is_ca()) {
            return Err(Error::InvalidTrustBundle {
                reason: format!("certificate {} is not a CA", i + 1),
            });
        }
        let digest = trust_digest(certificates.iter().map(|c| c.der()));
        Ok(TrustBundle {
            certificates,
            digest,
        })
    }

    /// The `trustDigest` / `trustHash`: SHA-256 over the concatenated DER
    /// certificates in order.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// The CA certificates in bundle order.
    pub fn certificates(&self) -> &[Certificate] {
        &self.certificates
    }

    /// PEM encoding of the whole bundle, in order.
    pub fn to_pem(&self) -> String {
        self.certificates.iter().map(Certificate::to_pem).collect()
    }

    /// Whether the bundle holds this exact certificate (by DER).
    pub fn contains(&self, der: &[u8]) -> bool {
        self.certificates.iter().any(|c| c.der() == der)
    }

    /// Appends a CA certificate unless it is already present; returns
    /// whether it was added. Fails (and changes nothing) for a non-CA.
    pub fn add(&mut self, certificate: Certificate) -> Result<bool> {
        if !certificate.is_ca() {
            return Err(Error::InvalidTrustBundle {
                reason: "certificate to add is not a CA".into(),
            });
        }
        if self.contains(certificate.der()) {
            return Ok(false);
        }
        self.certificates.push(certificate);
        self.digest = trust_digest(self.certificates.iter().map(|c| c.der()));
        Ok(true)
    }

    /// The bundle holding only the certificate whose DER is `keep` (a CA
    /// retirement). Fails when `keep` is not in the bundle, since a bundle
    /// is never empty.
    pub fn retain_only(&self, keep: &[u8]) -> Result<Self> {
        let kept: Vec<Certificate> = self
            .certificates
            .iter()
            .filter(|c| c.der() == keep)
            .cloned()
            .collect();
        Self::from_certificates(kept)
    }

    /// Fails unless `leaf` is valid at `now` and chains to this bundle
    /// without intermediates: [`TrustBundle::verify_chain`] with none.
    pub fn verify_leaf(&self, leaf: &Certificate, now: Timestamp) -> Result<()> {
        self.verify_chain(leaf, &[], now).map(|_| ())
    }

    /// The one chain verifier: finds a path from `leaf` through
    /// `intermediates` (any order, e.g. the rest of a PEM chain) to a CA of
    /// this bundle, and returns it.
    ///
    /// On the path, every certificate is valid at `at`, every signature
    /// verifies with its issuer's key (aws-lc-rs), and every issuer —
    /// intermediate or bundle CA — is a CA (basicConstraints) whose keyUsage,
    /// when present, allows keyCertSign and whose pathLenConstraint allows
    /// the intermediates below it. At most [`MAX_INTERMEDIATES`] are
    /// followed, and a chain with more than [`MAX_CHAIN_CERTIFICATES`] is
    /// refused outright. Intermediates that are not needed are ignored.
    ///
    /// Errors: [`Error::CertificateNotValidNow`] when the leaf itself is
    /// outside its validity, [`Error::Untrusted`] when no path exists.
    pub fn verify_chain(
        &self,
        leaf: &Certificate,
        intermediates: &[Certificate],
        at: Timestamp,
    ) -> Result<VerifiedChain> {
        leaf.check_valid_at(at)?;
        if intermediates.len() > MAX_CHAIN_CERTIFICATES {
            return Err(Error::Untrusted);
        }
        let mut path = Vec::new();
        let anchor = self
            .find_path(leaf, intermediates, at, &mut path)
            .ok_or(Error::Untrusted)?;
        Ok(VerifiedChain {
            leaf: leaf.clone(),
            intermediates: path.iter().map(|&i| intermediates[i].clone()).collect(),
            anchor: self.certificates[anchor].clone(),
        })
    }

    /// Depth-first search for an issuer of `child`; `path` holds the
    /// indices of the intermediates already between the leaf and `child`
    /// (so its length is what a candidate issuer's pathLenConstraint
    /// bounds). Returns the index of the bundle CA that ends the path.
    fn find_path(
        &self,
        child: &Certificate,
        intermediates: &[Certificate],
        at: Timestamp,
        path: &mut Vec<usize>,
    ) -> Option<usize> {
        let below = path.len();
        // A bundle CA first: the shortest path wins.
        if let Some(anchor) = self
            .certificates
            .iter()
            .position(|ca| may_issue(ca, child, below, at))
        {
            return Some(anchor);
        }
        if below >= MAX_INTERMEDIATES {
            return None;
        }
        for (i, candidate) in intermediates.iter().enumerate() {
            if path.contains(&i) || !may_issue(candidate, child, below, at) {
                continue;
            }
            path.push(i);
            if let Some(anchor) = self.find_path(candidate, intermediates, at, path) {
                return Some(anchor);
            }
            path.pop();
        }
        None
    }
}

/// Whether `issuer` may have issued `child` with `below` intermediates
/// under it on the path: a CA allowed to sign certificates, within its path
/// length and validity, whose key verifies `child`'s signature.
fn may_issue(issuer: &Certificate, child: &Certificate, below: usize, at: Timestamp) -> bool {
    issuer.may_sign_certificates()
        && issuer
            .path_len
            .is_none_or(|max| usize::try_from(max).is_ok_and(|max| below <= max))
        && issuer.check_valid_at(at).is_ok()
        && child.verify_issued_by(issuer).is_ok()
}

/// A path [`TrustBundle::verify_chain`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedChain {
    /// The verified leaf.
    pub leaf: Certificate,
    /// The intermediates on the path, the leaf's issuer first.
    pub intermediates: Vec<Certificate>,
    /// The bundle CA the path ends at.
    pub anchor: Certificate,
}

impl VerifiedChain {
    /// The leaf and the intermediates on the path as PEM, leaf first: the
    /// chain to hand on (the anchor is already in every bundle).
    pub fn to_pem(&self) -> String {
        std::iter::once(&self.leaf)
            .chain(&self.intermediates)
            .map(Certificate::to_pem)
            .collect()
    }
}

/// A certificate chain as a signer returns it (CSR `status.certificate`,
/// cert-manager `status.certificate`): the leaf first, then whatever
/// intermediates came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateChain {
    leaf: Certificate,
    intermediates: Vec<Certificate>,
}

impl CertificateChain {
    /// Parses a PEM chain: only `CERTIFICATE` blocks, at least one, each a
    /// certificate [`Certificate::from_der`] accepts.
    pub fn from_pem(pem: &[u8]) -> Result<Self> {
        let mut certificates = parse_pem(pem, PEM_CERTIFICATE)?
            .iter()
            .map(|der| Certificate::from_der(der))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let leaf = certificates.next().ok_or_else(|| Error::InvalidPem {
            reason: "no certificate".into(),
        })?;
        Ok(CertificateChain {
            leaf,
            intermediates: certificates.collect(),
        })
    }

    /// The leaf (first certificate).
    pub fn leaf(&self) -> &Certificate {
        &self.leaf
    }

    /// The certificates after the leaf, in the order received.
    pub fn intermediates(&self) -> &[Certificate] {
        &self.intermediates
    }

    /// The leaf, dropping the rest.
    pub fn into_leaf(self) -> Certificate {
        self.leaf
    }

    /// Verifies this chain against `trust` at `at`
    /// ([`TrustBundle::verify_chain`]).
    pub fn verify(&self, trust: &TrustBundle, at: Timestamp) -> Result<VerifiedChain> {
        trust.verify_chain(&self.leaf, &self.intermediates, at)
    }
}

/// The one trust-digest function: SHA-256 over the concatenation of the DER
/// certificates in order.
pub fn trust_digest<'a>(ders: impl IntoIterator<Item = &'a [u8]>) -> Sha256Digest {
    Sha256Digest::of_parts(ders)
}

/// SHA-256 over a certificate's DER (the `certificateDigest`).
pub fn certificate_digest(der: &[u8]) -> Sha256Digest {
    Sha256Digest::of(der)
}

#[cfg(test)]
mod tests;
