//! The PKCS#10 parser: request bytes to [`RequestFacts`], or the [`Denial`]
//! naming what is wrong with the request itself.
//!
//! Encoding (strict PEM through `api`'s codec, then DER), key type and size
//! (through `api`'s one SPKI parser, under the [`Policy`]), signature
//! algorithm, self-signature, subject attributes, SANs and requested
//! extensions. No identity checks and no I/O: the fuzzer
//! (`examples/fuzz_csr.rs`) drives these functions directly, and every
//! error is one of the request-level [`Denial`] reasons.

use kube_ovn_ipsec_api::pki::{
    PEM_CERTIFICATE_REQUEST, SpkiKey, ipsec_tunnel_eku_dotted, parse_pem_blocks,
};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_NIST_EC_P384, OID_PKCS1_SHA256WITHRSA, OID_PKCS1_SHA384WITHRSA, OID_PKCS1_SHA512WITHRSA,
    OID_SIG_ECDSA_WITH_SHA256, OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
};
use x509_parser::prelude::FromDer;

use crate::denial::Denial;
use crate::policy::Policy;

/// The key algorithm of a validated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// RSA with the given modulus size in bits.
    Rsa(usize),
    /// ECDSA on NIST P-256.
    EcdsaP256,
}

/// The facts a PKCS#10 request states, once parsed and its signature verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    /// Subject attributes in order, as (short name, value).
    pub subject: Vec<(String, String)>,
    /// DNS SANs.
    pub dns_sans: Vec<String>,
    /// Key algorithm.
    pub key_kind: KeyKind,
    /// subjectPublicKey bits.
    pub public_key: Vec<u8>,
    /// DER SubjectPublicKeyInfo.
    pub spki_der: Vec<u8>,
}

/// Requests larger than this are refused before parsing: an RSA-4096 request
/// is about 1.7 KiB of PEM, so 16 KiB is generous and bounds the work an
/// attacker can cause.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// Parses and checks a PEM PKCS#10 request on its own (no identity checks):
/// encoding, key type and size, signature algorithm, self-signature, and the
/// requested extensions. Never panics, whatever the input (fuzzed).
pub fn inspect_request(pem_bytes: &[u8], policy: &Policy) -> Result<RequestFacts, Denial> {
    if pem_bytes.len() > MAX_REQUEST_BYTES {
        return Err(Denial::MalformedRequest {
            detail: "request larger than 16 KiB",
        });
    }
    // api's strict codec: text around the block, headers or bad base64
    // make the request malformed, not "the block inside it".
    let blocks = parse_pem_blocks(pem_bytes).map_err(|_| Denial::MalformedRequest {
        detail: "request is not valid PEM",
    })?;
    let der = match blocks.as_slice() {
        [one] if one.label == PEM_CERTIFICATE_REQUEST => one.der.as_slice(),
        [_] => {
            return Err(Denial::MalformedRequest {
                detail: "PEM block is not a CERTIFICATE REQUEST",
            });
        }
        _ => {
            return Err(Denial::MalformedRequest {
                detail: "request must hold exactly one PEM block",
            });
        }
    };
    inspect_der(der, policy)
}

/// Like [`inspect_request`] for DER input.
pub fn inspect_der(der: &[u8], policy: &Policy) -> Result<RequestFacts, Denial> {
    let (rest, csr) =
        X509CertificationRequest::from_der(der).map_err(|_| Denial::MalformedRequest {
            detail: "request is not a PKCS#10 DER structure",
        })?;
    if !rest.is_empty() {
        return Err(Denial::MalformedRequest {
            detail: "trailing bytes after the request",
        });
    }
    let info = &csr.certification_request_info;
    if info.version.0 != 0 {
        return Err(Denial::MalformedRequest {
            detail: "request version is not v1",
        });
    }

    // Key first: a too-small RSA key would also fail signature verification
    // (the verifier refuses < 2048 bits), and the operator deserves the real
    // reason.
    let spki = &info.subject_pki;
    let key = SpkiKey::from_spki(spki).map_err(|_| Denial::MalformedRequest {
        detail: "RSA public key does not parse",
    })?;
    let key_kind = match key {
        SpkiKey::Rsa { bits, exponent } => {
            if !policy.rsa_bits.contains(&bits) || exponent != Some(65537) {
                return Err(Denial::KeySize { bits });
            }
            KeyKind::Rsa(bits)
        }
        SpkiKey::EcdsaP256 { uncompressed: true } => KeyKind::EcdsaP256,
        SpkiKey::EcdsaP256 {
            uncompressed: false,
        } => {
            return Err(Denial::MalformedRequest {
                detail: "P-256 point is not uncompressed",
            });
        }
        SpkiKey::EcdsaP384 => {
            return Err(Denial::UnsupportedKeyType {
                detail: format!("EC curve {}", OID_NIST_EC_P384.to_id_string()),
            });
        }
        SpkiKey::OtherCurve { curve } => {
            return Err(Denial::UnsupportedKeyType {
                detail: format!("EC curve {}", curve.as_deref().unwrap_or("(none)")),
            });
        }
        SpkiKey::OtherAlgorithm { algorithm } => {
            return Err(Denial::UnsupportedKeyType {
                detail: format!("key algorithm {algorithm}"),
            });
        }
        // SpkiKey is non-exhaustive: a key type added there is not one
        // this signer issues for.
        _ => {
            return Err(Denial::UnsupportedKeyType {
                detail: "key type not allowed".into(),
            });
        }
    };

    let sig = &csr.signature_algorithm.algorithm;
    let sig_ok = match key_kind {
        KeyKind::Rsa(_) => {
            *sig == OID_PKCS1_SHA256WITHRSA
                || *sig == OID_PKCS1_SHA384WITHRSA
                || *sig == OID_PKCS1_SHA512WITHRSA
        }
        KeyKind::EcdsaP256 => *sig == OID_SIG_ECDSA_WITH_SHA256,
    };
    if !sig_ok {
        return Err(Denial::SignatureAlgorithm {
            oid: sig.to_id_string(),
        });
    }
    csr.verify_signature()
        .map_err(|_| Denial::SignatureInvalid)?;

    let mut subject = Vec::new();
    for rdn in info.subject.iter_rdn() {
        // Multi-valued RDNs are legal X.509 but nothing we issue uses them;
        // refusing them keeps "exactly O and CN" unambiguous.
        let mut attrs = rdn.iter();
        let (Some(attr), None) = (attrs.next(), attrs.next()) else {
            return Err(Denial::Subject {
                detail: "multi-valued RDN".into(),
            });
        };
        let ty = if *attr.attr_type() == OID_X509_COMMON_NAME {
            "CN".to_owned()
        } else if *attr.attr_type() == OID_X509_ORGANIZATION_NAME {
            "O".to_owned()
        } else {
            attr.attr_type().to_id_string()
        };
        let value = attr.as_str().map_err(|_| Denial::Subject {
            detail: format!("{ty} is not a string"),
        })?;
        subject.push((ty, value.to_owned()));
    }

    let ipsec_eku = ipsec_tunnel_eku_dotted();
    let mut dns_sans = Vec::new();
    let mut saw_extension_request = false;
    for attr in info.iter_attributes() {
        match attr.parsed_attribute() {
            ParsedCriAttribute::ExtensionRequest(req) if !saw_extension_request => {
                saw_extension_request = true;
                for ext in &req.extensions {
                    match ext.parsed_extension() {
                        ParsedExtension::SubjectAlternativeName(san) => {
                            for name in &san.general_names {
                                match name {
                                    GeneralName::DNSName(d) => dns_sans.push((*d).to_owned()),
                                    GeneralName::IPAddress(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "IP address SAN".into(),
                                        });
                                    }
                                    GeneralName::URI(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "URI SAN".into(),
                                        });
                                    }
                                    GeneralName::RFC822Name(_) => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "email SAN".into(),
                                        });
                                    }
                                    _ => {
                                        return Err(Denial::SubjectAltNames {
                                            detail: "SAN of another type".into(),
                                        });
                                    }
                                }
                            }
                        }
                        ParsedExtension::BasicConstraints(bc) => {
                            if bc.ca {
                                return Err(Denial::CaRequested);
                            }
                        }
                        // Requested key usages and extended key usages are
                        // accepted only if harmless: the signer writes the
                        // leaf's usages itself and copies nothing else.
                        ParsedExtension::KeyUsage(ku) => {
                            if ku.key_cert_sign() || ku.crl_sign() {
                                return Err(Denial::CaRequested);
                            }
                        }
                        ParsedExtension::ExtendedKeyUsage(eku) => {
                            let only_ipsec = !eku.any
                                && !eku.server_auth
                                && !eku.client_auth
                                && !eku.code_signing
                                && !eku.email_protection
                                && !eku.time_stamping
                                && !eku.ocsp_signing
                                && eku.other.iter().all(|o| o.to_id_string() == ipsec_eku);
                            if !only_ipsec {
                                return Err(Denial::UnexpectedExtension {
                                    oid: format!("{} (extended key usage)", ext.oid.to_id_string()),
                                });
                            }
                        }
                        _ => {
                            return Err(Denial::UnexpectedExtension {
                                oid: ext.oid.to_id_string(),
                            });
                        }
                    }
                }
            }
            _ => {
                return Err(Denial::UnexpectedExtension {
                    oid: attr.oid.to_id_string(),
                });
            }
        }
    }

    Ok(RequestFacts {
        subject,
        dns_sans,
        key_kind,
        public_key: spki.subject_public_key.data.to_vec(),
        spki_der: spki.raw.to_vec(),
    })
}

#[cfg(test)]
mod tests;
