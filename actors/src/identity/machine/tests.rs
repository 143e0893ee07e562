//! The machine input by input: no actor, no key directory, no clock.

use std::io::ErrorKind;
use std::time::UNIX_EPOCH;

use kube_ovn_ipsec_api::ident::{Chassis, Uid};

use super::*;
use crate::keydir::{PendingRecord, STATE_VERSION};
use crate::pki::{KeyType, PrivateKey};
use crate::testing::{Tamper, TestCa};

const BASE: u64 = 1_800_000_000;
const LIFETIME: u32 = 3600;

fn config() -> IdentityConfig {
    let mut c = IdentityConfig::new(
        "node-1".into(),
        Uid::new("3f1c2a9e-0000-4000-8000-000000000001").unwrap(),
        Uid::new("7d0e5b1c-0000-4000-8000-000000000002").unwrap(),
        Chassis::new("chassis-node-1").unwrap(),
        "/keys".into(),
    );
    c.key_type = KeyType::EcdsaP256;
    c.expiration_seconds = LIFETIME;
    c
}

fn io_error() -> Error {
    Error::KeyDirIo {
        path: "/keys/state.json".into(),
        source: std::io::Error::from(ErrorKind::Other),
    }
}

fn job(effects: &[Effect]) -> Option<&Job> {
    effects.iter().find_map(|e| match e {
        Effect::Job(j) => Some(j),
        _ => None,
    })
}

fn retry(effects: &[Effect]) -> Option<(Duration, u64)> {
    effects.iter().find_map(|e| match e {
        Effect::RetryAfter { delay, token } => Some((*delay, *token)),
        _ => None,
    })
}

fn ready(effects: &[Effect]) -> Option<u64> {
    effects.iter().find_map(|e| match e {
        Effect::PublishReady { generation, .. } => Some(*generation),
        _ => None,
    })
}

fn has(effects: &[Effect], f: impl Fn(&Effect) -> bool) -> bool {
    effects.iter().any(f)
}

struct Fixture {
    m: Machine,
    ca: TestCa,
    now: SystemTime,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            m: Machine::new(config()),
            ca: TestCa::p256("machine test CA"),
            now: UNIX_EPOCH + Duration::from_secs(BASE),
        }
    }

    fn step(&mut self, input: Input) -> Vec<Effect> {
        self.m.step(input, self.now)
    }

    /// Opens an empty key directory; returns the effects once open.
    fn open_empty(&mut self) -> Vec<Effect> {
        let e = self.step(Input::Open);
        assert!(matches!(job(&e), Some(Job::Open { .. })), "{e:?}");
        let e = self.step(Input::Opened(Ok(Box::new(Recovered {
            state: KeyDirState {
                version: STATE_VERSION,
                ..KeyDirState::default()
            },
            moved: None,
            active: None,
            pending: None,
        }))));
        assert!(matches!(
            job(&e),
            Some(Job::Save {
                purpose: SavePurpose::Recovery,
                ..
            })
        ));
        self.step(Input::Saved {
            purpose: SavePurpose::Recovery,
            result: Ok(()),
        })
    }

    /// What the mint job would return for `plan`.
    fn minted(plan: &MintPlan) -> Minted {
        let key = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
        let request_pem = key.csr_pem(&plan.chassis).unwrap();
        let csr_name = format!("ovn-ipsec-test-{}", plan.generation);
        Minted {
            record: PendingRecord {
                generation: plan.generation,
                key_digest: key.digest_hex(),
                csr_name: csr_name.clone(),
                csr_uid: None,
                trust_digest: plan.trust_digest.to_hex(),
                stage: PendingStage::Prepared,
                trust_refresh: false,
                requester_pod_uid: Some(plan.pod_uid.as_str().to_owned()),
            },
            pending: Pending {
                generation: plan.generation,
                key,
                request_pem,
                csr_name,
                ca_digest: None,
            },
        }
    }

    /// From `Wanted` with trust: mint and submit; returns the generation.
    fn mint_and_submit(&mut self, e: &[Effect]) -> u64 {
        let Some(Job::Mint(plan)) = job(e) else {
            panic!("expected a mint job: {e:?}");
        };
        let minted = Self::minted(plan);
        let g = plan.generation;
        let e = self.step(Input::Minted(Ok(Box::new(minted))));
        assert!(
            has(
                &e,
                |e| matches!(e, Effect::SubmitCsr { generation, .. } if *generation == g)
            ),
            "{e:?}"
        );
        assert!(matches!(self.m.phase(), Phase::Requesting(p) if p.generation == g));
        g
    }

    fn issued(&self, tamper: Tamper) -> CsrOutcome {
        let p = self.m.phase().pending().unwrap();
        let pem = self.ca.sign(
            &p.request_pem,
            BASE,
            Duration::from_secs(u64::from(LIFETIME)),
            tamper,
        );
        CsrOutcome::Issued {
            certificate_pem: pem.into_bytes(),
        }
    }

    /// Issues and stores the requested generation `g`: it is published
    /// Ready, awaiting activation.
    fn issue_and_store(&mut self, g: u64) {
        let outcome = self.issued(Tamper::None);
        let e = self.step(Input::Settled {
            generation: g,
            outcome: Ok(outcome),
        });
        assert!(matches!(job(&e), Some(Job::StoreIssued(_))), "{e:?}");
        let e = self.step(Input::Stored(Ok(())));
        assert_eq!(ready(&e), Some(g));
    }

    /// Issues, stores and activates the requested generation `g`.
    fn activate(&mut self, g: u64) -> Vec<Effect> {
        self.issue_and_store(g);
        self.step(Input::Activated { generation: g })
    }

    /// Open, trust, generation 1 requested, issued and activated.
    fn active() -> Self {
        let mut f = Fixture::new();
        f.open_empty();
        let pem = f.ca.trust_pem();
        let e = f.step(Input::Trust((pem).into()));
        let g = f.mint_and_submit(&e);
        f.activate(g);
        f
    }
}

#[test]
fn unusable_key_dir_blocks_and_is_retried_with_backoff() {
    let mut f = Fixture::new();
    f.step(Input::Open);
    let e = f.step(Input::Opened(Err(Error::KeyDirReadOnly {
        path: "/keys".into(),
        source: std::io::Error::from(ErrorKind::PermissionDenied),
    })));
    assert!(has(&e, |e| matches!(e, Effect::CloseKeyDir)));
    assert!(has(&e, |e| matches!(
        e,
        Effect::Condition(IdentityCondition::Blocked(Reason::KeyDirReadOnly))
    )));
    let (delay, token) = retry(&e).unwrap();
    assert_eq!(delay, Duration::from_secs(1));
    assert!(matches!(f.m.phase(), Phase::Closed { .. }));
    assert!(
        f.step(Input::Retry { token: token + 7 }).is_empty(),
        "stale"
    );
    let e = f.step(Input::Retry { token });
    assert!(matches!(job(&e), Some(Job::Open { .. })));
    let e = f.step(Input::Opened(Err(io_error())));
    assert_eq!(retry(&e).unwrap().0, Duration::from_secs(2));
}

#[test]
fn failing_to_write_the_recovered_state_blocks() {
    let mut f = Fixture::new();
    f.step(Input::Open);
    f.step(Input::Opened(Ok(Box::new(Recovered {
        state: KeyDirState::default(),
        moved: None,
        active: None,
        pending: None,
    }))));
    let e = f.step(Input::Saved {
        purpose: SavePurpose::Recovery,
        result: Err(io_error()),
    });
    assert!(has(&e, |e| matches!(e, Effect::CloseKeyDir)));
    assert!(retry(&e).is_some());
    assert!(matches!(f.m.phase(), Phase::Closed { wanted: true }));
}

#[test]
fn cold_start_waits_for_trust_then_mints_and_requests() {
    let mut f = Fixture::new();
    let e = f.open_empty();
    assert!(has(&e, |e| matches!(
        e,
        Effect::Condition(IdentityCondition::Working(None))
    )));
    assert!(has(&e, |e| matches!(e, Effect::CollectGarbageAfter(_))));
    assert!(has(&e, |e| matches!(
        e,
        Effect::Condition(IdentityCondition::Working(Some(Reason::TrustBundleMissing)))
    )));
    assert!(job(&e).is_none(), "nothing to mint without trust");
    assert!(matches!(f.m.phase(), Phase::Wanted));

    let pem = f.ca.trust_pem();
    let e = f.step(Input::Trust((pem).into()));
    assert!(has(&e, |e| matches!(e, Effect::TrustHeld(_))));
    let Some(Job::Mint(plan)) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(plan.generation, 1);
    assert!(matches!(f.m.phase(), Phase::Minting));
    let g = f.mint_and_submit(&e);
    assert_eq!(g, 1);
    assert_eq!(f.m.key_dir_state().last_generation, 1);
    assert_eq!(
        f.m.key_dir_state().pending.as_ref().unwrap().stage,
        PendingStage::Prepared
    );
}

#[test]
fn failed_mint_stays_wanted_and_retries() {
    let mut f = Fixture::new();
    f.open_empty();
    let pem = f.ca.trust_pem();
    f.step(Input::Trust((pem).into()));
    let e = f.step(Input::Minted(Err(io_error())));
    assert!(has(&e, |e| matches!(e, Effect::Renewal("key_dir_io"))));
    let (_, token) = retry(&e).unwrap();
    assert!(matches!(f.m.phase(), Phase::Wanted));
    assert!(f.m.key_dir_state().pending.is_none());
    let e = f.step(Input::Retry { token });
    assert!(matches!(job(&e), Some(Job::Mint(p)) if p.generation == 1));
}

#[test]
fn issued_certificate_is_stored_published_until_activated_then_active() {
    let mut f = Fixture::new();
    f.open_empty();
    let pem = f.ca.trust_pem();
    let e = f.step(Input::Trust((pem).into()));
    let g = f.mint_and_submit(&e);
    let e = f.step(Input::Submitted {
        generation: g,
        csr: CsrRef {
            name: "ovn-ipsec-test-1".into(),
            uid: "uid-1".into(),
        },
    });
    let Some(Job::Save { state, purpose }) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(*purpose, SavePurpose::Binding);
    assert_eq!(
        state.pending.as_ref().unwrap().csr_uid.as_deref(),
        Some("uid-1")
    );

    let outcome = f.issued(Tamper::None);
    let e = f.step(Input::Settled {
        generation: g,
        outcome: Ok(outcome),
    });
    let Some(Job::StoreIssued(plan)) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(
        plan.state.pending.as_ref().unwrap().stage,
        PendingStage::Issued
    );
    assert!(matches!(f.m.phase(), Phase::Storing { .. }));

    let e = f.step(Input::Stored(Ok(())));
    assert_eq!(ready(&e), Some(g));
    let (_, watchdog) = retry(&e).unwrap();
    let e = f.step(Input::Retry { token: watchdog });
    assert_eq!(ready(&e), Some(g), "republished until confirmed");
    let (_, watchdog) = retry(&e).unwrap();

    let e = f.step(Input::Activated { generation: g });
    let Some(Job::Save { state, purpose }) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(*purpose, SavePurpose::Activation { generation: g });
    assert_eq!(state.active.as_ref().unwrap().generation, g);
    assert!(state.pending.is_none());
    assert!(has(
        &e,
        |e| matches!(e, Effect::PublishActive(a) if a.generation == g)
    ));
    assert!(has(&e, |e| matches!(e, Effect::Renewal("success"))));
    assert!(matches!(f.m.phase(), Phase::Idle));
    let a = f.m.active().unwrap();
    assert_eq!((a.generation, a.confirmed), (g, true));
    assert!(
        f.step(Input::Retry { token: watchdog }).is_empty(),
        "the watchdog is cancelled"
    );
}

#[test]
fn rejected_certificate_abandons_the_generation() {
    let mut f = Fixture::new();
    f.open_empty();
    let pem = f.ca.trust_pem();
    let e = f.step(Input::Trust((pem).into()));
    let g = f.mint_and_submit(&e);
    let outcome = f.issued(Tamper::WrongSan);
    let e = f.step(Input::Settled {
        generation: g,
        outcome: Ok(outcome),
    });
    assert!(has(&e, |e| matches!(
        e,
        Effect::Renewal("certificate_rejected")
    )));
    assert!(has(&e, |e| matches!(
        e,
        Effect::Condition(IdentityCondition::Working(Some(
            Reason::CertificateMismatch
        )))
    )));
    let Some(Job::Save { state, purpose }) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(*purpose, SavePurpose::Abandon);
    assert!(state.pending.is_none());
    assert_eq!(state.retired[0].generation, g);
    assert!(matches!(f.m.phase(), Phase::Wanted));
    let (_, token) = retry(&e).unwrap();
    let e = f.step(Input::Retry { token });
    assert!(
        matches!(job(&e), Some(Job::Mint(p)) if p.generation == g + 1),
        "a new key and CSR"
    );
}

#[test]
fn denial_abandons_but_timeout_and_storage_failure_keep_the_key() {
    let mut f = Fixture::new();
    f.open_empty();
    let pem = f.ca.trust_pem();
    let e = f.step(Input::Trust((pem).into()));
    let g = f.mint_and_submit(&e);

    // Not issued within the wait: the same CSR again.
    let e = f.step(Input::Settled {
        generation: g,
        outcome: Ok(CsrOutcome::Pending),
    });
    assert!(has(&e, |e| matches!(e, Effect::Renewal("csr_timeout"))));
    assert!(!has(&e, |e| matches!(e, Effect::Job(_))));
    assert!(matches!(f.m.phase(), Phase::Waiting(p) if p.generation == g));
    let (_, token) = retry(&e).unwrap();
    let e = f.step(Input::Retry { token });
    assert!(has(&e, |e| matches!(
        e,
        Effect::SubmitCsr { submission, .. } if submission.name == "ovn-ipsec-test-1"
    )));

    // Issued, but storing fails: the same CSR again.
    let outcome = f.issued(Tamper::None);
    f.step(Input::Settled {
        generation: g,
        outcome: Ok(outcome),
    });
    let e = f.step(Input::Stored(Err(io_error())));
    assert!(!has(&e, |e| matches!(e, Effect::Job(_))));
    assert!(matches!(f.m.phase(), Phase::Waiting(p) if p.generation == g));
    assert_eq!(
        f.m.key_dir_state().pending.as_ref().unwrap().stage,
        PendingStage::Prepared
    );
    let (_, token) = retry(&e).unwrap();
    f.step(Input::Retry { token });

    // Denied: the key is discarded.
    let e = f.step(Input::Settled {
        generation: g,
        outcome: Ok(CsrOutcome::Denied {
            reason: "NodeUIDMismatch".into(),
            message: "no".into(),
        }),
    });
    assert!(has(&e, |e| matches!(
        e,
        Effect::Job(Job::Save {
            purpose: SavePurpose::Abandon,
            ..
        })
    )));
    assert!(matches!(f.m.phase(), Phase::Wanted));
}

#[test]
fn stale_settlements_and_renewals_are_ignored() {
    let mut f = Fixture::active();
    assert!(
        f.step(Input::Settled {
            generation: 7,
            outcome: Ok(CsrOutcome::Pending),
        })
        .is_empty()
    );
    assert!(f.step(Input::RenewalDue { generation: 5 }).is_empty());
    assert!(matches!(f.m.phase(), Phase::Idle));
}

#[test]
fn renewal_due_requests_the_next_generation_while_the_active_stays() {
    let mut f = Fixture::active();
    let e = f.step(Input::RenewalDue { generation: 1 });
    let g = f.mint_and_submit(&e);
    assert_eq!(g, 2);
    let a = f.m.active().unwrap();
    assert_eq!((a.generation, a.confirmed), (1, true));
    // Due again while one is pending: nothing new.
    assert!(f.step(Input::RenewalDue { generation: 1 }).is_empty());
    // A denial of the renewal leaves the active identity alone and shows
    // a warning beside it.
    let e = f.step(Input::Settled {
        generation: 2,
        outcome: Ok(CsrOutcome::Denied {
            reason: "SignerOffline".into(),
            message: "-----BEGIN CERTIFICATE-----".into(),
        }),
    });
    assert!(has(&e, |e| matches!(
        e,
        Effect::Warning(Some(Reason::CsrDenied))
    )));
    assert_eq!(f.m.active().unwrap().generation, 1);
    assert_eq!(f.m.key_dir_state().active.as_ref().unwrap().generation, 1);
}

#[test]
fn compatible_bundle_makes_a_trust_only_generation() {
    let mut f = Fixture::active();
    let ca2 = TestCa::p256("machine test CA 2");
    let mut both = f.ca.trust_pem();
    both.extend_from_slice(&ca2.trust_pem());
    let e = f.step(Input::Trust((both).into()));
    let Some(Job::RefreshTrust(plan)) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!((plan.from, plan.generation), (1, 2));
    let digest = plan.trust.digest();
    let key = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
    let refreshed = Minted {
        record: PendingRecord {
            generation: 2,
            key_digest: key.digest_hex(),
            csr_name: String::new(),
            csr_uid: None,
            trust_digest: digest.to_hex(),
            stage: PendingStage::Issued,
            trust_refresh: true,
            requester_pod_uid: None,
        },
        pending: Pending {
            generation: 2,
            key,
            request_pem: String::new(),
            csr_name: String::new(),
            ca_digest: Some(digest),
        },
    };
    let e = f.step(Input::Refreshed(Ok(Box::new(refreshed))));
    assert_eq!(ready(&e), Some(2));
    assert!(
        !has(&e, |e| matches!(e, Effect::SubmitCsr { .. })),
        "no CSR"
    );
    let e = f.step(Input::Activated { generation: 2 });
    assert!(has(
        &e,
        |e| matches!(e, Effect::PublishActive(a) if a.generation == 2)
    ));
    assert_eq!(f.m.active().unwrap().ca_digest, Some(digest));
    // The same bundle again: nothing to refresh.
    let mut both = f.ca.trust_pem();
    both.extend_from_slice(&ca2.trust_pem());
    let e = f.step(Input::Trust((both).into()));
    assert!(job(&e).is_none(), "{e:?}");
}

#[test]
fn untrusting_bundle_renews_at_once() {
    let mut f = Fixture::active();
    let ca2 = TestCa::p256("machine test CA 2");
    let e = f.step(Input::Trust((ca2.trust_pem()).into()));
    assert!(has(&e, |e| matches!(
        e,
        Effect::Warning(Some(Reason::IdentityUntrusted))
    )));
    assert!(matches!(job(&e), Some(Job::Mint(p)) if p.generation == 2));
}

#[test]
fn invalid_bundle_keeps_the_trust_and_a_repeat_clears_the_warning() {
    let mut f = Fixture::active();
    let before = f.m.trust().unwrap().digest();
    let e = f.step(Input::Trust((b"garbage".to_vec()).into()));
    assert!(has(&e, |e| matches!(
        e,
        Effect::Warning(Some(Reason::TrustBundleInvalid))
    )));
    assert_eq!(f.m.trust().unwrap().digest(), before);
    let pem = f.ca.trust_pem();
    let e = f.step(Input::Trust((pem).into()));
    assert!(has(&e, |e| matches!(e, Effect::Warning(None))), "{e:?}");
    assert!(job(&e).is_none());
}

#[test]
fn garbage_collection_needs_the_ovsdb_read() {
    let mut f = Fixture::active();
    let e = f.step(Input::CollectGarbage);
    assert!(matches!(job(&e), Some(Job::ReadOvsdb)));
    assert!(
        f.step(Input::OvsdbRead(Err(Error::Ovsdb("down".into()))))
            .is_empty(),
        "no read, no collection"
    );
    let paths = vec![PathBuf::from("/keys/gen-000001/cert.pem")];
    let e = f.step(Input::OvsdbRead(Ok(paths.clone())));
    let Some(Job::CollectGarbage { referenced, .. }) = job(&e) else {
        panic!("{e:?}")
    };
    assert_eq!(referenced, &paths);
    let e = f.step(Input::Collected {
        retired: Vec::new(),
        result: Ok(vec![3]),
    });
    assert!(has(&e, |e| matches!(
        e,
        Effect::Job(Job::Save {
            purpose: SavePurpose::Collection,
            ..
        })
    )));
}

#[test]
fn garbage_collection_waits_for_an_open_key_dir() {
    let mut f = Fixture::new();
    assert!(
        f.step(Input::OvsdbRead(Ok(Vec::new()))).is_empty(),
        "closed: nothing to collect"
    );
}

/// A rotation's CA: valid from `BASE + 60` (after the fixture's leaf).
fn rotated_ca() -> TestCa {
    use kube_ovn_ipsec_api::test_util::CaSpec;
    let from = Timestamp::from_unix(i64::try_from(BASE).unwrap() + 60).unwrap();
    CaSpec::new("machine test CA 2")
        .valid(from, from.plus_secs(10 * 365 * 86400))
        .self_signed()
}

#[test]
fn an_announced_signing_ca_renews_an_older_leaf_within_the_spread() {
    let mut f = Fixture::new();
    f.open_empty();
    let ca2 = rotated_ca();
    let mut both = f.ca.trust_pem();
    both.extend_from_slice(&ca2.trust_pem());
    let e = f.step(Input::Trust(both.clone().into()));
    let g = f.mint_and_submit(&e);
    let e = f.activate(g);
    assert!(
        !has(&e, |e| matches!(e, Effect::RenewalDueAfter { .. })),
        "no mark, no rotation: {e:?}"
    );
    // The mark names the leaf's own CA: nothing to do.
    let own = TrustSource {
        bundle_pem: both.clone(),
        signing_ca: Some(
            Certificate::from_der(f.ca.cert_der())
                .unwrap()
                .digest()
                .to_hex(),
        ),
    };
    let e = f.step(Input::Trust(own));
    assert!(!has(&e, |e| matches!(e, Effect::RenewalDueAfter { .. })));

    let marked = TrustSource {
        bundle_pem: both,
        signing_ca: Some(
            Certificate::from_der(ca2.cert_der())
                .unwrap()
                .digest()
                .to_hex(),
        ),
    };
    let e = f.step(Input::Trust(marked.clone()));
    let delay = e
        .iter()
        .find_map(|e| match e {
            Effect::RenewalDueAfter { generation, delay } if *generation == g => Some(*delay),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a rotation renewal: {e:?}"));
    // CA NotBefore (now + 60 s) + the 5 min backdate + [0, 300 s) of spread.
    assert!(
        (360..660).contains(&delay.as_secs()),
        "{delay:?} outside the spread"
    );
    // The same announcement again arms nothing new.
    let e = f.step(Input::Trust(marked));
    assert!(!has(&e, |e| matches!(e, Effect::RenewalDueAfter { .. })));
    // When it fires: a new generation, as at a renewal point.
    let e = f.step(Input::RenewalDue { generation: g });
    assert!(
        matches!(job(&e), Some(Job::Mint(p)) if p.generation == g + 1),
        "{e:?}"
    );
}

#[test]
fn a_signing_ca_outside_the_bundle_is_ignored() {
    let mut f = Fixture::active();
    let ca2 = rotated_ca();
    let e = f.step(Input::Trust(TrustSource {
        bundle_pem: f.ca.trust_pem(),
        signing_ca: Some(
            Certificate::from_der(ca2.cert_der())
                .unwrap()
                .digest()
                .to_hex(),
        ),
    }));
    assert!(!has(&e, |e| matches!(e, Effect::RenewalDueAfter { .. })));
    assert!(job(&e).is_none(), "{e:?}");
}

/// Opens a key directory whose active identity (generation 1) came from a
/// CSR that Pod `requester` requested; the effects once open.
fn open_with_active(f: &mut Fixture, requester: &str) -> Vec<Effect> {
    use crate::identity::recovery::LoadedActive;
    use crate::keydir::{ActiveRecord, CsrBinding};
    use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
    let key = PrivateKey::generate(KeyType::EcdsaP256).unwrap();
    let request = key
        .csr_pem(&Chassis::new("chassis-node-1").unwrap())
        .unwrap();
    let pem = f.ca.sign(
        &request,
        BASE,
        Duration::from_secs(u64::from(LIFETIME)),
        Tamper::None,
    );
    let certificate = Certificate::from_pem(pem.as_bytes()).unwrap();
    let state = KeyDirState {
        version: STATE_VERSION,
        last_generation: 1,
        active: Some(ActiveRecord {
            generation: 1,
            certificate_digest: certificate.digest().to_hex(),
            csr: Some(CsrBinding {
                name: "ovn-ipsec-one".into(),
                uid: "3f1c2a9e-0000-4000-8000-0000000000c1".into(),
                pod_uid: Some(requester.into()),
            }),
        }),
        ..KeyDirState::default()
    };
    let trust = TrustBundle::from_pem(&f.ca.trust_pem()).unwrap();
    f.step(Input::Open);
    f.step(Input::Opened(Ok(Box::new(Recovered {
        state,
        moved: None,
        active: Some(Ok(LoadedActive {
            certificate,
            trust: Some(trust),
        })),
        pending: None,
    }))));
    f.step(Input::Saved {
        purpose: SavePurpose::Recovery,
        result: Ok(()),
    })
}

#[test]
fn an_identity_this_pod_requested_is_resumed_without_a_request() {
    let mut f = Fixture::new();
    let this_pod = config().pod_uid.as_str().to_owned();
    let e = open_with_active(&mut f, &this_pod);
    assert!(!matches!(job(&e), Some(Job::Mint(_))), "{e:?}");
    assert_eq!(ready(&e), Some(1), "the active generation is offered");
}

#[test]
fn an_identity_another_pod_requested_is_renewed_at_once() {
    // The DaemonSet replaced the Pod: receipts must name this Pod's CSR,
    // and a node in Prepare activates nothing that would trigger it later.
    let mut f = Fixture::new();
    let e = open_with_active(&mut f, "3f1c2a9e-0000-4000-8000-0000000000ff");
    assert!(
        matches!(job(&e), Some(Job::Mint(p)) if p.generation == 2),
        "{e:?}"
    );
    assert_eq!(ready(&e), Some(1), "the old identity keeps serving");
}

#[test]
fn a_respawned_writer_is_asked_again_at_once_for_an_awaited_activation() {
    let mut f = Fixture::active();
    // Nothing awaited: a respawned writer changes nothing.
    assert!(f.step(Input::WriterStarted).is_empty());
    let e = f.step(Input::RenewalDue { generation: 1 });
    let g = f.mint_and_submit(&e);
    f.issue_and_store(g);
    // The writer died with the request: the next one gets it at once,
    // not after the watchdog's delay.
    let e = f.step(Input::WriterStarted);
    assert_eq!(ready(&e), Some(g), "{e:?}");
    f.step(Input::Activated { generation: g });
    assert_eq!(f.m.active().unwrap().generation, g);
    assert!(f.step(Input::WriterStarted).is_empty());
}
