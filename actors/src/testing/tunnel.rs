//! Fakes of the tunnel actors' ports: output protection whose guards a
//! test can make vanish or conflict, and processes a test can kill or make
//! fail their probe. Every call is recorded with tokio's (pausable) time;
//! trust installs and read-backs also with a step number shared by every
//! fake, so a test can order calls made on different fakes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::status::Reason;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::ports::{
    Acknowledgement, GuardChange, GuardReadback, IkePort, LeaseSummary, MonitorPort,
    OvsdbIdentityKeys, ProtectionPort, RunningMonitor, RunningProcess, SaSummary, TrustInstalled,
};

#[derive(Debug, Default)]
struct ProtectionInner {
    refuse: Option<Reason>,
    /// Whether OVSDB holds the published lease.
    publication_present: bool,
    guards_present: bool,
    ever_armed: bool,
    conflict: bool,
    published: u32,
    evaluations: u32,
    readds: u32,
    observations: u32,
    observe_fails: bool,
    publish_fails: bool,
    /// A publication happened while the guards were not armed.
    published_before_armed: bool,
    /// A lease of this node is persisted (allocated before).
    persisted: bool,
    /// Lease requests with and without allocation so far.
    obtained: u32,
}

/// A fake [`ProtectionPort`].
#[derive(Debug, Clone, Default)]
pub struct FakeProtection {
    inner: Arc<Mutex<ProtectionInner>>,
}

impl FakeProtection {
    /// A port that hands out a lease and arms guards.
    pub fn new() -> Self {
        Self::default()
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, ProtectionInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Someone removed the published lease from OVSDB.
    pub fn remove_publication(&self) {
        self.lock().publication_present = false;
    }

    /// A lease of this node is persisted already (a restart of an armed
    /// node), or not.
    pub fn set_persisted(&self, persisted: bool) {
        self.lock().persisted = persisted;
    }
    /// Whether a lease is persisted (allocated at some point).
    pub fn persisted(&self) -> bool {
        self.lock().persisted
    }
    /// Lease requests so far (with or without allocation).
    pub fn lease_requests(&self) -> u32 {
        self.lock().obtained
    }

    /// Lease allocation refuses with `reason` (a bypass, exhaustion).
    pub fn refuse(&self, reason: Option<Reason>) {
        self.lock().refuse = reason;
    }
    /// The guards vanish from the "kernel" (someone flushed them).
    pub fn remove_guards(&self) {
        let mut i = self.lock();
        i.guards_present = false;
    }
    /// A foreign policy occupies the guards' place.
    pub fn set_conflict(&self, conflict: bool) {
        self.lock().conflict = conflict;
    }
    /// Whether the guards are in the "kernel" now.
    pub fn guards_present(&self) -> bool {
        self.lock().guards_present
    }
    /// Publications so far.
    pub fn published(&self) -> u32 {
        self.lock().published
    }
    /// Whether a publication ever happened before the guards were armed.
    pub fn published_before_armed(&self) -> bool {
        self.lock().published_before_armed
    }
    /// Evaluations so far.
    pub fn evaluations(&self) -> u32 {
        self.lock().evaluations
    }
    /// Re-adds so far.
    pub fn readds(&self) -> u32 {
        self.lock().readds
    }
    /// SA observation passes so far.
    pub fn observations(&self) -> u32 {
        self.lock().observations
    }
    /// Publishing the lease fails (OVSDB unreachable), or works.
    pub fn fail_publications(&self, fail: bool) {
        self.lock().publish_fails = fail;
    }

    /// SA observation fails (e.g. OVSDB unreachable).
    pub fn fail_observations(&self, fail: bool) {
        self.lock().observe_fails = fail;
    }
}

#[async_trait]
impl ProtectionPort for FakeProtection {
    async fn obtain_lease(&self, allocate: bool) -> Result<Option<LeaseSummary>> {
        let mut i = self.lock();
        if let Some(reason) = i.refuse {
            return Err(Error::Protection {
                reason,
                detail: "refused by the fake".into(),
            });
        }
        i.obtained += 1;
        if !allocate && !i.persisted {
            return Ok(None);
        }
        let allocated = !i.persisted;
        i.persisted = true;
        Ok(Some(LeaseSummary {
            lease_id: "00000000-0000-4000-8000-000000000001".into(),
            mark: 0x1234_0001,
            reqid: 4242,
            allocated,
        }))
    }

    async fn evaluate_guards(&self) -> Result<GuardReadback> {
        let mut i = self.lock();
        i.evaluations += 1;
        if i.conflict {
            return Ok(GuardReadback {
                armed: false,
                changes: vec![GuardChange::Conflict {
                    family: "ipv4".into(),
                    index: 99,
                    detail: "action allow".into(),
                }],
            });
        }
        let mut changes = Vec::new();
        if !i.guards_present {
            i.guards_present = true;
            if i.ever_armed {
                i.readds += 1;
                changes.push(GuardChange::Readded {
                    family: "ipv4".into(),
                    old_index: 1,
                    new_index: 2,
                });
            } else {
                changes.push(GuardChange::Armed {
                    family: "ipv4".into(),
                    index: 1,
                });
            }
            i.ever_armed = true;
        }
        Ok(GuardReadback {
            armed: true,
            changes,
        })
    }

    async fn publish_lease(&self) -> Result<Vec<String>> {
        let mut i = self.lock();
        if i.publish_fails {
            return Err(Error::Protection {
                reason: Reason::OvsdbUnavailable,
                detail: "publication refused by the fake".into(),
            });
        }
        if !i.guards_present {
            i.published_before_armed = true;
        }
        if i.publication_present {
            return Ok(Vec::new());
        }
        i.publication_present = true;
        i.published += 1;
        Ok(vec!["ovn-ipsec-protection-mark".into()])
    }

    async fn observe_sas(&self) -> Result<SaSummary> {
        let mut i = self.lock();
        i.observations += 1;
        if i.observe_fails {
            return Err(Error::Protection {
                reason: Reason::OvsdbUnavailable,
                detail: "observation refused by the fake".into(),
            });
        }
        Ok(SaSummary {
            tunnels: 1,
            sas: 2,
            policies: 4,
            recorded: i.observations == 1,
        })
    }
}

/// The step counter shared by every fake process: paused time gives calls
/// of one instant the same timestamp, a step number orders them.
static STEP: AtomicU64 = AtomicU64::new(0);

fn next_step() -> u64 {
    STEP.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Default)]
struct ProcInner {
    next_pid: u32,
    running: Option<u32>,
    killed: Vec<u32>,
    starts: Vec<Instant>,
    stops: Vec<u32>,
    probe_fails: bool,
    refuse_start: bool,
    ack: Option<Sha256Digest>,
    /// Steps of the monitor read-backs.
    read_backs: Vec<u64>,
    /// Steps of the trust installs that wrote (not the skipped ones).
    trust_installs: Vec<u64>,
    /// CAs the next trust install that writes reports retired.
    retire_next: usize,
    /// Steps of the rebuilds asked of the monitor.
    rebuilds: Vec<u64>,
    /// The IKE_SAs the daemon holds (ended by `end_ike_sas`).
    ike_sas: Vec<String>,
    /// Steps of the `end_ike_sas` calls.
    ike_sa_ends: Vec<u64>,
}

/// A fake foreground process (for [`IkePort`] and [`MonitorPort`]) and
/// the test's handle on it.
#[derive(Debug, Clone, Default)]
pub struct FakeProcess {
    name: &'static str,
    inner: Arc<Mutex<ProcInner>>,
}

impl FakeProcess {
    /// A fake process called `name`.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            inner: Arc::new(Mutex::new(ProcInner {
                next_pid: 1000,
                ..Default::default()
            })),
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, ProcInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// The running incarnation "dies" (SIGKILL from outside).
    pub fn kill(&self) {
        let mut i = self.lock();
        if let Some(pid) = i.running.take() {
            i.killed.push(pid);
        }
    }
    /// Probes fail (true) or pass.
    pub fn set_probe_fails(&self, fails: bool) {
        self.lock().probe_fails = fails;
    }
    /// Starting fails (true) or works.
    pub fn set_refuse_start(&self, refuse: bool) {
        self.lock().refuse_start = refuse;
    }
    /// What the monitor read-back acknowledges: `Some(trust)` applied.
    pub fn set_ack(&self, ack: Option<Sha256Digest>) {
        self.lock().ack = ack;
    }
    /// When each incarnation started.
    pub fn starts(&self) -> Vec<Instant> {
        self.lock().starts.clone()
    }
    /// PIDs stopped through the port (SIGTERM then SIGKILL).
    pub fn stops(&self) -> Vec<u32> {
        self.lock().stops.clone()
    }
    /// The running PID, if any.
    pub fn running(&self) -> Option<u32> {
        self.lock().running
    }
    /// Read-backs so far.
    pub fn acks(&self) -> u32 {
        self.lock().read_backs.len() as u32
    }
    /// The steps of the read-backs so far (see [`FakeProcess::trust_installs`]).
    pub fn read_backs(&self) -> Vec<u64> {
        self.lock().read_backs.clone()
    }
    /// The steps of the trust installs that wrote so far (skipped ones,
    /// of a bundle the caller had installed, are not counted); comparable
    /// with another fake's [`FakeProcess::read_backs`].
    pub fn trust_installs(&self) -> Vec<u64> {
        self.lock().trust_installs.clone()
    }
    /// The next trust install that writes reports `n` CAs retired.
    pub fn retire_on_next_install(&self, n: usize) {
        self.lock().retire_next = n;
    }
    /// The steps of the rebuilds asked of the monitor so far.
    pub fn rebuilds(&self) -> Vec<u64> {
        self.lock().rebuilds.clone()
    }
    /// The IKE_SAs the fake daemon holds now (`<conn>[<id>]`).
    pub fn set_ike_sas(&self, sas: &[&str]) {
        self.lock().ike_sas = sas.iter().map(|s| s.to_string()).collect();
    }
    /// The IKE_SAs it holds (those not ended yet).
    pub fn ike_sas(&self) -> Vec<String> {
        self.lock().ike_sas.clone()
    }
    /// The steps of the calls to end the IKE_SAs so far.
    pub fn ike_sa_ends(&self) -> Vec<u64> {
        self.lock().ike_sa_ends.clone()
    }

    fn start_one(&self) -> Result<FakeRunning> {
        let mut i = self.lock();
        if i.refuse_start {
            return Err(Error::Process {
                process: self.name,
                reason: "fake refuses to start".into(),
            });
        }
        i.next_pid += 1;
        let pid = i.next_pid;
        i.running = Some(pid);
        i.starts.push(Instant::now());
        Ok(FakeRunning {
            pid,
            name: self.name,
            inner: self.inner.clone(),
            exited: None,
        })
    }
}

/// One incarnation of a [`FakeProcess`].
#[derive(Debug)]
pub struct FakeRunning {
    pid: u32,
    name: &'static str,
    inner: Arc<Mutex<ProcInner>>,
    exited: Option<String>,
}

impl FakeRunning {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProcInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl RunningProcess for FakeRunning {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn try_exited(&mut self) -> Option<String> {
        if self.exited.is_none() && self.lock().killed.contains(&self.pid) {
            self.exited = Some("signal: 9 (SIGKILL)".into());
        }
        self.exited.clone()
    }
    async fn probe(&mut self) -> Result<()> {
        if self.lock().probe_fails {
            return Err(Error::Process {
                process: self.name,
                reason: "fake probe fails".into(),
            });
        }
        Ok(())
    }
    async fn stop(&mut self) -> Result<()> {
        let mut i = self.lock();
        i.stops.push(self.pid);
        if i.running == Some(self.pid) {
            i.running = None;
        }
        drop(i);
        self.exited = Some("stopped".into());
        Ok(())
    }
}

#[async_trait]
impl RunningMonitor for FakeRunning {
    async fn acknowledge(&mut self, keys: &OvsdbIdentityKeys) -> Result<Acknowledgement> {
        let mut i = self.lock();
        i.read_backs.push(next_step());
        let applied = keys.certificate.is_some() && i.ack.is_some();
        Ok(Acknowledgement {
            configuration_applied: applied,
            trust_digest: if applied { i.ack } else { None },
            mismatches: if applied {
                vec![]
            } else {
                vec!["fake: not applied".into()]
            },
        })
    }

    async fn rebuild(&mut self) -> Result<Vec<String>> {
        self.lock().rebuilds.push(next_step());
        Ok(vec!["fake-tunnel".into()])
    }
}

#[async_trait]
impl IkePort for FakeProcess {
    async fn start(&self) -> Result<Box<dyn RunningProcess>> {
        Ok(Box::new(self.start_one()?))
    }

    /// The bundle's digest is that of the CA file's bytes (the tests' key
    /// directories are real); nothing is written anywhere.
    async fn install_trust(
        &self,
        keys: &OvsdbIdentityKeys,
        installed: Option<Sha256Digest>,
    ) -> Result<Option<TrustInstalled>> {
        let (Some(_), Some(ca)) = (&keys.certificate, &keys.ca_cert) else {
            return Ok(None);
        };
        let bundle = std::fs::read(ca).map_err(|e| Error::Process {
            process: self.name,
            reason: format!("fake reads {ca}: {e}"),
        })?;
        let digest = Sha256Digest::of(&bundle);
        let mut retired = 0;
        if installed != Some(digest) {
            let mut i = self.lock();
            i.trust_installs.push(next_step());
            retired = std::mem::take(&mut i.retire_next);
        }
        Ok(Some(TrustInstalled { digest, retired }))
    }

    /// Records the call; ends the IKE_SAs [`FakeProcess::set_ike_sas`]
    /// says exist (none by default).
    async fn end_ike_sas(&self) -> Result<Vec<String>> {
        let mut i = self.lock();
        i.ike_sa_ends.push(next_step());
        Ok(std::mem::take(&mut i.ike_sas))
    }
}

#[async_trait]
impl MonitorPort for FakeProcess {
    async fn start(&self) -> Result<Box<dyn RunningMonitor>> {
        Ok(Box::new(self.start_one()?))
    }
}
