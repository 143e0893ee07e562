//! The server's own CA and serving certificate (rcgen), and its rustls config.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::Error;

/// The CA and serving certificate of one server run.
#[derive(Debug)]
pub struct ServerPki {
    /// CA certificate, PEM (goes into kubeconfigs as certificate-authority-data).
    pub ca_pem: String,
    /// Serving certificate chain, DER.
    pub chain: Vec<CertificateDer<'static>>,
    /// Serving key, PKCS#8 DER.
    pub key_der: Vec<u8>,
}

impl ServerPki {
    /// A fresh CA and a serving certificate for `localhost`, 127.0.0.1 and ::1.
    pub fn generate() -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "kube-ovn-ipsec-lab-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(ServerPki {
            ca_pem: ca_cert.pem(),
            chain: vec![cert.der().clone(), ca_cert.der().clone()],
            key_der: key.serialize_der(),
        })
    }

    /// The rustls server configuration (aws-lc-rs provider, h2 and http/1.1).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone())),
            )?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_usable_config() {
        let pki = ServerPki::generate().unwrap();
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        pki.server_config().unwrap();
    }
}
