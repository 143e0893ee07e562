//! Fakes for the ports (feature `test-util`): a CSR API that signs with a
//! throw-away CA, denies, fails, returns mismatching certificates or never
//! answers, and an in-memory OVSDB. Both fail loudly on unexpected calls:
//! they return an error *and* record the call in `unexpected()`, which tests
//! assert empty. Waits never outlast the caller's timeout. The fakes of the
//! tunnel actors' ports (protection, processes) are in [`tunnel`].

#![allow(clippy::expect_used, clippy::unwrap_used)] // test support: a panic is a test failure

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;

pub mod tunnel;

use crate::error::{Error, Result};
use crate::ports::{CsrApi, CsrOutcome, CsrRef, CsrSubmission, OvsdbIdentity, OvsdbIdentityKeys};
use kube_ovn_ipsec_api::clock::Clock;

/// The test CA and its tamper modes are the workspace's one test CA,
/// `api`'s (feature `test-util`).
pub use kube_ovn_ipsec_api::test_util::{Tamper, TestCa};

/// What the fake signer does with the next new CSR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrScript {
    /// Issue with the test CA.
    Issue,
    /// Issue, deviating from the request.
    IssueTampered(Tamper),
    /// Deny with a reason.
    Deny(String),
    /// Fail with a reason.
    Fail(String),
    /// Never decide (waits time out).
    Hang,
}

#[derive(Debug)]
struct CsrObject {
    uid: String,
    submission: CsrSubmission,
    outcome: Option<CsrOutcome>,
}

#[derive(Debug, Default)]
struct FakeCsrInner {
    script: VecDeque<CsrScript>,
    otherwise: Option<CsrScript>,
    objects: HashMap<String, CsrObject>,
    submissions: Vec<CsrSubmission>,
    unexpected: Vec<String>,
    next_uid: u64,
}

/// A fake Kubernetes CSR API backed by [`TestCa`].
#[derive(Debug, Clone)]
pub struct FakeCsrApi {
    inner: Arc<Mutex<FakeCsrInner>>,
    ca: Arc<Mutex<Arc<TestCa>>>,
    clock: Arc<dyn Clock>,
}

impl FakeCsrApi {
    /// A fake signing with `ca`, judging time with `clock`.
    pub fn new(ca: Arc<TestCa>, clock: Arc<dyn Clock>) -> Self {
        FakeCsrApi {
            inner: Arc::default(),
            ca: Arc::new(Mutex::new(ca)),
            clock,
        }
    }

    /// Queues what happens to the next new CSRs, in order.
    pub fn then(&self, step: CsrScript) -> &Self {
        self.inner.lock().unwrap().script.push_back(step);
        self
    }

    /// What happens to new CSRs once the queue is empty (instead of the
    /// loud "unexpected" failure).
    pub fn otherwise(&self, step: CsrScript) -> &Self {
        self.inner.lock().unwrap().otherwise = Some(step);
        self
    }

    /// Signs with another CA from now on (a CA rotation).
    pub fn set_ca(&self, ca: Arc<TestCa>) {
        *self.ca.lock().unwrap() = ca;
    }

    /// Every creation request seen (also repeated ones for an existing name).
    pub fn submissions(&self) -> Vec<CsrSubmission> {
        self.inner.lock().unwrap().submissions.clone()
    }

    /// Distinct CSR objects created.
    pub fn objects(&self) -> usize {
        self.inner.lock().unwrap().objects.len()
    }

    /// Calls nobody scripted.
    pub fn unexpected(&self) -> Vec<String> {
        self.inner.lock().unwrap().unexpected.clone()
    }

    /// Decides a hanging CSR now (as a late controller would).
    pub fn decide(&self, name: &str, step: CsrScript) {
        let mut inner = self.inner.lock().unwrap();
        let req = match inner.objects.get(name) {
            Some(o) => String::from_utf8(o.submission.request_pem.clone()).unwrap(),
            None => {
                inner
                    .unexpected
                    .push(format!("decide on unknown CSR {name}"));
                return;
            }
        };
        let lifetime = inner.objects[name].submission.expiration_seconds;
        let outcome = self.outcome_for(&req, lifetime, &step);
        if let Some(o) = inner.objects.get_mut(name) {
            o.outcome = outcome;
        }
    }

    fn outcome_for(&self, request: &str, lifetime: u32, step: &CsrScript) -> Option<CsrOutcome> {
        let now = self
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let lifetime = Duration::from_secs(u64::from(lifetime));
        let ca = self.ca.lock().unwrap().clone();
        match step {
            CsrScript::Issue => Some(CsrOutcome::Issued {
                certificate_pem: ca.sign(request, now, lifetime, Tamper::None).into_bytes(),
            }),
            CsrScript::IssueTampered(t) => Some(CsrOutcome::Issued {
                certificate_pem: ca.sign(request, now, lifetime, *t).into_bytes(),
            }),
            CsrScript::Deny(r) => Some(CsrOutcome::Denied {
                reason: r.clone(),
                message: format!("denied: {r}"),
            }),
            CsrScript::Fail(r) => Some(CsrOutcome::Failed {
                reason: r.clone(),
                message: format!("failed: {r}"),
            }),
            CsrScript::Hang => None,
        }
    }
}

#[async_trait]
impl CsrApi for FakeCsrApi {
    async fn submit(&self, csr: &CsrSubmission) -> Result<CsrRef> {
        let mut inner = self.inner.lock().unwrap();
        inner.submissions.push(csr.clone());
        if let Some(o) = inner.objects.get(&csr.name) {
            return Ok(CsrRef {
                name: csr.name.clone(),
                uid: o.uid.clone(),
            });
        }
        let Some(step) = inner.script.pop_front().or_else(|| inner.otherwise.clone()) else {
            let msg = format!("unexpected CSR creation {}", csr.name);
            inner.unexpected.push(msg.clone());
            return Err(Error::CsrApi(msg));
        };
        let request = String::from_utf8(csr.request_pem.clone()).unwrap();
        let outcome = self.outcome_for(&request, csr.expiration_seconds, &step);
        inner.next_uid += 1;
        let uid = format!("csr-uid-{}", inner.next_uid);
        inner.objects.insert(
            csr.name.clone(),
            CsrObject {
                uid: uid.clone(),
                submission: csr.clone(),
                outcome,
            },
        );
        Ok(CsrRef {
            name: csr.name.clone(),
            uid,
        })
    }

    async fn wait(&self, name: &str, timeout: Duration) -> Result<CsrOutcome> {
        {
            let mut inner = self.inner.lock().unwrap();
            match inner.objects.get(name) {
                None => {
                    inner.unexpected.push(format!("wait on unknown CSR {name}"));
                    return Ok(CsrOutcome::NotFound);
                }
                Some(CsrObject {
                    outcome: Some(o), ..
                }) => return Ok(o.clone()),
                Some(_) => {}
            }
        }
        tokio::time::sleep(timeout).await;
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .objects
            .get(name)
            .and_then(|o| o.outcome.clone())
            .unwrap_or(CsrOutcome::Pending))
    }
}

#[derive(Debug, Default)]
struct FakeOvsdbInner {
    other_config: BTreeMap<String, String>,
    transactions: usize,
    fail_next: usize,
}

/// An in-memory `Open_vSwitch . other_config`.
#[derive(Debug, Clone, Default)]
pub struct FakeOvsdb {
    inner: Arc<Mutex<FakeOvsdbInner>>,
}

const KEYS: [&str; 3] = ["private_key", "certificate", "ca_cert"];

impl FakeOvsdb {
    /// A database holding `other` (unrelated keys that must survive).
    pub fn with_other_config(other: &[(&str, &str)]) -> Self {
        let db = FakeOvsdb::default();
        db.inner.lock().unwrap().other_config = other
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        db
    }

    /// The whole `other_config`.
    pub fn other_config(&self) -> BTreeMap<String, String> {
        self.inner.lock().unwrap().other_config.clone()
    }

    /// Committed identity transactions.
    pub fn transactions(&self) -> usize {
        self.inner.lock().unwrap().transactions
    }

    /// Someone else (`ovs-vsctl remove`) deletes `key` from `other_config`.
    pub fn remove_key(&self, key: &str) {
        self.inner.lock().unwrap().other_config.remove(key);
    }

    /// Makes the next `n` activations fail as if OVSDB were down.
    pub fn fail_next(&self, n: usize) {
        self.inner.lock().unwrap().fail_next = n;
    }

    fn keys(m: &BTreeMap<String, String>) -> OvsdbIdentityKeys {
        OvsdbIdentityKeys {
            private_key: m.get(KEYS[0]).cloned(),
            certificate: m.get(KEYS[1]).cloned(),
            ca_cert: m.get(KEYS[2]).cloned(),
        }
    }
}

#[async_trait]
impl OvsdbIdentity for FakeOvsdb {
    async fn read(&self) -> Result<OvsdbIdentityKeys> {
        Ok(Self::keys(&self.inner.lock().unwrap().other_config))
    }

    async fn activate(&self, new: &OvsdbIdentityKeys) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        if inner.fail_next > 0 {
            inner.fail_next -= 1;
            return Err(Error::Ovsdb("connection refused (fake)".into()));
        }
        // Already pointing at `new`: confirmed, nothing committed (what the
        // real adapter does after a read that finds the keys set).
        if &Self::keys(&inner.other_config) == new {
            return Ok(());
        }
        let values = [&new.private_key, &new.certificate, &new.ca_cert];
        if values.iter().any(|v| v.is_none()) {
            return Err(Error::Ovsdb("activation must set all three keys".into()));
        }
        for (k, v) in KEYS.iter().zip(values) {
            if let Some(v) = v {
                inner.other_config.insert((*k).to_owned(), v.clone());
            }
        }
        inner.transactions += 1;
        Ok(())
    }
}

/// Everything published on `port` from now on, in order.
pub async fn record_bus<T>(port: &ractor::OutputPort<T>) -> Arc<Mutex<Vec<T>>>
where
    T: ractor::Message + Clone,
{
    struct Recorder<T>(Arc<Mutex<Vec<T>>>);
    impl<T: ractor::Message> ractor::Actor for Recorder<T> {
        type Msg = T;
        type State = ();
        type Arguments = ();
        async fn pre_start(
            &self,
            _: ractor::ActorRef<T>,
            _: (),
        ) -> std::result::Result<(), ractor::ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ractor::ActorRef<T>,
            msg: T,
            _: &mut (),
        ) -> std::result::Result<(), ractor::ActorProcessingErr> {
            self.0.lock().unwrap().push(msg);
            Ok(())
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (actor, _) = ractor::Actor::spawn(None, Recorder(seen.clone()), ())
        .await
        .unwrap();
    port.subscribe(actor, Some);
    seen
}
