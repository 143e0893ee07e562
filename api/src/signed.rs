//! Detached signatures over canonical JSON, and the annotation form.
//!
//! # What is signed
//!
//! `message = DOMAIN || payload`, where `payload` is the canonical JSON
//! ([`crate::canonical`]) of the document and `DOMAIN` is the document
//! kind's domain-separation prefix ([`SignedPayload::DOMAIN`]), e.g.
//! `"kube-ovn IPsec coordination receipt v1\0"`. The prefix keeps a signature
//! made for one kind of document (or by some other tool holding the same
//! key) from being replayed as another.
//!
//! # Algorithms
//!
//! | name in the envelope   | key                  | scheme |
//! | ---------------------- | -------------------- | ------ |
//! | `rsa-pkcs1v15-sha256`  | RSA >= 2048 bits     | RSASSA-PKCS1-v1_5 with SHA-256 |
//! | `ecdsa-p256-sha256`    | ECDSA P-256          | ECDSA with SHA-256, signature ASN.1 DER `Ecdsa-Sig-Value` |
//!
//! The verifier takes the algorithm from the certificate's key and requires
//! the envelope to name the same one, so the envelope cannot steer it.
//!
//! # Annotation form
//!
//! ```text
//! base64url(payload) "." algorithm-name "." base64url(signature)
//! ```
//!
//! base64url is RFC 4648 §5 without padding, decoded strictly (no padding,
//! no non-zero trailing bits), so one document has one spelling. The whole
//! string is capped ([`SignedPayload::MAX_ENCODED_LEN`]) and the cap is
//! checked before anything is decoded. The payload stays readable with
//! `cut -d. -f1 | basenc --base64url -d` for an operator.

use std::fmt;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    self, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _, RsaKeyPair, UnparsedPublicKey,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::canonical::{from_canonical_slice, to_canonical_vec};
use crate::error::{Error, Result};
use crate::pki::{Certificate, KeyAlgorithm, PEM_PRIVATE_KEY, parse_pem};

/// A signature scheme a signed document can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SignatureAlgorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256 (RSA keys, the default identity).
    RsaPkcs1Sha256,
    /// ECDSA P-256 with SHA-256, ASN.1 DER signature.
    EcdsaP256Sha256,
}

impl SignatureAlgorithm {
    /// The name used in the annotation envelope.
    pub fn name(self) -> &'static str {
        match self {
            SignatureAlgorithm::RsaPkcs1Sha256 => "rsa-pkcs1v15-sha256",
            SignatureAlgorithm::EcdsaP256Sha256 => "ecdsa-p256-sha256",
        }
    }

    /// Looks an envelope name up.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "rsa-pkcs1v15-sha256" => Some(SignatureAlgorithm::RsaPkcs1Sha256),
            "ecdsa-p256-sha256" => Some(SignatureAlgorithm::EcdsaP256Sha256),
            _ => None,
        }
    }

    /// The scheme a certificate's key verifies with, if any.
    pub fn for_key(key: KeyAlgorithm) -> Option<Self> {
        match key {
            KeyAlgorithm::Rsa { .. } => Some(SignatureAlgorithm::RsaPkcs1Sha256),
            KeyAlgorithm::EcdsaP256 => Some(SignatureAlgorithm::EcdsaP256Sha256),
            KeyAlgorithm::EcdsaP384 => None,
        }
    }
}

impl fmt::Display for SignatureAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

enum KeyInner {
    Rsa(RsaKeyPair),
    Ecdsa(EcdsaKeyPair),
}

/// A node's private key, loaded from PKCS#8, able to sign documents.
///
/// `Debug` shows the algorithm only; there is no way to get the key bytes
/// back out.
pub struct SigningKey {
    inner: KeyInner,
    rng: SystemRandom,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("algorithm", &self.algorithm())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Loads a PKCS#8 DER private key: ECDSA P-256, or RSA of at least 2048
    /// bits.
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self> {
        let rng = SystemRandom::new();
        if let Ok(k) = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der) {
            return Ok(SigningKey {
                inner: KeyInner::Ecdsa(k),
                rng,
            });
        }
        let k = RsaKeyPair::from_pkcs8(der).map_err(|e| Error::InvalidPrivateKey {
            reason: format!("neither P-256 nor RSA PKCS#8: {e}"),
        })?;
        if k.public_modulus_len() * 8 < 2048 {
            return Err(Error::UnsupportedKey {
                reason: "RSA key shorter than 2048 bits".into(),
            });
        }
        Ok(SigningKey {
            inner: KeyInner::Rsa(k),
            rng,
        })
    }

    /// Loads a PEM `PRIVATE KEY` (PKCS#8) block.
    pub fn from_pkcs8_pem(pem: &[u8]) -> Result<Self> {
        let mut blocks = parse_pem(pem, PEM_PRIVATE_KEY)?;
        match (blocks.pop(), blocks.is_empty()) {
            (Some(der), true) => SigningKey::from_pkcs8_der(&der),
            _ => Err(Error::InvalidPem {
                reason: "expected exactly one private key".into(),
            }),
        }
    }

    /// The scheme this key signs with.
    pub fn algorithm(&self) -> SignatureAlgorithm {
        match self.inner {
            KeyInner::Rsa(_) => SignatureAlgorithm::RsaPkcs1Sha256,
            KeyInner::Ecdsa(_) => SignatureAlgorithm::EcdsaP256Sha256,
        }
    }

    /// Whether `cert` carries this key's public half: the check that an
    /// issued certificate belongs to the pending key before activation.
    pub fn matches_certificate(&self, cert: &Certificate) -> bool {
        let public: &[u8] = match &self.inner {
            KeyInner::Rsa(k) => k.public_key().as_ref(),
            KeyInner::Ecdsa(k) => k.public_key().as_ref(),
        };
        public == cert.public_key_bytes()
    }

    /// Signs `message` as is (callers add the domain prefix).
    fn sign_raw(&self, message: &[u8]) -> Result<Vec<u8>> {
        match &self.inner {
            KeyInner::Rsa(k) => {
                let mut sig = vec![0u8; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &self.rng, message, &mut sig)
                    .map_err(|_| Error::SigningFailed)?;
                Ok(sig)
            }
            KeyInner::Ecdsa(k) => k
                .sign(&self.rng, message)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| Error::SigningFailed),
        }
    }
}

/// A document kind that travels signed.
pub trait SignedPayload: Serialize + DeserializeOwned {
    /// Domain-separation prefix prepended to the payload before signing.
    const DOMAIN: &'static [u8];
    /// Cap on the whole annotation string, in bytes.
    const MAX_ENCODED_LEN: usize;

    /// Semantic checks run after decoding (e.g. a version field). Default:
    /// none.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

fn message<T: SignedPayload>(payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(T::DOMAIN.len() + payload.len());
    m.extend_from_slice(T::DOMAIN);
    m.extend_from_slice(payload);
    m
}

/// Signs `doc` with `key` and returns the annotation value.
pub fn sign<T: SignedPayload>(doc: &T, key: &SigningKey) -> Result<String> {
    doc.validate()?;
    let payload = to_canonical_vec(doc)?;
    let sig = key.sign_raw(&message::<T>(&payload))?;
    let out = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(&payload),
        key.algorithm().name(),
        URL_SAFE_NO_PAD.encode(&sig)
    );
    if out.len() > T::MAX_ENCODED_LEN {
        return Err(Error::TooLarge {
            len: out.len(),
            max: T::MAX_ENCODED_LEN,
        });
    }
    Ok(out)
}

/// A decoded but not yet verified document. The only way to the payload
/// for decisions is [`Unverified::verify`]; [`Unverified::peek`] exists for
/// finding which certificate to verify with.
#[derive(Debug, Clone)]
pub struct Unverified<T> {
    payload_bytes: Vec<u8>,
    algorithm: SignatureAlgorithm,
    signature: Vec<u8>,
    doc: T,
}

/// Decodes an annotation value without verifying it. Never panics; every
/// rejection is a typed [`Error`].
pub fn decode<T: SignedPayload>(annotation: &str) -> Result<Unverified<T>> {
    if annotation.len() > T::MAX_ENCODED_LEN {
        return Err(Error::TooLarge {
            len: annotation.len(),
            max: T::MAX_ENCODED_LEN,
        });
    }
    let malformed = |reason: &str| Error::MalformedEnvelope {
        reason: reason.into(),
    };
    let mut parts = annotation.split('.');
    let (Some(p), Some(a), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("expected payload.algorithm.signature"));
    };
    let algorithm =
        SignatureAlgorithm::from_name(a).ok_or_else(|| malformed("unknown signature algorithm"))?;
    let payload_bytes = URL_SAFE_NO_PAD
        .decode(p)
        .map_err(|_| malformed("payload is not base64url"))?;
    let signature = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| malformed("signature is not base64url"))?;
    if signature.is_empty() {
        return Err(malformed("empty signature"));
    }
    let doc: T = from_canonical_slice(&payload_bytes)?;
    doc.validate()?;
    Ok(Unverified {
        payload_bytes,
        algorithm,
        signature,
        doc,
    })
}

impl<T: SignedPayload> Unverified<T> {
    /// The unverified payload. Use it only to choose a certificate; decide
    /// nothing on it.
    pub fn peek(&self) -> &T {
        &self.doc
    }

    /// The algorithm the envelope names.
    pub fn algorithm(&self) -> SignatureAlgorithm {
        self.algorithm
    }

    /// Verifies the signature with `cert`'s public key and returns the
    /// payload. Does not check the certificate's chain, validity or name:
    /// that is [`crate::pki::TrustBundle::verify_leaf`] and
    /// [`Certificate::check_chassis_identity`].
    pub fn verify(self, cert: &Certificate) -> Result<T> {
        let expected = SignatureAlgorithm::for_key(cert.key_algorithm()).ok_or_else(|| {
            Error::AlgorithmMismatch {
                declared: self.algorithm.to_string(),
                certificate: cert.key_algorithm().to_string(),
            }
        })?;
        if expected != self.algorithm {
            return Err(Error::AlgorithmMismatch {
                declared: self.algorithm.to_string(),
                certificate: cert.key_algorithm().to_string(),
            });
        }
        let alg: &'static dyn signature::VerificationAlgorithm = match expected {
            SignatureAlgorithm::RsaPkcs1Sha256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            SignatureAlgorithm::EcdsaP256Sha256 => &signature::ECDSA_P256_SHA256_ASN1,
        };
        UnparsedPublicKey::new(alg, cert.public_key_bytes())
            .verify(&message::<T>(&self.payload_bytes), &self.signature)
            .map_err(|_| Error::BadSignature)?;
        Ok(self.doc)
    }
}

/// Decodes and verifies in one step.
pub fn verify<T: SignedPayload>(annotation: &str, cert: &Certificate) -> Result<T> {
    decode::<T>(annotation)?.verify(cert)
}

#[cfg(test)]
mod tests;
