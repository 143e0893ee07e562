//! The built-in signer: a CA whose key lives in Secret `ovn-ipsec-ca`.
//!
//! A leaf is built from scratch out of a [`ValidatedCsr`]: only the public
//! key and the validated chassis come from the request; nothing else the
//! node asked for (extensions, subject spelling) is copied.
//!
//! Leaf profile (SPEC §6):
//! - subject `O=kube-ovn, CN=<chassis>`, one SAN `DNS:<chassis>`;
//! - `NotBefore = now − 5 min` (clock skew between nodes), `NotAfter = now +
//!   lifetime`, capped at the CA's own `NotAfter` so no leaf outlives its issuer;
//! - key usage `digitalSignature`, plus `keyEncipherment` for RSA keys;
//! - extended key usage `id-kp-ipsecTunnel` (1.3.6.1.5.5.7.3.6): the X.509
//!   meaning of the Kubernetes usage `ipsec tunnel`, as Kubernetes' own
//!   signers map it. strongSwan and libreswan do not require an EKU for IKE,
//!   and do not reject this one;
//! - `basicConstraints CA:FALSE`, an authority key identifier (so peers pick
//!   the right CA while a rotation puts two in the bundle), a random 128-bit serial.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData,
    SanType, SerialNumber, SignatureAlgorithm,
};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{Error, Result};
use crate::names;
use crate::trust::{der_to_pem, unix_seconds};
use crate::validate::{KeyKind, ValidatedCsr};

/// How far `NotBefore` is backdated to tolerate clock skew between nodes.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

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
    cert_der: Vec<u8>,
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

    /// Loads a CA from its PEM certificate and PEM (PKCS#8) key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let block = pem::parse(cert_pem)
            .map_err(|_| Error::CaSecretInvalid("certificate is not PEM".into()))?;
        let key = KeyPair::from_pem(key_pem)
            .map_err(|_| Error::CaSecretInvalid("key is not a PEM private key".into()))?;
        Self::from_der_and_key(block.into_contents(), key)
    }

    fn from_der_and_key(cert_der: Vec<u8>, key: KeyPair) -> Result<Self> {
        let (_, cert) = X509Certificate::from_der(&cert_der)
            .map_err(|_| Error::CaSecretInvalid("certificate does not parse".into()))?;
        if !cert.is_ca() {
            return Err(Error::CaSecretInvalid("certificate is not a CA".into()));
        }
        if cert.public_key().raw != key.subject_public_key_info().as_slice() {
            return Err(Error::CaSecretInvalid(
                "key does not match certificate".into(),
            ));
        }
        let not_after = cert.validity().not_after.timestamp();
        let issuer = Issuer::from_ca_cert_der(&cert_der.as_slice().into(), key)?;
        Ok(Self {
            cert_der,
            issuer,
            not_after,
        })
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        der_to_pem(&self.cert_der)
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
        params.key_usages = match csr.key_kind {
            KeyKind::Rsa(_) => {
                vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ]
            }
            KeyKind::EcdsaP256 => vec![KeyUsagePurpose::DigitalSignature],
        };
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::Other(IPSEC_TUNNEL_EKU.to_vec())];
        params.use_authority_key_identifier_extension = true;
        params.not_before = to_offset(now.checked_sub(BACKDATE).unwrap_or(now))?;
        let not_after = unix_seconds(now + csr.lifetime).min(self.not_after);
        params.not_after = from_unix(not_after)?;
        let key = RequestKey {
            kind: csr.key_kind,
            bits: &csr.public_key,
        };
        Ok(params.signed_by(&key, &self.issuer)?.der().to_vec())
    }
}

/// id-kp-ipsecTunnel arcs.
const IPSEC_TUNNEL_EKU: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 3, 6];

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
