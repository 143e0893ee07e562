//! Certificates, trust bundles and the digests everyone compares.
//!
//! * [`parse_pem`] is the one strict PEM reader: it rejects anything but
//!   well-formed blocks with the expected label separated by blank lines, and
//!   says why (with a line number, never the content).
//! * [`Certificate`] is an owned, pre-parsed X.509 certificate with the facts
//!   the agent and controller check: key algorithm, validity, subject, SANs,
//!   CA flag, and [`Certificate::digest`] = SHA-256 over the DER.
//! * [`TrustBundle`] is the `ovn-ipsec-trust` `ca.crt` content. Its digest is
//!   **SHA-256 over the concatenation of the DER certificates in bundle
//!   order** (SPEC §2). Concatenation is unambiguous without extra framing
//!   because every DER certificate is a self-delimiting SEQUENCE with its own
//!   length. Reordering the bundle changes the digest on purpose: the digest
//!   names exactly the file the monitor loaded.
//!
//! Signature checks use aws-lc-rs only, so one crypto library makes every
//! trust decision in this project.

use std::fmt;

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
    OID_PKCS1_SHA256WITHRSA, OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA,
    OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384,
};
use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509Certificate};
use x509_parser::public_key::PublicKey;

use crate::digest::Sha256Digest;
use crate::error::{Error, Result};
use crate::ident::{Chassis, Uid};
use crate::names::k8s;
use crate::time::Timestamp;

/// PEM label of a certificate block.
pub const PEM_CERTIFICATE: &str = "CERTIFICATE";
/// PEM label of a PKCS#8 private key block.
pub const PEM_PRIVATE_KEY: &str = "PRIVATE KEY";
/// PEM label of a PKCS#10 CSR block (what goes into CSR `spec.request`).
pub const PEM_CERTIFICATE_REQUEST: &str = "CERTIFICATE REQUEST";

/// Parses a PEM text that must consist only of `label` blocks and blank
/// lines, returning each block's DER in order.
///
/// Strict on purpose: a trust bundle with stray text is more likely a
/// truncated or mis-pasted file than a decorated one. Accepts LF or CRLF and
/// trailing spaces; rejects headers (`Proc-Type:`), other labels, bad or
/// unpadded base64, empty blocks, unterminated blocks and an input with no
/// block.
pub fn parse_pem(input: &[u8], label: &str) -> Result<Vec<Vec<u8>>> {
    let text = std::str::from_utf8(input).map_err(|_| Error::InvalidPem {
        reason: "input is not UTF-8".into(),
    })?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let bad = |line: usize, what: &str| Error::InvalidPem {
        reason: format!("line {line}: {what}"),
    };

    let mut blocks = Vec::new();
    // Some(start line, body) while inside a block.
    let mut open: Option<(usize, String)> = None;
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches(['\r', ' ', '\t']);
        match open.as_mut() {
            None if line.is_empty() => {}
            None if line == begin => open = Some((n, String::new())),
            None if line.starts_with("-----BEGIN ") => {
                return Err(bad(n, &format!("unexpected block, expected {label}")));
            }
            None => return Err(bad(n, "text outside a PEM block")),
            Some((start, body)) if line == end => {
                let der = STANDARD
                    .decode(body.as_bytes())
                    .map_err(|_| bad(*start, "block body is not valid padded base64"))?;
                if der.is_empty() {
                    return Err(bad(*start, "empty block"));
                }
                blocks.push(der);
                open = None;
            }
            Some(_) if line.starts_with("-----") => {
                return Err(bad(n, "unexpected boundary inside a block"));
            }
            Some((_, body)) => {
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
    if let Some((start, _)) = open {
        return Err(bad(start, "block is not terminated"));
    }
    if blocks.is_empty() {
        return Err(Error::InvalidPem {
            reason: format!("no {label} block"),
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
    not_before: Timestamp,
    not_after: Timestamp,
    is_ca: bool,
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

impl Certificate {
    /// Parses one DER certificate. Rejects trailing bytes and keys other
    /// than RSA >= 2048, P-256 and P-384.
    pub fn from_der(der: &[u8]) -> Result<Self> {
        let (rest, x) = X509Certificate::from_der(der).map_err(bad_cert)?;
        if !rest.is_empty() {
            return Err(bad_cert("trailing bytes after the certificate"));
        }
        let spki = x.public_key();
        let key = if spki.algorithm.algorithm == OID_PKCS1_RSAENCRYPTION {
            let bits = match spki.parsed() {
                Ok(PublicKey::RSA(rsa)) => rsa.key_size(),
                _ => return Err(bad_cert("unparseable RSA public key")),
            };
            if bits < 2048 {
                return Err(Error::UnsupportedKey {
                    reason: format!("RSA-{bits} is shorter than 2048 bits"),
                });
            }
            KeyAlgorithm::Rsa { bits }
        } else if spki.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(c) if c == OID_EC_P256 => KeyAlgorithm::EcdsaP256,
                Some(c) if c == OID_NIST_EC_P384 => KeyAlgorithm::EcdsaP384,
                _ => {
                    return Err(Error::UnsupportedKey {
                        reason: "EC curve other than P-256/P-384".into(),
                    });
                }
            }
        } else {
            return Err(Error::UnsupportedKey {
                reason: format!("public key algorithm {}", spki.algorithm.algorithm),
            });
        };

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
            not_before,
            not_after,
            is_ca: x.is_ca(),
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

    /// The subject public key in the form aws-lc-rs verifies with.
    pub(crate) fn public_key_bytes(&self) -> &[u8] {
        &self.public_key
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
        let h = crate::csr::framed_digest(
            b"kube-ovn IPsec renewal v1\0",
            &[node_uid.as_str().as_bytes(), &self.der],
        );
        let mut first = [0u8; 8];
        first.copy_from_slice(&h.as_bytes()[..8]);
        let u = u128::from(u64::from_be_bytes(first));
        let lifetime = u128::try_from(self.not_after.secs_since(self.not_before)).unwrap_or(0);
        let start = lifetime * 2 / 5;
        let spread = lifetime / 5;
        let offset = start + ((u * spread) >> 64);
        self.not_before
            .plus_secs(i64::try_from(offset).unwrap_or(i64::MAX))
    }
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

    /// Fails unless `leaf` is valid at `now` and was issued directly by a
    /// certificate in this bundle that is itself valid at `now`.
    ///
    /// Intermediates are not followed: the bundle must contain the issuing
    /// CA, which keeps "what does this node trust" equal to "what is in
    /// `ca.crt`".
    pub fn verify_leaf(&self, leaf: &Certificate, now: Timestamp) -> Result<()> {
        leaf.check_valid_at(now)?;
        let issued = self
            .certificates
            .iter()
            .any(|ca| ca.check_valid_at(now).is_ok() && leaf.verify_issued_by(ca).is_ok());
        if issued {
            Ok(())
        } else {
            Err(Error::Untrusted)
        }
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
