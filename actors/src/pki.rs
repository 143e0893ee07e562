//! The agent's side of the PKI: key generation, the CSR, and the checks an
//! issued certificate must pass before it may be activated. Parsing,
//! chain verification and digests come from `kube_ovn_ipsec_api::pki`.

use std::fmt;

use kube_ovn_ipsec_api::ident::Chassis;
use kube_ovn_ipsec_api::names::k8s::SUBJECT_ORGANIZATION;
use kube_ovn_ipsec_api::pki::{
    Certificate, CertificateChain, LEAF_BACKDATE, LEAF_LIFETIME_SLACK, TrustBundle,
};
use kube_ovn_ipsec_api::time::Timestamp;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Which key the agent generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyType {
    /// RSA-2048: the default, and the only type OVS 3.1's ovs-monitor-ipsec
    /// loads into strongSwan.
    #[default]
    Rsa2048,
    /// ECDSA P-256.
    EcdsaP256,
}

/// A private key. Debug never prints it.
pub struct PrivateKey(KeyPair);

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey(sha256:{})", self.digest_hex())
    }
}

impl PrivateKey {
    /// Generates a new key.
    pub fn generate(kind: KeyType) -> Result<Self> {
        let kp = match kind {
            KeyType::Rsa2048 => {
                KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
            }
            KeyType::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        }
        .map_err(|e| Error::KeyGeneration(e.to_string()))?;
        Ok(PrivateKey(kp))
    }

    /// Loads a PKCS#8 PEM key.
    pub fn from_pem(pem: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(pem)
            .map_err(|_| Error::KeyGeneration("private key is not UTF-8 PEM".into()))?;
        KeyPair::from_pem(text)
            .map(PrivateKey)
            .map_err(|e| Error::KeyGeneration(format!("private key unreadable: {e}")))
    }

    /// PKCS#8 PEM, for the 0600 key file only.
    pub fn to_pem(&self) -> String {
        self.0.serialize_pem()
    }

    /// SHA-256 hex over the PKCS#8 DER: the key digest of the CSR binding.
    pub fn digest_hex(&self) -> String {
        hex::encode(Sha256::digest(self.0.serialize_der()))
    }

    /// The raw subject public key (the SPKI BIT STRING content).
    pub fn public_key_raw(&self) -> &[u8] {
        self.0.public_key_raw()
    }

    /// Builds the CSR (PEM): subject `O=kube-ovn, CN=<chassis>`, exactly one
    /// SAN `DNS:<chassis>`.
    pub fn csr_pem(&self, chassis: &Chassis) -> Result<String> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, SUBJECT_ORGANIZATION);
        dn.push(DnType::CommonName, chassis.as_str());
        params.distinguished_name = dn;
        let san = chassis
            .as_str()
            .to_owned()
            .try_into()
            .map_err(|e: rcgen::Error| Error::KeyGeneration(format!("chassis as DNS SAN: {e}")))?;
        params.subject_alt_names = vec![SanType::DnsName(san)];
        let csr = params
            .serialize_request(&self.0)
            .map_err(|e| Error::KeyGeneration(format!("CSR: {e}")))?;
        csr.pem()
            .map_err(|e| Error::KeyGeneration(format!("CSR PEM: {e}")))
    }
}

/// Why an issued certificate was rejected: short, no key material.
fn reject(reason: impl fmt::Display) -> Error {
    Error::CertificateRejected(reason.to_string())
}

/// Everything an issued certificate must satisfy before activation:
/// it is for `key`, names exactly `chassis`, chains to `trust` (through
/// the intermediates that came with it, by `api`'s one chain verifier), is
/// valid now and its lifetime is sane (positive, not beyond what was
/// requested plus the signer's backdate and slack, api's
/// `LEAF_BACKDATE` and `LEAF_LIFETIME_SLACK`).
pub fn verify_issued(
    issued_pem: &[u8],
    key: &PrivateKey,
    chassis: &Chassis,
    trust: &TrustBundle,
    now: Timestamp,
    requested_lifetime_secs: u32,
) -> Result<Certificate> {
    // The CSR status may carry a chain: the leaf comes first.
    let chain = CertificateChain::from_pem(issued_pem)
        .map_err(|e| reject(format!("status.certificate: {e}")))?;
    let cert = chain.leaf();
    if cert.public_key_bytes() != key.public_key_raw() {
        return Err(reject("certificate is not for the pending key"));
    }
    cert.check_chassis_identity(chassis).map_err(reject)?;
    chain
        .verify(trust, now)
        .map_err(|e| reject(format!("does not verify against the trust bundle: {e}")))?;
    let lifetime = cert.not_after().secs_since(cert.not_before());
    let max = i64::from(requested_lifetime_secs)
        + i64::try_from((LEAF_BACKDATE + LEAF_LIFETIME_SLACK).as_secs()).unwrap_or(i64::MAX);
    if lifetime <= 0 || lifetime > max {
        return Err(reject(format!("lifetime {lifetime}s outside (0, {max}s]")));
    }
    Ok(chain.into_leaf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_prints_key() {
        let k = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
        let dbg = format!("{k:?}");
        assert!(!dbg.contains("BEGIN"));
        assert!(dbg.starts_with("PrivateKey(sha256:"));
        let again = PrivateKey::from_pem(k.to_pem().as_bytes()).unwrap();
        assert_eq!(again.digest_hex(), k.digest_hex());
    }

    #[test]
    fn csr_names_chassis() {
        let k = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
        let chassis = Chassis::new("node-1-chassis").unwrap();
        let pem = k.csr_pem(&chassis).unwrap();
        let parsed = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
        let sans = &parsed.params.subject_alt_names;
        assert_eq!(sans.len(), 1);
        assert!(matches!(&sans[0], SanType::DnsName(n) if n.as_str() == "node-1-chassis"));
    }

    #[test]
    fn rsa_is_2048() {
        let k = PrivateKey::generate(KeyType::Rsa2048).unwrap();
        assert!(k.to_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
    }
}
