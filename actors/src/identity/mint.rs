//! Making a generation. The jobs here block (key generation, fsync'd
//! writes) and run off the executor; the machine plans them and adopts
//! their results.
//!
//! - [`mint`]: a new key and CSR, persisted with the binding *before* the
//!   CSR exists, so a restart resumes the same request with the same key.
//! - [`refresh_trust`]: a trust-only generation — the active key and
//!   certificate with a new `ca.pem`, no CSR.
//! - [`store_issued`]: a verified certificate and the trust it was
//!   verified against, then the state saying so.
//! - [`submission`]: the CSR object for a pending generation (pure).

use std::collections::BTreeMap;

use kube_ovn_ipsec_api::csr::csr_name;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};

use super::IdentityConfig;
use super::generation::Pending;
use crate::error::Result;
use crate::keydir::{GenerationFile, KeyDirState, PendingRecord, PendingStage, files};
use crate::pki::{KeyType, PrivateKey};
use crate::ports::{CsrSubmission, KeyStore};

/// A new generation to make.
#[derive(Debug, Clone)]
pub(crate) struct MintPlan {
    /// Its number.
    pub generation: u64,
    /// The key to generate.
    pub key_type: KeyType,
    /// Subject and SAN of the request.
    pub chassis: Chassis,
    /// Part of the CSR name.
    pub node_uid: Uid,
    /// Part of the CSR name.
    pub pod_uid: Uid,
    /// Part of the CSR name (and the request).
    pub expiration_seconds: u32,
    /// The trust the request is made under (part of the CSR name).
    pub trust_digest: Sha256Digest,
    /// The state to save with the new binding.
    pub state: KeyDirState,
}

/// A generation made and persisted.
#[derive(Debug)]
pub(crate) struct Minted {
    /// The pending request.
    pub pending: Pending,
    /// Its binding, as saved.
    pub record: PendingRecord,
}

/// Generates the key and CSR and persists key, request and binding (in
/// that order, each fsync'd). Blocking.
pub(crate) fn mint(store: &dyn KeyStore, plan: MintPlan) -> Result<Minted> {
    let key = PrivateKey::generate(plan.key_type)?;
    let request_pem = key.csr_pem(&plan.chassis)?;
    let name = csr_name(
        &plan.node_uid,
        &plan.pod_uid,
        plan.expiration_seconds,
        &plan.trust_digest,
        request_pem.as_bytes(),
    );
    let record = PendingRecord {
        generation: plan.generation,
        key_digest: key.digest_hex(),
        csr_name: name.clone(),
        csr_uid: None,
        trust_digest: plan.trust_digest.to_hex(),
        stage: PendingStage::Prepared,
        trust_refresh: false,
        requester_pod_uid: Some(plan.pod_uid.as_str().to_owned()),
    };
    let mut state = plan.state;
    state.last_generation = plan.generation;
    state.pending = Some(record.clone());
    let key_pem = key.to_pem();
    // The binding is on disk (fsync'd) before the CSR exists.
    store.write_generation(
        plan.generation,
        &[
            GenerationFile {
                name: files::PRIVATE_KEY,
                data: key_pem.as_bytes(),
                secret: true,
            },
            GenerationFile {
                name: files::REQUEST,
                data: request_pem.as_bytes(),
                secret: false,
            },
        ],
        &state,
    )?;
    Ok(Minted {
        pending: Pending {
            generation: plan.generation,
            key,
            request_pem,
            csr_name: name,
            ca_digest: None,
        },
        record,
    })
}

/// A trust-only generation to make.
#[derive(Debug, Clone)]
pub(crate) struct RefreshPlan {
    /// The active generation whose key and certificate are reused.
    pub from: u64,
    /// The new generation's number.
    pub generation: u64,
    /// The active leaf.
    pub certificate: Certificate,
    /// The new trust.
    pub trust: TrustBundle,
    /// The state to save with the new record.
    pub state: KeyDirState,
}

/// Copies the active key and certificate into a new generation with the
/// new `ca.pem`, then saves the record. Blocking.
pub(crate) fn refresh_trust(store: &dyn KeyStore, plan: RefreshPlan) -> Result<Minted> {
    let key_pem = store.read_file(plan.from, files::PRIVATE_KEY)?;
    let key = PrivateKey::from_pem(&key_pem)?;
    let digest = plan.trust.digest();
    let record = PendingRecord {
        generation: plan.generation,
        key_digest: key.digest_hex(),
        csr_name: String::new(),
        csr_uid: None,
        trust_digest: digest.to_hex(),
        stage: PendingStage::Issued,
        trust_refresh: true,
        requester_pod_uid: None,
    };
    let mut state = plan.state;
    state.last_generation = plan.generation;
    state.pending = Some(record.clone());
    let cert_pem = plan.certificate.to_pem();
    let ca_pem = plan.trust.to_pem();
    store.write_generation(
        plan.generation,
        &[
            GenerationFile {
                name: files::PRIVATE_KEY,
                data: &key_pem,
                secret: true,
            },
            GenerationFile {
                name: files::CERTIFICATE,
                data: cert_pem.as_bytes(),
                secret: false,
            },
            GenerationFile {
                name: files::CA,
                data: ca_pem.as_bytes(),
                secret: false,
            },
        ],
        &state,
    )?;
    Ok(Minted {
        pending: Pending {
            generation: plan.generation,
            key,
            request_pem: String::new(),
            csr_name: String::new(),
            ca_digest: Some(digest),
        },
        record,
    })
}

/// A verified certificate to store.
#[derive(Debug, Clone)]
pub(crate) struct StorePlan {
    /// The pending generation.
    pub generation: u64,
    /// The verified leaf (PEM).
    pub certificate_pem: String,
    /// The trust it was verified against (PEM).
    pub ca_pem: String,
    /// The state with the pending record at stage `Issued`.
    pub state: KeyDirState,
}

/// Writes `cert.pem` and `ca.pem`, then the state. Blocking.
pub(crate) fn store_issued(store: &dyn KeyStore, plan: StorePlan) -> Result<()> {
    store.write_generation(
        plan.generation,
        &[
            GenerationFile {
                name: files::CERTIFICATE,
                data: plan.certificate_pem.as_bytes(),
                secret: false,
            },
            GenerationFile {
                name: files::CA,
                data: plan.ca_pem.as_bytes(),
                secret: false,
            },
        ],
        &plan.state,
    )
}

/// The CSR object for `p` (public data only).
pub(crate) fn submission(cfg: &IdentityConfig, p: &Pending) -> CsrSubmission {
    let annotations = BTreeMap::from([
        (k8s::ANNOTATION_NODE.to_owned(), cfg.node_name.clone()),
        (
            k8s::ANNOTATION_NODE_UID.to_owned(),
            cfg.node_uid.to_string(),
        ),
        (k8s::ANNOTATION_CHASSIS.to_owned(), cfg.chassis.to_string()),
        (
            k8s::ANNOTATION_GENERATION.to_owned(),
            p.generation.to_string(),
        ),
    ]);
    CsrSubmission {
        name: p.csr_name.clone(),
        annotations,
        request_pem: p.request_pem.clone().into_bytes(),
        signer_name: k8s::SIGNER_NAME.to_owned(),
        usages: k8s::CSR_USAGES.iter().map(|s| (*s).to_owned()).collect(),
        expiration_seconds: cfg.expiration_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keydir::{KeyDir, STATE_VERSION};
    use crate::testing::TestCa;

    fn plan(generation: u64) -> MintPlan {
        MintPlan {
            generation,
            key_type: KeyType::EcdsaP256,
            chassis: Chassis::new("chassis-1").unwrap(),
            node_uid: Uid::new("3f1c2a9e-0000-4000-8000-000000000001").unwrap(),
            pod_uid: Uid::new("7d0e5b1c-0000-4000-8000-000000000002").unwrap(),
            expiration_seconds: 3600,
            trust_digest: Sha256Digest::of(b"trust"),
            state: KeyDirState {
                version: STATE_VERSION,
                last_generation: generation - 1,
                ..KeyDirState::default()
            },
        }
    }

    #[test]
    fn minting_persists_key_request_and_binding_before_any_csr() {
        let tmp = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(tmp.path()).unwrap();
        let m = mint(&kd, plan(3)).unwrap();
        assert_eq!(m.record.generation, 3);
        assert_eq!(m.record.stage, PendingStage::Prepared);
        assert_eq!(m.record.key_digest, m.pending.key.digest_hex());
        assert!(m.record.csr_name.starts_with("ovn-ipsec-"));
        let (state, _) = kd.load(0).unwrap();
        assert_eq!(state.last_generation, 3);
        assert_eq!(state.pending, Some(m.record.clone()));
        let key = PrivateKey::from_pem(&kd.read_file(3, files::PRIVATE_KEY).unwrap()).unwrap();
        assert_eq!(key.digest_hex(), m.record.key_digest);
        assert_eq!(
            kd.read_file(3, files::REQUEST).unwrap(),
            m.pending.request_pem.as_bytes()
        );
    }

    #[test]
    fn trust_refresh_reuses_key_and_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(tmp.path()).unwrap();
        let m = mint(&kd, plan(1)).unwrap();
        let ca = TestCa::p256("mint test CA");
        let pem = ca.sign(
            &m.pending.request_pem,
            1_800_000_000,
            std::time::Duration::from_secs(3600),
            crate::testing::Tamper::None,
        );
        let certificate = Certificate::from_pem(pem.as_bytes()).unwrap();
        let trust = TrustBundle::from_pem(&ca.trust_pem()).unwrap();
        let r = refresh_trust(
            &kd,
            RefreshPlan {
                from: 1,
                generation: 2,
                certificate: certificate.clone(),
                trust: trust.clone(),
                state: kd.load(0).unwrap().0,
            },
        )
        .unwrap();
        assert!(r.record.trust_refresh);
        assert_eq!(r.record.stage, PendingStage::Issued);
        assert_eq!(r.record.key_digest, m.record.key_digest);
        assert_eq!(r.pending.ca_digest, Some(trust.digest()));
        assert_eq!(
            kd.read_file(2, files::CERTIFICATE).unwrap(),
            certificate.to_pem().as_bytes()
        );
        assert_eq!(kd.load(0).unwrap().0.pending, Some(r.record));
    }
}
