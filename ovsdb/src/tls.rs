//! `ssl:HOST:PORT` remotes as OVS speaks them: mutual TLS with a private
//! key, a certificate and a CA certificate in PEM files (ovs-pki's layout,
//! and what Kube-OVN mounts for `ENABLE_SSL`).
//!
//! The server's certificate must chain to the CA file's certificates and
//! be valid now; its host name is not checked. That is OVS's own rule
//! (stream-ssl verifies the peer against the CA and nothing else), and
//! OVN's database certificates are issued to a component, not to the
//! Service name or address a client dials — checking the name would
//! refuse every certificate ovs-pki signs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

/// The three PEM files of an `ssl:` remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This client's private key (PKCS#8, PKCS#1 or SEC1).
    pub private_key: PathBuf,
    /// This client's certificate (its chain may follow in the file).
    pub certificate: PathBuf,
    /// The CA certificate(s) the server's certificate must chain to.
    pub ca_cert: PathBuf,
}

impl TlsFiles {
    /// The rustls client configuration, read from the files now (so a
    /// reconnect picks up rotated files). The reason of an error names
    /// the file.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let ca = read(&self.ca_cert, "CA certificate")?;
        let mut roots = rustls::RootCertStore::empty();
        let mut found = 0;
        for cert in CertificateDer::pem_slice_iter(&ca) {
            let cert = cert.map_err(|e| bad(&self.ca_cert, "CA certificate", e))?;
            roots
                .add(cert)
                .map_err(|e| bad(&self.ca_cert, "CA certificate", e))?;
            found += 1;
        }
        if found == 0 {
            return Err(bad(&self.ca_cert, "CA certificate", "no certificate in it"));
        }
        let chain = read(&self.certificate, "certificate")?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&chain)
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&self.certificate, "certificate", e))?;
        if chain.is_empty() {
            return Err(bad(
                &self.certificate,
                "certificate",
                "no certificate in it",
            ));
        }
        let key = read(&self.private_key, "private key")?;
        let key = PrivateKeyDer::from_pem_slice(&key)
            .map_err(|e| bad(&self.private_key, "private key", e))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| bad(&self.ca_cert, "CA certificate", e))?;
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                format!(
                    "the private key {} does not fit the certificate {}: {e}",
                    self.private_key.display(),
                    self.certificate.display()
                )
            })?;
        Ok(Arc::new(config))
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("the {what} file {}: {e}", path.display()))
}

fn bad(path: &Path, what: &str, e: impl std::fmt::Display) -> String {
    format!("the {what} file {}: {e}", path.display())
}

/// WebPKI's chain, validity and signature checks, without the host name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // Checked after the chain: webpki reports a name mismatch
            // only for a certificate that chains and is valid now.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
