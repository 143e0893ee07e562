//! The one SubjectPublicKeyInfo classifier: which key type a certificate or
//! a PKCS#10 request carries (RSA and its modulus size, or the EC curve).
//!
//! It states facts only. What is *acceptable* is a policy decision of the
//! caller: [`Certificate`](super::Certificate) accepts RSA >= 2048, P-256
//! and P-384 ([`SpkiKey::key_algorithm`]); the controller's CSR check
//! accepts its configured RSA sizes with exponent 65537 and P-256 only. Both
//! read the key through this one parser, so they can never disagree on what
//! a key *is*.

use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::KeyAlgorithm;
use crate::error::{Error, Result};

/// The key type a SubjectPublicKeyInfo declares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpkiKey {
    /// `rsaEncryption` with a parseable RSAPublicKey.
    Rsa {
        /// Modulus size in bits.
        bits: usize,
        /// The public exponent, or `None` when it does not fit in 64 bits.
        exponent: Option<u64>,
    },
    /// `ecPublicKey` on NIST P-256 (prime256v1).
    EcdsaP256 {
        /// The point is the 65-byte uncompressed form (`04 || X || Y`),
        /// the only one aws-lc-rs and strongSwan are given here.
        uncompressed: bool,
    },
    /// `ecPublicKey` on NIST P-384 (secp384r1).
    EcdsaP384,
    /// `ecPublicKey` on another or no named curve.
    OtherCurve {
        /// The curve OID, dotted, if the parameters name one.
        curve: Option<String>,
    },
    /// Another public key algorithm (Ed25519, DSA, ...).
    OtherAlgorithm {
        /// The algorithm OID, dotted.
        algorithm: String,
    },
}

impl SpkiKey {
    /// Classifies a parsed SubjectPublicKeyInfo. Fails only when the
    /// algorithm is RSA but the key inside does not parse.
    pub fn from_spki(spki: &SubjectPublicKeyInfo<'_>) -> Result<Self> {
        let alg = &spki.algorithm.algorithm;
        if *alg == OID_PKCS1_RSAENCRYPTION {
            match spki.parsed() {
                Ok(PublicKey::RSA(rsa)) => Ok(SpkiKey::Rsa {
                    bits: rsa.key_size(),
                    exponent: rsa.try_exponent().ok(),
                }),
                _ => Err(Error::InvalidCertificate {
                    reason: "unparseable RSA public key".into(),
                }),
            }
        } else if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            Ok(match curve {
                Some(c) if c == OID_EC_P256 => {
                    let point = spki.subject_public_key.data.as_ref();
                    SpkiKey::EcdsaP256 {
                        uncompressed: point.len() == 65 && point[0] == 4,
                    }
                }
                Some(c) if c == OID_NIST_EC_P384 => SpkiKey::EcdsaP384,
                other => SpkiKey::OtherCurve {
                    curve: other.map(|c| c.to_id_string()),
                },
            })
        } else {
            Ok(SpkiKey::OtherAlgorithm {
                algorithm: alg.to_id_string(),
            })
        }
    }

    /// Classifies a DER SubjectPublicKeyInfo (rejecting trailing bytes).
    pub fn from_der(der: &[u8]) -> Result<Self> {
        let (rest, spki) =
            SubjectPublicKeyInfo::from_der(der).map_err(|e| Error::InvalidCertificate {
                reason: format!("SubjectPublicKeyInfo: {e}"),
            })?;
        if !rest.is_empty() {
            return Err(Error::InvalidCertificate {
                reason: "trailing bytes after the SubjectPublicKeyInfo".into(),
            });
        }
        Self::from_spki(&spki)
    }

    /// The key as a [`KeyAlgorithm`] under the certificate policy: RSA of
    /// at least 2048 bits, P-256 or P-384; anything else is
    /// [`Error::UnsupportedKey`].
    pub fn key_algorithm(&self) -> Result<KeyAlgorithm> {
        match self {
            SpkiKey::Rsa { bits, .. } if *bits >= 2048 => Ok(KeyAlgorithm::Rsa { bits: *bits }),
            SpkiKey::Rsa { bits, .. } => Err(Error::UnsupportedKey {
                reason: format!("RSA-{bits} is shorter than 2048 bits"),
            }),
            SpkiKey::EcdsaP256 { .. } => Ok(KeyAlgorithm::EcdsaP256),
            SpkiKey::EcdsaP384 => Ok(KeyAlgorithm::EcdsaP384),
            SpkiKey::OtherCurve { .. } => Err(Error::UnsupportedKey {
                reason: "EC curve other than P-256/P-384".into(),
            }),
            SpkiKey::OtherAlgorithm { algorithm } => Err(Error::UnsupportedKey {
                reason: format!("public key algorithm {algorithm}"),
            }),
        }
    }
}
