//! Recovery from the key directory at start: read the state file and the
//! files of the active and the pending generation ([`read`], blocking, run
//! off the executor), then decide what is usable ([`reconcile`], pure): an
//! active generation whose files do not match its record is retired and a
//! new identity requested; a pending request whose key or request is
//! unusable is abandoned and started over; a usable one is resumed with the
//! same key and CSR name.

use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::time::Timestamp;

use super::generation::{Active, Pending};
use crate::error::{Error, Result};
use crate::keydir::{KeyDirState, MovedAside, PendingRecord, PendingStage, RetiredRecord, files};
use crate::pki::PrivateKey;
use crate::ports::KeyStore;

/// What the key directory holds, as read at start.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The state file (empty when missing or moved aside).
    pub state: KeyDirState,
    /// The state file moved aside, if it was unusable.
    pub moved: Option<MovedAside>,
    /// The active generation's files, when the state names one.
    pub active: Option<Result<LoadedActive>>,
    /// The pending generation's files, when the state names one.
    pub pending: Option<Result<LoadedPending>>,
}

/// The active generation's files.
#[derive(Debug)]
pub(crate) struct LoadedActive {
    /// Its leaf.
    pub certificate: Certificate,
    /// Its `ca.pem`, when readable: the trust until the ConfigMap arrives.
    pub trust: Option<TrustBundle>,
}

/// The pending generation's files.
#[derive(Debug)]
pub(crate) struct LoadedPending {
    /// The request, resumable with the same key and CSR name.
    pub pending: Pending,
    /// Its verified certificate, when it was stored (stage `Issued`).
    pub certificate: Option<Certificate>,
}

/// What recovery decided.
#[derive(Debug)]
pub(crate) struct Reconciled {
    /// The state to write back (unusable records retired).
    pub state: KeyDirState,
    /// The active generation, unconfirmed until the OVSDB writer says so.
    pub active: Option<Active>,
    /// The pending generation to resume, with its certificate if stored.
    pub pending: Option<(Pending, Option<Certificate>)>,
    /// A new identity is wanted: none, expired, or the active one unusable.
    pub wanted: bool,
    /// The active generation's `ca.pem`.
    pub trust: Option<TrustBundle>,
}

fn inconsistent(generation: u64, reason: impl Into<String>) -> Error {
    Error::GenerationInconsistent {
        generation,
        reason: reason.into(),
    }
}

/// Reads the state and the files it names. Blocking. Fails only when the
/// state itself cannot be loaded; unusable generations come back as errors
/// inside [`Recovered`] for [`reconcile`] to judge.
pub(crate) fn read(store: &dyn KeyStore, now_unix: i64) -> Result<Recovered> {
    let (state, moved) = store.load(now_unix)?;
    let active = state.active.as_ref().map(|rec| {
        let g = rec.generation;
        let certificate = Certificate::from_pem(&store.read_file(g, files::CERTIFICATE)?)
            .map_err(|e| inconsistent(g, e.to_string()))?;
        if certificate.digest().to_hex() != rec.certificate_digest {
            return Err(inconsistent(g, "certificate digest differs from the state"));
        }
        store.read_file(g, files::PRIVATE_KEY)?;
        let trust = store
            .read_file(g, files::CA)
            .ok()
            .and_then(|pem| TrustBundle::from_pem(&pem).ok());
        Ok(LoadedActive { certificate, trust })
    });
    let pending = state.pending.as_ref().map(|rec| read_pending(store, rec));
    Ok(Recovered {
        state,
        moved,
        active,
        pending,
    })
}

fn read_pending(store: &dyn KeyStore, rec: &PendingRecord) -> Result<LoadedPending> {
    let g = rec.generation;
    let key = PrivateKey::from_pem(&store.read_file(g, files::PRIVATE_KEY)?)?;
    if key.digest_hex() != rec.key_digest {
        return Err(inconsistent(
            g,
            "pending key digest differs from the binding",
        ));
    }
    // A trust-only generation has no request of its own.
    let request = if rec.trust_refresh {
        Vec::new()
    } else {
        store.read_file(g, files::REQUEST)?
    };
    let request_pem =
        String::from_utf8(request).map_err(|_| inconsistent(g, "request is not PEM"))?;
    let certificate = if rec.stage == PendingStage::Issued {
        Some(
            Certificate::from_pem(&store.read_file(g, files::CERTIFICATE)?)
                .map_err(|e| inconsistent(g, e.to_string()))?,
        )
    } else {
        None
    };
    // What `ca.pem` holds decides later whether a new bundle still needs a
    // trust-only generation once this one is active.
    let ca_digest = certificate.as_ref().and_then(|_| {
        store
            .read_file(g, files::CA)
            .ok()
            .and_then(|pem| TrustBundle::from_pem(&pem).ok())
            .map(|t| t.digest())
    });
    Ok(LoadedPending {
        pending: Pending {
            generation: g,
            key,
            request_pem,
            csr_name: rec.csr_name.clone(),
            ca_digest,
        },
        certificate,
    })
}

/// Decides what of `rec` is usable at `now`. Pure.
pub(crate) fn reconcile(rec: Recovered, now: Timestamp) -> Reconciled {
    let mut state = rec.state;
    let mut wanted = false;
    let mut trust = None;
    let mut active = None;
    let now_unix = now.unix();
    match (state.active.clone(), rec.active) {
        (Some(record), Some(Ok(loaded))) => {
            trust = loaded.trust;
            if now >= loaded.certificate.not_after() {
                wanted = true;
            }
            active = Some(Active {
                generation: record.generation,
                ca_digest: trust.as_ref().map(TrustBundle::digest),
                certificate: loaded.certificate,
                confirmed: false,
                csr: record.csr.clone(),
            });
        }
        (Some(record), Some(Err(e))) => {
            tracing::warn!(generation = record.generation, error = %e, "active generation unusable; requesting a new identity");
            state.retired.push(RetiredRecord {
                generation: record.generation,
                retired_at: now_unix,
            });
            state.active = None;
            wanted = true;
        }
        _ => wanted = true,
    }
    let mut pending = None;
    if let (Some(record), Some(loaded)) = (state.pending.clone(), rec.pending) {
        match loaded {
            Ok(l) => {
                tracing::info!(generation = l.pending.generation, csr = %l.pending.csr_name, "resuming pending identity request");
                pending = Some((l.pending, l.certificate));
            }
            Err(e) => {
                tracing::warn!(generation = record.generation, error = %e, "pending request unusable; starting over");
                state.pending = None;
                state.retired.push(RetiredRecord {
                    generation: record.generation,
                    retired_at: now_unix,
                });
                wanted = true;
            }
        }
    }
    Reconciled {
        state,
        active,
        pending,
        wanted,
        trust,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keydir::{ActiveRecord, KeyDir, STATE_VERSION};
    use crate::pki::KeyType;
    use crate::testing::{Tamper, TestCa};
    use kube_ovn_ipsec_api::ident::Chassis;
    use std::time::Duration;

    const NOW: i64 = 1_800_000_000;

    fn ts(unix: i64) -> Timestamp {
        Timestamp::from_unix(unix).unwrap()
    }

    /// A key directory (real files in a tempdir) with an active generation
    /// 1 and a pending generation 2 at `stage`.
    fn key_dir_with(stage: PendingStage) -> (tempfile::TempDir, KeyDir, PrivateKey) {
        let tmp = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(tmp.path().join("keys")).unwrap();
        let ca = TestCa::p256("recovery test CA");
        let chassis = Chassis::new("chassis-1").unwrap();
        let mut state = KeyDirState {
            version: STATE_VERSION,
            last_generation: 2,
            ..KeyDirState::default()
        };
        let k1 = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
        let c1 = ca.sign(
            &k1.csr_pem(&chassis).unwrap(),
            NOW as u64,
            Duration::from_secs(3600),
            Tamper::None,
        );
        let cert1 = Certificate::from_pem(c1.as_bytes()).unwrap();
        kd.create_generation(1).unwrap();
        kd.write_file(1, files::PRIVATE_KEY, k1.to_pem().as_bytes(), true)
            .unwrap();
        kd.write_file(1, files::CERTIFICATE, c1.as_bytes(), false)
            .unwrap();
        kd.write_file(1, files::CA, &ca.trust_pem(), false).unwrap();
        state.active = Some(ActiveRecord {
            generation: 1,
            certificate_digest: cert1.digest().to_hex(),
            csr: None,
        });
        let k2 = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
        let req2 = k2.csr_pem(&chassis).unwrap();
        kd.create_generation(2).unwrap();
        kd.write_file(2, files::PRIVATE_KEY, k2.to_pem().as_bytes(), true)
            .unwrap();
        kd.write_file(2, files::REQUEST, req2.as_bytes(), false)
            .unwrap();
        if stage == PendingStage::Issued {
            let c2 = ca.sign(&req2, NOW as u64, Duration::from_secs(3600), Tamper::None);
            kd.write_file(2, files::CERTIFICATE, c2.as_bytes(), false)
                .unwrap();
            kd.write_file(2, files::CA, &ca.trust_pem(), false).unwrap();
        }
        state.pending = Some(PendingRecord {
            generation: 2,
            key_digest: k2.digest_hex(),
            csr_name: "ovn-ipsec-two".into(),
            csr_uid: None,
            trust_digest: "t".into(),
            stage,
            trust_refresh: false,
            requester_pod_uid: None,
        });
        kd.save(&state).unwrap();
        (tmp, kd, k2)
    }

    #[test]
    fn usable_active_and_pending_are_resumed() {
        let (_tmp, kd, k2) = key_dir_with(PendingStage::Issued);
        let r = reconcile(read(&kd, NOW).unwrap(), ts(NOW));
        let a = r.active.unwrap();
        assert_eq!((a.generation, a.confirmed), (1, false));
        assert!(a.ca_digest.is_some());
        assert!(
            r.trust.is_some(),
            "the active ca.pem is the trust until the ConfigMap"
        );
        let (p, cert) = r.pending.unwrap();
        assert_eq!(p.generation, 2);
        assert_eq!(p.key.digest_hex(), k2.digest_hex());
        assert_eq!(p.csr_name, "ovn-ipsec-two");
        assert!(cert.is_some() && p.ca_digest.is_some());
        assert!(!r.wanted);
        assert!(r.state.retired.is_empty());
    }

    #[test]
    fn expired_active_is_kept_but_a_new_identity_wanted() {
        let (_tmp, kd, _) = key_dir_with(PendingStage::Prepared);
        let r = reconcile(read(&kd, NOW).unwrap(), ts(NOW + 7200));
        assert_eq!(r.active.unwrap().generation, 1);
        assert!(r.wanted);
        assert!(r.pending.unwrap().1.is_none());
    }

    #[test]
    fn mismatching_records_are_retired_and_a_new_identity_wanted() {
        let (_tmp, kd, _) = key_dir_with(PendingStage::Submitted);
        let mut rec = read(&kd, NOW).unwrap();
        // The files changed behind the state's back.
        if let Some(a) = &mut rec.state.active {
            a.certificate_digest = "00".into();
        }
        if let Some(p) = &mut rec.state.pending {
            p.key_digest = "00".into();
        }
        let rec = read_with_state(&kd, rec.state);
        let r = reconcile(rec, ts(NOW));
        assert!(r.active.is_none());
        assert!(r.pending.is_none());
        assert!(r.wanted);
        assert_eq!(r.state.active, None);
        assert_eq!(r.state.pending, None);
        assert_eq!(
            r.state.retired,
            vec![
                RetiredRecord {
                    generation: 1,
                    retired_at: NOW
                },
                RetiredRecord {
                    generation: 2,
                    retired_at: NOW
                }
            ]
        );
    }

    fn read_with_state(kd: &KeyDir, state: KeyDirState) -> Recovered {
        kd.save(&state).unwrap();
        read(kd, NOW).unwrap()
    }

    #[test]
    fn empty_directory_wants_an_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(tmp.path()).unwrap();
        let r = reconcile(read(&kd, NOW).unwrap(), ts(NOW));
        assert!(r.wanted && r.active.is_none() && r.pending.is_none());
    }
}
