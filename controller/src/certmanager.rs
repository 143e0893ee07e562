//! cert-manager mode: forward a validated CSR to the one dedicated ClusterIssuer.
//!
//! Only the controller creates `cert-manager.io/v1` CertificateRequests, in
//! its own namespace, after [`crate::validate::validate`] has passed. What
//! comes back is checked by the pure [`check_issued`] before anything is
//! copied into the CSR status: the request is the controller's own (the UID
//! its create call returned, its namespace, its ServiceAccount as requester,
//! the exact CSR bytes), it names the configured ClusterIssuer, the usages
//! are `[ipsec tunnel]`, the certificate carries the CSR's key, chassis and
//! no CA bit, its lifetime is within [`crate::profile`]'s bounds for what was
//! asked, and its chain (with any intermediates cert-manager returned)
//! verifies to the trust bundle through `api`'s one chain verifier — the
//! same one the agent applies. A CertificateRequest someone else created under the
//! same name is deleted and replaced, never read; one someone else approved
//! gains nothing, because approval is not what this path trusts.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use kube_ovn_ipsec_api::clock::timestamp;
use kube_ovn_ipsec_api::pki::{Certificate, CertificateChain, TrustBundle};

use crate::error::{Error, Rejection, Result};
use crate::names;
use crate::profile;
use crate::validate::ValidatedCsr;

/// cert-manager's API group.
pub const GROUP: &str = "cert-manager.io";
/// Label on each CertificateRequest naming the CSR UID it serves.
pub const CSR_UID_LABEL: &str = "kube-ovn.io/ipsec-csr-uid";

/// The configured cert-manager target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertManagerConfig {
    /// The controller's namespace: the only place it creates CertificateRequests.
    pub namespace: String,
    /// The dedicated ClusterIssuer.
    pub issuer_name: String,
    /// The controller's own `spec.username` as cert-manager's webhook stamps it
    /// (`system:serviceaccount:<ns>:<controller sa>`).
    pub requester: String,
}

/// A CertificateRequest as read back from the API (the fields checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateRequestView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The [`CSR_UID_LABEL`] label.
    pub csr_uid_label: Option<String>,
    /// `spec.issuerRef.name`.
    pub issuer_name: String,
    /// `spec.issuerRef.kind`.
    pub issuer_kind: String,
    /// `spec.issuerRef.group`.
    pub issuer_group: String,
    /// `spec.username` (stamped by cert-manager's webhook).
    pub username: String,
    /// `spec.usages`.
    pub usages: Vec<String>,
    /// `spec.request`, decoded (PEM bytes).
    pub request: Vec<u8>,
    /// `status.certificate`, decoded (PEM chain), once issued.
    pub certificate: Option<Vec<u8>>,
    /// `Ready` condition: `Some(true)` issued, `Some(false)` failed or pending.
    pub ready: Option<bool>,
    /// `Ready` condition reason, when present.
    pub ready_reason: Option<String>,
}

/// A new CertificateRequest to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCertificateRequest {
    /// Name (the CSR's name).
    pub name: String,
    /// Namespace (the controller's).
    pub namespace: String,
    /// The CSR UID it serves (label).
    pub csr_uid: String,
    /// The ClusterIssuer.
    pub issuer_name: String,
    /// The PEM CSR, verbatim.
    pub request: Vec<u8>,
    /// Requested duration.
    pub duration: Duration,
}

impl NewCertificateRequest {
    /// The object as JSON for the API.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "cert-manager.io/v1",
            "kind": "CertificateRequest",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": { CSR_UID_LABEL: self.csr_uid },
            },
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(&self.request),
                "issuerRef": { "name": self.issuer_name, "kind": "ClusterIssuer", "group": GROUP },
                "duration": format!("{}s", self.duration.as_secs()),
                "usages": [names::USAGE_IPSEC_TUNNEL],
                "isCA": false,
            }
        })
    }
}

/// What a returned CertificateRequest must match.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// The configured target.
    pub config: &'a CertManagerConfig,
    /// The UID the controller's create call returned.
    pub created_uid: &'a str,
    /// The CSR UID served.
    pub csr_uid: &'a str,
    /// The forwarded PEM CSR.
    pub request: &'a [u8],
    /// The validated CSR.
    pub csr: &'a ValidatedCsr,
}

/// Checks a returned, issued CertificateRequest. Pure. On success returns
/// the PEM to copy into the CSR status: the leaf, then the intermediates on
/// its verified path to the trust bundle (none when a bundle CA issued it
/// directly); anything else cert-manager returned is dropped.
pub fn check_issued(
    cr: &CertificateRequestView,
    expected: Expected<'_>,
    trust: &TrustBundle,
    now: SystemTime,
) -> Result<String, Rejection> {
    check_ownership(cr, expected)?;
    let pem_bytes = cr
        .certificate
        .as_deref()
        .ok_or(Rejection::Malformed("no certificate"))?;
    if std::str::from_utf8(pem_bytes).is_err() {
        return Err(Rejection::Malformed("not UTF-8"));
    }
    let chain = CertificateChain::from_pem(pem_bytes)
        .map_err(|_| Rejection::Malformed("not PEM certificates"))?;
    let leaf = chain.leaf();
    if leaf.subject_public_key_info() != expected.csr.spki_der.as_slice() {
        return Err(Rejection::KeyMismatch);
    }
    check_names(leaf, &expected.csr.chassis)?;
    if leaf.is_ca() {
        return Err(Rejection::IsCa);
    }
    profile::check_lifetime(
        leaf.not_before().unix(),
        leaf.not_after().unix(),
        now,
        expected.csr.lifetime,
    )
    .map_err(Rejection::Lifetime)?;
    let at = timestamp(now).map_err(|_| Rejection::Lifetime("time out of range".into()))?;
    let verified = chain.verify(trust, at).map_err(|_| Rejection::Chain)?;
    Ok(verified.to_pem())
}

/// Checks that a CertificateRequest is the one the controller created for this CSR.
pub fn check_ownership(
    cr: &CertificateRequestView,
    expected: Expected<'_>,
) -> Result<(), Rejection> {
    let cfg = expected.config;
    if cr.namespace != cfg.namespace {
        return Err(Rejection::Namespace(cr.namespace.clone()));
    }
    if cr.uid != expected.created_uid
        || cr.csr_uid_label.as_deref() != Some(expected.csr_uid)
        || cr.request != expected.request
    {
        return Err(Rejection::NotOurs);
    }
    if cr.issuer_name != cfg.issuer_name
        || cr.issuer_kind != "ClusterIssuer"
        || cr.issuer_group != GROUP
    {
        return Err(Rejection::Issuer(format!(
            "{}/{} {:?}",
            cr.issuer_group, cr.issuer_kind, cr.issuer_name
        )));
    }
    if cr.username != cfg.requester {
        return Err(Rejection::Requester(cr.username.clone()));
    }
    if cr.usages.len() != 1 || cr.usages[0] != names::USAGE_IPSEC_TUNNEL {
        return Err(Rejection::Usages(cr.usages.clone()));
    }
    Ok(())
}

fn check_names(leaf: &Certificate, chassis: &str) -> Result<(), Rejection> {
    let cns = leaf.common_names();
    if cns != [chassis] {
        return Err(Rejection::Names(format!("CN {cns:?}")));
    }
    let sans = leaf.dns_names().len() + leaf.other_san_count();
    if sans == 0 {
        return Err(Rejection::Names("no SAN".into()));
    }
    if leaf.other_san_count() != 0 || leaf.dns_names() != [chassis] {
        return Err(Rejection::Names(format!(
            "{sans} SANs, not exactly DNS:{chassis}"
        )));
    }
    Ok(())
}

/// The CertificateRequest operations the controller needs; the kube
/// implementation is [`KubeCertificateRequests`], tests use a stand-in.
pub trait CertificateRequestApi: Send + Sync + 'static {
    /// Creates the request; returns it as stored (with UID and webhook-stamped username).
    fn create(
        &self,
        cr: &NewCertificateRequest,
    ) -> impl Future<Output = Result<CertificateRequestView>> + Send;
    /// Reads a request by name in the controller's namespace.
    fn get(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<CertificateRequestView>>> + Send;
    /// Deletes a request by name (used for foreign or stale requests).
    fn delete(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
    /// Sets the `Approved` condition on the controller's own request: it
    /// has validated the CSR, which is the approval cert-manager waits for.
    fn approve(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
}

/// Forwards validated CSRs and collects results; remembers the UIDs of the
/// requests it created (a restart forgets them, and the next reconcile then
/// replaces the request instead of trusting it).
#[derive(Debug)]
pub struct CertManagerForwarder<A> {
    api: A,
    config: CertManagerConfig,
    created: Mutex<HashMap<String, String>>,
}

/// What [`CertManagerForwarder::forward`] achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarded {
    /// Issued and every check passed: the PEM to copy into the CSR.
    Issued(String),
    /// Waiting for cert-manager; try again later.
    Pending(String),
}

impl<A: CertificateRequestApi> CertManagerForwarder<A> {
    /// A forwarder over `api` for `config`.
    pub fn new(api: A, config: CertManagerConfig) -> Self {
        Self {
            api,
            config,
            created: Mutex::new(HashMap::new()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CertManagerConfig {
        &self.config
    }

    /// Creates (or continues) the CertificateRequest for a validated CSR and
    /// returns the checked result once cert-manager has issued.
    pub async fn forward(
        &self,
        csr_name: &str,
        csr_uid: &str,
        request: &[u8],
        csr: &ValidatedCsr,
        trust: &TrustBundle,
        now: SystemTime,
    ) -> Result<Forwarded> {
        let known = self.created_uid(csr_uid);
        let existing = self.api.get(csr_name).await?;
        let cr = match (existing, known) {
            (Some(cr), Some(uid)) if cr.uid == uid => cr,
            (existing, _) => {
                if existing.is_some() {
                    // Not created by this process for this CSR: never read it.
                    tracing::warn!(
                        csr = csr_name,
                        "replacing a CertificateRequest this controller did not create"
                    );
                    self.api.delete(csr_name).await?;
                }
                let new = NewCertificateRequest {
                    name: csr_name.to_owned(),
                    namespace: self.config.namespace.clone(),
                    csr_uid: csr_uid.to_owned(),
                    issuer_name: self.config.issuer_name.clone(),
                    request: request.to_vec(),
                    duration: csr.lifetime,
                };
                let created = self.api.create(&new).await?;
                self.remember(csr_uid, &created.uid);
                self.api.approve(csr_name).await?;
                match self.api.get(csr_name).await? {
                    Some(cr) => cr,
                    None => return Ok(Forwarded::Pending("created".into())),
                }
            }
        };
        let uid = self.created_uid(csr_uid).unwrap_or_default();
        let expected = Expected {
            config: &self.config,
            created_uid: &uid,
            csr_uid,
            request,
            csr,
        };
        check_ownership(&cr, expected).map_err(Error::CertManagerRejected)?;
        match cr.ready {
            Some(true) if cr.certificate.is_some() => {
                let pem =
                    check_issued(&cr, expected, trust, now).map_err(Error::CertManagerRejected)?;
                self.forget(csr_uid);
                Ok(Forwarded::Issued(pem))
            }
            _ => Ok(Forwarded::Pending(
                cr.ready_reason
                    .clone()
                    .unwrap_or_else(|| "not issued yet".into()),
            )),
        }
    }

    fn created_uid(&self, csr_uid: &str) -> Option<String> {
        self.created
            .lock()
            .ok()
            .and_then(|m| m.get(csr_uid).cloned())
    }

    fn remember(&self, csr_uid: &str, cr_uid: &str) {
        if let Ok(mut m) = self.created.lock() {
            m.insert(csr_uid.to_owned(), cr_uid.to_owned());
        }
    }

    fn forget(&self, csr_uid: &str) {
        if let Ok(mut m) = self.created.lock() {
            m.remove(csr_uid);
        }
    }
}

/// [`CertificateRequestApi`] over the Kubernetes API (dynamic objects: no
/// cert-manager CRD crate is needed for the handful of fields read).
#[derive(Clone)]
pub struct KubeCertificateRequests {
    api: kube::Api<kube::api::DynamicObject>,
}

impl KubeCertificateRequests {
    /// Requests in `namespace` through `client`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        let gvk = kube::api::GroupVersionKind::gvk(GROUP, "v1", "CertificateRequest");
        let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "certificaterequests");
        Self {
            api: kube::Api::namespaced_with(client, namespace, &ar),
        }
    }
}

impl CertificateRequestApi for KubeCertificateRequests {
    async fn create(&self, cr: &NewCertificateRequest) -> Result<CertificateRequestView> {
        let obj: kube::api::DynamicObject = serde_json::from_value(cr.to_json())
            .map_err(|_| Error::MissingField("CertificateRequest JSON"))?;
        let created = self
            .api
            .create(&kube::api::PostParams::default(), &obj)
            .await?;
        Ok(view_from_dynamic(&created))
    }

    async fn get(&self, name: &str) -> Result<Option<CertificateRequestView>> {
        Ok(self
            .api
            .get_opt(name)
            .await?
            .as_ref()
            .map(view_from_dynamic))
    }

    async fn delete(&self, name: &str) -> Result<()> {
        match self
            .api
            .delete(name, &kube::api::DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn approve(&self, name: &str) -> Result<()> {
        let patch = serde_json::json!({
            "status": { "conditions": [{
                "type": "Approved",
                "status": "True",
                "reason": "KubeOvnIpsecController",
                "message": "CSR validated by kube-ovn-ipsec-controller",
                "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            }]}
        });
        self.api
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }
}

/// Reads the checked fields out of a dynamic CertificateRequest.
pub fn view_from_dynamic(obj: &kube::api::DynamicObject) -> CertificateRequestView {
    let d = &obj.data;
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let b64 = |v: &serde_json::Value| {
        v.as_str()
            .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
    };
    let ready = d["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    CertificateRequestView {
        name: obj.metadata.name.clone().unwrap_or_default(),
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        csr_uid_label: obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CSR_UID_LABEL).cloned()),
        issuer_name: s(&d["spec"]["issuerRef"]["name"]),
        issuer_kind: s(&d["spec"]["issuerRef"]["kind"]),
        issuer_group: s(&d["spec"]["issuerRef"]["group"]),
        username: s(&d["spec"]["username"]),
        usages: d["spec"]["usages"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default(),
        request: b64(&d["spec"]["request"]).unwrap_or_default(),
        certificate: b64(&d["status"]["certificate"]).filter(|c| !c.is_empty()),
        ready: ready.as_ref().map(|c| c["status"] == "True"),
        ready_reason: ready
            .as_ref()
            .and_then(|c| c["reason"].as_str().map(str::to_owned)),
    }
}

#[cfg(test)]
mod tests;
