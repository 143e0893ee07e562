//! The trust bundle: the CA certificates nodes trust, in order.
//!
//! Published as PEM in ConfigMap `ovn-ipsec-trust` (key `ca.crt`). During a CA
//! rotation it holds the old and the new CA. Its digest (SPEC §2) is SHA-256
//! over the DER certificates in order, hex-encoded.
//! The digest is `api`'s one trust-digest function.

use std::time::SystemTime;

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{Error, Result};

/// PEM label of a certificate.
const CERT_PEM_LABEL: &str = "CERTIFICATE";
/// Longest chain (leaf excluded) accepted from an external issuer.
const MAX_CHAIN_DEPTH: usize = 4;

/// An ordered list of trusted CA certificates (DER).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustBundle {
    certs: Vec<Vec<u8>>,
}

impl TrustBundle {
    /// A bundle of the given DER certificates, in order.
    pub fn new(certs: Vec<Vec<u8>>) -> Self {
        Self { certs }
    }

    /// Parses a PEM bundle; every block must be a parseable CA certificate.
    pub fn from_pem(pem_text: &str) -> Result<Self> {
        let certs = parse_cert_pems(pem_text)?;
        if certs.is_empty() {
            return Err(Error::TrustBundleInvalid("no certificate in bundle".into()));
        }
        for der in &certs {
            let (_, cert) = X509Certificate::from_der(der)
                .map_err(|_| Error::TrustBundleInvalid("certificate does not parse".into()))?;
            if !cert.is_ca() {
                return Err(Error::TrustBundleInvalid(
                    "bundle holds a non-CA certificate".into(),
                ));
            }
        }
        Ok(Self { certs })
    }

    /// The DER certificates, in order.
    pub fn certs(&self) -> &[Vec<u8>] {
        &self.certs
    }

    /// The bundle as concatenated PEM blocks.
    pub fn to_pem(&self) -> String {
        self.certs.iter().map(|der| der_to_pem(der)).collect()
    }

    /// SHA-256 over the DER certificates in order, lower-case hex (SPEC §2).
    pub fn digest(&self) -> String {
        kube_ovn_ipsec_api::pki::trust_digest(self.certs.iter().map(Vec::as_slice)).to_hex()
    }

    /// Whether the bundle holds this certificate.
    pub fn contains(&self, der: &[u8]) -> bool {
        self.certs.iter().any(|c| c == der)
    }

    /// Appends a certificate unless already present. Returns whether it was added.
    pub fn add(&mut self, der: Vec<u8>) -> bool {
        if self.contains(&der) {
            return false;
        }
        self.certs.push(der);
        true
    }

    /// Keeps only `keep`; the other CAs leave the bundle.
    pub fn retain_only(&mut self, keep: &[u8]) {
        self.certs.retain(|c| c == keep);
    }

    /// Verifies that `leaf` (DER) chains to a CA in this bundle at `now`,
    /// optionally through `intermediates` (DER, any order). Every certificate
    /// on the path must be within its validity, and every issuer a CA.
    pub fn verifies(&self, leaf: &[u8], intermediates: &[Vec<u8>], now: SystemTime) -> bool {
        let now = unix_seconds(now);
        let Ok((rest, mut current)) = X509Certificate::from_der(leaf) else {
            return false;
        };
        if !rest.is_empty() || !within(&current, now) {
            return false;
        }
        let anchors: Vec<X509Certificate<'_>> = self
            .certs
            .iter()
            .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
            .collect();
        let inter: Vec<X509Certificate<'_>> = intermediates
            .iter()
            .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
            .collect();
        for _ in 0..=MAX_CHAIN_DEPTH {
            if anchors.iter().any(|a| signs(a, &current, now)) {
                return true;
            }
            match inter.iter().find(|i| signs(i, &current, now)) {
                Some(next) => current = next.clone(),
                None => return false,
            }
        }
        false
    }
}

fn signs(issuer: &X509Certificate<'_>, child: &X509Certificate<'_>, now: i64) -> bool {
    issuer.is_ca()
        && within(issuer, now)
        && issuer.subject().as_raw() == child.issuer().as_raw()
        && child.verify_signature(Some(issuer.public_key())).is_ok()
}

fn within(cert: &X509Certificate<'_>, now: i64) -> bool {
    let v = cert.validity();
    v.not_before.timestamp() <= now && now <= v.not_after.timestamp()
}

/// Seconds since the epoch (negative before it; saturating).
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// DER certificate to one PEM block.
pub fn der_to_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(CERT_PEM_LABEL, der.to_vec()))
}

/// Parses every `CERTIFICATE` block of a PEM text; any other block is an error.
pub fn parse_cert_pems(pem_text: &str) -> Result<Vec<Vec<u8>>> {
    let blocks =
        pem::parse_many(pem_text).map_err(|_| Error::TrustBundleInvalid("not valid PEM".into()))?;
    blocks
        .into_iter()
        .map(|b| {
            if b.tag() == CERT_PEM_LABEL {
                Ok(b.into_contents())
            } else {
                Err(Error::TrustBundleInvalid(
                    "PEM block is not a CERTIFICATE".into(),
                ))
            }
        })
        .collect()
}
