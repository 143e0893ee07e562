//! The built-in signer: a CA whose key lives in Secret `ovn-ipsec-ca`.
//!
//! A leaf is built from scratch out of a [`ValidatedCsr`]: only the public
//! key and the validated chassis come from the request; nothing else the
//! node asked for (extensions, subject spelling) is copied.
//!
//! The leaf follows [`crate::profile`] (subject, SAN, validity, key usages,
//! the `ipsec tunnel` EKU, `CA:FALSE`); this module adds what only an
//! issuer knows: an authority key identifier (so peers pick the right CA
//! while a rotation puts two in the bundle) and a random 128-bit serial.

use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::clock::unix_seconds;
use kube_ovn_ipsec_api::pki::{Certificate, PEM_CERTIFICATE, parse_pem};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData, SanType, SerialNumber,
    SignatureAlgorithm,
};

use crate::error::{Error, Result};
use crate::names;
use crate::pkcs10::KeyKind;
use crate::profile::{self, BACKDATE};
use crate::validate::ValidatedCsr;

/// The CA Secret's certificate key, as errors name it.
const CERT: &str = names::CA_SECRET_CERT_KEY;
/// The CA Secret's private key key, as errors name it.
const KEY: &str = names::CA_SECRET_KEY_KEY;

/// The CA's key algorithm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CaKeyAlgorithm {
    /// ECDSA P-256: fast signing (the default; leaves may still be RSA).
    #[default]
    EcdsaP256,
    /// RSA-3072, for peers that cannot verify ECDSA signatures.
    Rsa3072,
}

/// The built-in CA: certificate and signing key.
pub struct CertificateAuthority {
    certificate: Certificate,
    issuer: Issuer<'static, KeyPair>,
    not_after: i64,
}

impl std::fmt::Debug for CertificateAuthority {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl CertificateAuthority {
    /// Generates a new self-signed CA valid from `now − 5 min` for `lifetime`.
    pub fn generate(alg: CaKeyAlgorithm, lifetime: Duration, now: SystemTime) -> Result<Self> {
        let key = match alg {
            CaKeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?,
            CaKeyAlgorithm::Rsa3072 => {
                KeyPair::generate_rsa_for(&PKCS_RSA_SHA256, rcgen::RsaKeySize::_3072)?
            }
        };
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, names::SUBJECT_ORGANIZATION);
        // The serial in the CN keeps two generations of CA distinguishable by
        // name in logs and in strongSwan's `ipsec listcacerts`.
        let serial = random_serial()?;
        dn.push(
            DnType::CommonName,
            format!("kube-ovn IPsec CA {}", hex::encode(&serial.to_bytes()[..4])),
        );
        params.distinguished_name = dn;
        params.serial_number = Some(serial);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = to_offset(now.checked_sub(BACKDATE).unwrap_or(now))?;
        params.not_after = to_offset(now + lifetime)?;
        let cert = params.self_signed(&key)?;
        Self::from_der_and_key(cert.der().to_vec(), key)
    }

    /// Loads a CA from its PEM certificate and PEM (PKCS#8) key: the CA
    /// Secret's `tls.crt` and `tls.key`, which its errors name (never
    /// what they hold).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let der = parse_pem(cert_pem.as_bytes(), PEM_CERTIFICATE)
            .ok()
            .and_then(|mut blocks| blocks.drain(..).next())
            .ok_or_else(|| {
                Error::CaSecretInvalid(format!("data[{CERT}] is not a PEM certificate"))
            })?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|_| Error::CaSecretInvalid(format!("data[{KEY}] is not a PEM private key")))?;
        Self::from_der_and_key(der, key)
    }

    fn from_der_and_key(cert_der: Vec<u8>, key: KeyPair) -> Result<Self> {
        let certificate = Certificate::from_der(&cert_der).map_err(|_| {
            Error::CaSecretInvalid(format!("data[{CERT}] does not parse as a certificate"))
        })?;
        if !certificate.is_ca() {
            return Err(Error::CaSecretInvalid(format!(
                "data[{CERT}] is not a CA certificate"
            )));
        }
        if certificate.subject_public_key_info() != key.subject_public_key_info().as_slice() {
            return Err(Error::CaSecretInvalid(format!(
                "data[{KEY}] does not match data[{CERT}]"
            )));
        }
        let not_after = certificate.not_after().unix();
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)?;
        Ok(Self {
            certificate,
            issuer,
            not_after,
        })
    }

    /// The CA certificate, parsed.
    pub fn certificate(&self) -> &Certificate {
        &self.certificate
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        self.certificate.der()
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.certificate.to_pem()
    }

    /// The CA key as PKCS#8 PEM, for the Secret only. Never log it.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA's `NotAfter`, seconds since the epoch.
    pub fn not_after_unix(&self) -> i64 {
        self.not_after
    }

    /// Issues the leaf for a validated request. Returns the certificate DER.
    pub fn sign(&self, csr: &ValidatedCsr, now: SystemTime) -> Result<Vec<u8>> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, names::SUBJECT_ORGANIZATION);
        dn.push(DnType::CommonName, csr.chassis.as_str());
        params.distinguished_name = dn;
        params.subject_alt_names = vec![SanType::DnsName(
            csr.chassis.clone().try_into().map_err(Error::Certificate)?,
        )];
        params.serial_number = Some(random_serial()?);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = profile::key_usages(csr.key_kind);
        params.extended_key_usages = profile::extended_key_usages();
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = profile::leaf_validity(now, csr.lifetime, self.not_after);
        params.not_before = from_unix(not_before)?;
        params.not_after = from_unix(not_after)?;
        let key = RequestKey {
            kind: csr.key_kind,
            bits: &csr.public_key,
        };
        Ok(params.signed_by(&key, &self.issuer)?.der().to_vec())
    }
}

/// The request's public key as rcgen needs it for the leaf's SPKI.
struct RequestKey<'a> {
    kind: KeyKind,
    bits: &'a [u8],
}

impl PublicKeyData for RequestKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.bits
    }

    // rcgen writes the SPKI algorithm identifier from the signature
    // algorithm's key OIDs: rsaEncryption/NULL or ecPublicKey/prime256v1,
    // which are exactly the two key types validation lets through.
    fn algorithm(&self) -> &'static SignatureAlgorithm {
        match self.kind {
            KeyKind::Rsa(_) => &PKCS_RSA_SHA256,
            KeyKind::EcdsaP256 => &PKCS_ECDSA_P256_SHA256,
        }
    }
}

fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| Error::Config("system random number generator failed".into()))?;
    // Positive and without a leading zero octet, as RFC 5280 asks.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

fn to_offset(t: SystemTime) -> Result<time::OffsetDateTime> {
    from_unix(unix_seconds(t))
}

fn from_unix(secs: i64) -> Result<time::OffsetDateTime> {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .map_err(|_| Error::Config("time out of the representable range".into()))
}

#[cfg(test)]
mod tests;
