//! [`CsrApi`] over `certificates.k8s.io/v1` with kube-rs.

use std::time::Duration;

use actors::ports::{CsrApi, CsrOutcome, CsrRef, CsrSubmission};
use actors::{Error, Result};
use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

/// The CSR API of one cluster.
#[derive(Clone)]
pub struct KubeCsrApi {
    api: Api<CertificateSigningRequest>,
}

impl std::fmt::Debug for KubeCsrApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeCsrApi")
    }
}

impl KubeCsrApi {
    /// CSRs are cluster-scoped.
    pub fn new(client: Client) -> Self {
        KubeCsrApi {
            api: Api::all(client),
        }
    }
}

/// The outcome a CSR object shows, if any. Denied and Failed win over a
/// certificate: a signer never sets both, and refusing is the safe reading.
pub fn outcome_of(csr: &CertificateSigningRequest) -> Option<CsrOutcome> {
    let status = csr.status.as_ref()?;
    for c in status.conditions.iter().flatten() {
        if c.status != "True" {
            continue;
        }
        let reason = c.reason.clone().unwrap_or_default();
        let message = c.message.clone().unwrap_or_default();
        match c.type_.as_str() {
            "Denied" => return Some(CsrOutcome::Denied { reason, message }),
            "Failed" => return Some(CsrOutcome::Failed { reason, message }),
            _ => {}
        }
    }
    status
        .certificate
        .as_ref()
        .filter(|c| !c.0.is_empty())
        .map(|c| CsrOutcome::Issued {
            certificate_pem: c.0.clone(),
        })
}

fn api_err(e: kube::Error) -> Error {
    Error::CsrApi(e.to_string())
}

#[async_trait]
impl CsrApi for KubeCsrApi {
    async fn submit(&self, csr: &CsrSubmission) -> Result<CsrRef> {
        let object = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(csr.name.clone()),
                annotations: Some(csr.annotations.clone()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(csr.request_pem.clone()),
                signer_name: csr.signer_name.clone(),
                usages: Some(csr.usages.clone()),
                expiration_seconds: Some(i32::try_from(csr.expiration_seconds).unwrap_or(i32::MAX)),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        let created = match self.api.create(&PostParams::default(), &object).await {
            Ok(o) => o,
            // The name is derived from the request bytes, so an existing
            // object of that name is this agent's own earlier submission
            // (resumed after a restart).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.api.get(&csr.name).await.map_err(api_err)?
            }
            Err(e) => return Err(api_err(e)),
        };
        Ok(CsrRef {
            name: created.metadata.name.unwrap_or_else(|| csr.name.clone()),
            uid: created.metadata.uid.unwrap_or_default(),
        })
    }

    async fn wait(&self, name: &str, timeout: Duration) -> Result<CsrOutcome> {
        let cond =
            |o: Option<&CertificateSigningRequest>| o.is_none_or(|c| outcome_of(c).is_some());
        match tokio::time::timeout(timeout, await_condition(self.api.clone(), name, cond)).await {
            Err(_) => Ok(CsrOutcome::Pending),
            Ok(Err(e)) => Err(Error::CsrApi(e.to_string())),
            Ok(Ok(None)) => Ok(CsrOutcome::NotFound),
            Ok(Ok(Some(csr))) => Ok(outcome_of(&csr).unwrap_or(CsrOutcome::Pending)),
        }
    }
}
