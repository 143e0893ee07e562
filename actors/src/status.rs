//! The status board: the SPEC §5 document, a projection of what the actors
//! report, read by the `runtime` crate's `/status` and `/readyz` handlers.
//!
//! Actors only write to it (their health, the active identity, the
//! monitor's acknowledgement, failing children); none reads it back to
//! decide what to do — what one actor must know of another travels as an
//! event on the bus (`bus`), e.g. the monitor learns of an activation from
//! the identity's `Active` event.
//!
//! A shared board rather than an actor: the document must survive the
//! respawn of any actor (including one that would own it), updates are
//! synchronous field sets that cannot fail, and readers get the latest
//! snapshot through a `watch` channel without a mailbox round trip.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::{Chassis, Uid};
use kube_ovn_ipsec_api::status::{Phase, Reason, Status};
use kube_ovn_ipsec_api::time::Timestamp;
use tokio::sync::watch;

use kube_ovn_ipsec_api::clock::Clock;

/// The oldest guard read-back `/readyz` answers from (SPEC §4).
pub const MAX_READBACK_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// Wall time as a status timestamp (whole seconds, clamped to the years
/// 1970..=9999 that [`Timestamp`] accepts).
#[allow(clippy::expect_used)] // the clamped value is inside the accepted range
pub fn timestamp(t: SystemTime) -> Timestamp {
    const MAX: u64 = 253_402_300_799;
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        .min(MAX);
    Timestamp::from_unix(secs as i64).expect("clamped into range")
}

/// What the identity actor reports about its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityCondition {
    /// Nothing known yet.
    Starting,
    /// Working towards an identity (CSR pending, retrying); `reason` says
    /// what is happening or what failed last.
    Working(Option<Reason>),
    /// Blocked on a host problem the agent cannot fix (read-only key dir).
    Blocked(Reason),
}

#[derive(Debug)]
struct Board {
    status: Status,
    identity: IdentityCondition,
    /// A warning while an identity is active (renewal failing, bad trust).
    warning: Option<Reason>,
    /// The generation OVSDB was confirmed to point at.
    activated: Option<u64>,
    /// Current trust bundle digest held by the agent.
    trust: Option<Sha256Digest>,
    /// Failing supervised children and the reason each maps to.
    failing: BTreeMap<String, Reason>,
    /// When the guards were last read back (armed or not).
    readback_at: Option<SystemTime>,
    /// The identity keys in OVSDB were found changed and are not restored.
    ovsdb_drift: bool,
    /// Health of the processes, as their actors last saw it.
    runtime: BTreeMap<RuntimeComponent, bool>,
    /// Why the guards are not armed, when known (missing, conflict).
    protection_problem: Option<Reason>,
    /// The generation the monitor's read-back matched, with the trust
    /// digest it acknowledged.
    acknowledged: Option<(u64, Sha256Digest)>,
    /// Coordination says `Prepare` for this node, with the issued (not yet
    /// activated) identity: generation, certificate digest, expiry. Set by
    /// the node coordinator.
    prepare: Option<(u64, Sha256Digest, Timestamp)>,
    /// The capability gate failed.
    capability_missing: bool,
    /// The lease the protection actor holds (`ipsec/show`).
    lease: Option<crate::ports::LeaseSummary>,
    /// Data-path samples taken (`ipsec/refresh` waits for the next one).
    datapath_samples: u64,
    /// The last data-path sample failed (the report shown is older).
    datapath_failed: bool,
    /// The data path's reason while it is unhealthy.
    datapath_reason: Option<Reason>,
}

/// What `ipsec/show` prints beyond the `/status` document.
#[derive(Debug, Clone)]
pub struct Diagnostics {
    /// The `/status` document.
    pub status: Status,
    /// The lease held, if any.
    pub lease: Option<crate::ports::LeaseSummary>,
    /// Since the guards were last read back.
    pub readback_age: Option<std::time::Duration>,
    /// Why the guards are not armed, when known.
    pub protection_problem: Option<Reason>,
    /// Supervised children that keep failing, with their reasons.
    pub failing: BTreeMap<String, Reason>,
    /// Data-path samples taken so far.
    pub datapath_samples: u64,
    /// Whether the last data-path sample failed.
    pub datapath_failed: bool,
}

/// A process (of the tunnel actors) whose health feeds `runtimeHealthy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuntimeComponent {
    /// The IKE daemon (strongSwan).
    IkeDaemon,
    /// `ovs-monitor-ipsec`.
    Monitor,
}

impl RuntimeComponent {
    /// Both components; `runtimeHealthy` needs each of them healthy.
    pub const ALL: [RuntimeComponent; 2] = [RuntimeComponent::IkeDaemon, RuntimeComponent::Monitor];

    /// The reason shown while this component is unhealthy.
    pub fn reason(self) -> Reason {
        match self {
            RuntimeComponent::IkeDaemon => Reason::IkeDaemonUnhealthy,
            RuntimeComponent::Monitor => Reason::MonitorUnhealthy,
        }
    }
}

/// The shared status board. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    inner: Arc<Mutex<Board>>,
    tx: Arc<watch::Sender<Status>>,
    clock: Arc<dyn Clock>,
}

impl StatusBoard {
    /// A board in phase `Starting`, judging expiry with `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let (tx, _) = watch::channel(Status::starting());
        StatusBoard {
            inner: Arc::new(Mutex::new(Board {
                status: Status::starting(),
                identity: IdentityCondition::Starting,
                warning: None,
                activated: None,
                trust: None,
                failing: BTreeMap::new(),
                readback_at: None,
                ovsdb_drift: false,
                runtime: BTreeMap::new(),
                protection_problem: None,
                acknowledged: None,
                prepare: None,
                capability_missing: false,
                lease: None,
                datapath_samples: 0,
                datapath_failed: false,
                datapath_reason: None,
            })),
            tx: Arc::new(tx),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut Board)) {
        let mut b = self.lock();
        f(&mut b);
        let now = timestamp(self.clock.now());
        derive_phase(&mut b, now);
        let snapshot = b.status.clone();
        drop(b);
        self.tx.send_replace(snapshot);
    }

    /// Re-derives the phase against the clock and hands the result to the
    /// followers ([`StatusBoard::subscribe`]): time alone can change it
    /// (expiry).
    pub fn refresh(&self) {
        self.update(|_| {});
    }

    /// The current document (phase re-derived against the clock).
    pub fn snapshot(&self) -> Status {
        self.refresh();
        self.lock().status.clone()
    }

    /// Follows the document as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.tx.subscribe()
    }

    /// The `/readyz` rule (SPEC §5): 200 only when the active certificate
    /// is unexpired and either
    ///
    /// - coordination says `Prepare` and an unexpired identity is issued
    ///   (activation waits for `Arm`): [`StatusBoard::set_coordination_prepare`],
    ///   set by the node coordinator, or
    /// - the IKE daemon and the monitor are healthy, the guards were read
    ///   back from the kernel, and the monitor acknowledged the active
    ///   generation with the current trust digest.
    ///
    /// The error names the first condition that does not hold.
    pub fn readyz(&self) -> Result<(), Reason> {
        let now = timestamp(self.clock.now());
        if let Some((_, _, expires)) = self.lock().prepare
            && now < expires
        {
            return Ok(());
        }
        self.identity_ready()?;
        let b = self.lock();
        if b.ovsdb_drift {
            return Err(Reason::OvsdbDrift);
        }
        // Guards a read-back found unarmed hold the IKE daemon and the
        // monitor back: their cause is the one to act on, and the one
        // /status names.
        if !b.status.protection_armed
            && let Some(problem) = b.protection_problem
        {
            return Err(problem);
        }
        for c in RuntimeComponent::ALL {
            if b.runtime.get(&c) != Some(&true) {
                return Err(c.reason());
            }
        }
        if !b.status.protection_armed {
            return Err(b.protection_problem.unwrap_or(Reason::GuardMissing));
        }
        // Armed as of the last read-back — which must be recent: a stalled
        // protection actor must not keep the node ready on old evidence.
        // (A clock stepped back counts as fresh, never as stale forever.)
        let age = b
            .readback_at
            .map(|t| self.clock.now().duration_since(t).unwrap_or_default());
        if age.is_none_or(|a| a > MAX_READBACK_AGE) {
            return Err(Reason::GuardReadbackStale);
        }
        let current_trust = b.trust;
        match b.acknowledged {
            Some((generation, trust))
                if Some(generation) == b.activated
                    && b.status.configuration_applied
                    // Until the first bundle arrives the active generation's
                    // own ca.pem is the trust: what the monitor acknowledged.
                    && current_trust.is_none_or(|t| t == trust) =>
            {
                Ok(())
            }
            _ => Err(Reason::MonitorNotAcknowledged),
        }
    }

    /// The identity half of readiness: an unexpired active identity whose
    /// OVSDB activation was confirmed (identity tests use it without the
    /// tunnel actors).
    pub fn identity_ready(&self) -> Result<(), Reason> {
        let now = timestamp(self.clock.now());
        let b = self.lock();
        let s = &b.status;
        let unexpired = s.expires.is_some_and(|e| now < e);
        if !unexpired {
            return Err(if s.expires.is_some() {
                Reason::Expired
            } else {
                s.reason.unwrap_or(Reason::CsrPending)
            });
        }
        if s.generation.is_none() || b.activated != s.generation {
            return Err(Reason::ActivationFailed);
        }
        Ok(())
    }

    /// A process's health (`runtimeHealthy` is all of them).
    pub fn set_runtime_health(&self, component: RuntimeComponent, healthy: bool) {
        self.update(|b| {
            b.runtime.insert(component, healthy);
            b.status.runtime_healthy = RuntimeComponent::ALL
                .iter()
                .all(|c| b.runtime.get(c) == Some(&true));
        });
    }

    /// The guards' read-back: `protectionArmed` is `armed`; `problem` says
    /// why not (kept for `readyz`'s answer).
    pub fn set_protection(&self, armed: bool, problem: Option<Reason>) {
        let now = self.clock.now();
        self.update(|b| {
            b.status.protection_armed = armed;
            b.protection_problem = if armed { None } else { problem };
            b.readback_at = Some(now);
        });
    }

    /// The monitor's read-back of `generation`: `configurationApplied`
    /// and, when applied, the acknowledged trust digest. A read-back of a
    /// generation that is no longer the active one is ignored.
    pub fn set_acknowledgement(&self, generation: u64, applied: Option<Sha256Digest>) {
        self.update(|b| {
            if b.activated != Some(generation) {
                return;
            }
            match applied {
                Some(trust) => {
                    b.status.configuration_applied = true;
                    b.status.trust_digest = Some(trust);
                    b.acknowledged = Some((generation, trust));
                }
                None => {
                    b.status.configuration_applied = false;
                    b.acknowledged = None;
                }
            }
        });
    }

    /// Coordination says `Prepare` for this node with this issued identity
    /// (generation, certificate digest, expiry), or not (`None`). While it
    /// does, an unexpired issued identity is enough for `readyz` and the
    /// phase is `Prepare` (SPEC §5, §7).
    pub fn set_coordination_prepare(&self, prepared: Option<(u64, Sha256Digest, Timestamp)>) {
        if self.lock().prepare == prepared {
            return;
        }
        self.update(|b| {
            b.prepare = prepared;
            if b.activated.is_none()
                && let Some((generation, digest, expires)) = prepared
            {
                b.status.generation = Some(generation);
                b.status.certificate_digest = Some(digest);
                b.status.expires = Some(expires);
            }
        });
    }

    /// The datapath actor's latest report (`None`: the node holds no lease,
    /// nothing to measure): `datapathHealthy`, `peers`, `mtu`. An unhealthy
    /// data path makes an otherwise active node `Degraded` with the
    /// data path's reason; it does not touch `/readyz` (a peer's broken
    /// underlay must not take this node's Pod out of service).
    pub fn set_datapath(&self, report: Option<kube_ovn_ipsec_api::datapath::DatapathReport>) {
        self.update(|b| {
            b.datapath_samples += 1;
            b.datapath_failed = false;
            b.datapath_reason = report.as_ref().and_then(|r| r.reason());
            match report {
                Some(r) => {
                    b.status.datapath_healthy = Some(r.healthy());
                    b.status.peers = r.peers;
                    b.status.mtu = r.mtu;
                }
                None => {
                    b.status.datapath_healthy = None;
                    b.status.peers = Vec::new();
                    b.status.mtu = None;
                }
            }
        });
    }

    /// A data-path sample failed; the last report stays (and says when each
    /// peer entered its state).
    pub fn datapath_sample_failed(&self) {
        self.update(|b| {
            b.datapath_samples += 1;
            b.datapath_failed = true;
        });
    }

    /// The lease the protection actor holds (shown by `ipsec/show`; its
    /// mark and reqid are published in OVSDB anyway).
    pub fn set_lease(&self, lease: Option<crate::ports::LeaseSummary>) {
        self.update(|b| b.lease = lease);
    }

    /// Everything `ipsec/show` prints: the document and what the board
    /// knows beyond it. Never key material (the board holds none).
    pub fn diagnostics(&self) -> Diagnostics {
        let status = self.snapshot();
        let now = self.clock.now();
        let b = self.lock();
        Diagnostics {
            status,
            lease: b.lease.clone(),
            readback_age: b
                .readback_at
                .map(|t| now.duration_since(t).unwrap_or_default()),
            protection_problem: b.protection_problem,
            failing: b.failing.clone(),
            datapath_samples: b.datapath_samples,
            datapath_failed: b.datapath_failed,
        }
    }

    /// How many data-path samples were taken, and whether the last one
    /// failed.
    pub fn datapath_samples(&self) -> (u64, bool) {
        let b = self.lock();
        (b.datapath_samples, b.datapath_failed)
    }

    /// The capability gate failed: phase `CapabilityMissing`.
    pub fn set_capability_missing(&self) {
        self.update(|b| b.capability_missing = true);
    }

    /// Records who this node is.
    pub fn set_node(&self, node_uid: Uid, chassis: Chassis) {
        self.update(|b| {
            b.status.node_uid = Some(node_uid);
            b.status.chassis = Some(chassis);
        });
    }

    /// The identity actor's progress.
    pub fn set_identity_condition(&self, c: IdentityCondition) {
        self.update(|b| b.identity = c);
    }

    /// A warning shown while an identity is active (cleared with `None`).
    pub fn set_warning(&self, w: Option<Reason>) {
        self.update(|b| b.warning = w);
    }

    /// The active identity: generation, certificate digest, expiry. The
    /// OVSDB activation is confirmed for it.
    pub fn set_active(
        &self,
        generation: u64,
        certificate_digest: Sha256Digest,
        expires: Timestamp,
    ) {
        self.update(|b| {
            b.status.generation = Some(generation);
            b.status.certificate_digest = Some(certificate_digest);
            b.status.expires = Some(expires);
            if b.activated != Some(generation) {
                // A new generation is applied only once the monitor's
                // read-back says so.
                b.status.configuration_applied = false;
                b.acknowledged = None;
            }
            b.activated = Some(generation);
            b.identity = IdentityCondition::Working(None);
        });
    }

    /// The trust bundle the agent holds now.
    pub fn set_trust(&self, digest: Sha256Digest) {
        self.update(|b| b.trust = Some(digest));
    }

    /// The digest of the trust bundle held now.
    pub fn trust(&self) -> Option<Sha256Digest> {
        self.lock().trust
    }

    /// The OVSDB writer found the identity keys changed by someone else
    /// (`true`) or has written them back (`false`); not ready meanwhile.
    pub fn set_ovsdb_drift(&self, drifted: bool) {
        self.update(|b| b.ovsdb_drift = drifted);
    }

    /// A supervised child keeps failing.
    pub fn set_child_failing(&self, child: &str, reason: Reason) {
        self.update(|b| {
            b.failing.insert(child.to_owned(), reason);
        });
    }

    /// A supervised child is healthy again.
    pub fn clear_child_failing(&self, child: &str) {
        self.update(|b| {
            b.failing.remove(child);
        });
    }

    /// Children currently marked failing.
    pub fn failing_children(&self) -> BTreeMap<String, Reason> {
        self.lock().failing.clone()
    }
}

fn derive_phase(b: &mut Board, now: Timestamp) {
    let s = &mut b.status;
    let active = s.generation.is_some() && b.activated == s.generation;
    let expired = s.expires.is_some_and(|e| now >= e);
    let (phase, reason) = if b.capability_missing {
        (Phase::CapabilityMissing, Some(Reason::CapabilityMissing))
    } else if let IdentityCondition::Blocked(r) = b.identity {
        (Phase::Failed, Some(r))
    } else if expired {
        (Phase::Expired, Some(Reason::Expired))
    } else if let Some(r) = b.failing.values().next() {
        // Unarmed guards hold everything else back (the IKE daemon and
        // the monitor refuse to start): their reason is the one to act on.
        let held = (!s.protection_armed)
            .then_some(b.protection_problem)
            .flatten();
        (Phase::Degraded, Some(held.unwrap_or(*r)))
    } else if !active && b.prepare.is_some() {
        (Phase::Prepare, Some(Reason::WaitingForCoordination))
    } else if active {
        let working = match b.identity {
            IdentityCondition::Working(r) => r,
            _ => None,
        };
        // A broken data path degrades an active node; an identity warning
        // (renewal failing) still names the reason first.
        let datapath = b.datapath_reason;
        // What keeps /readyz failing on an active node is said here too,
        // so /status and /readyz never disagree: a read-back that found
        // the guards not armed (with its cause) and keys someone changed
        // in OVSDB. (No read-back yet is not a finding: an identity is
        // activated only after the guards were read back.)
        let unprotected = b
            .protection_problem
            .filter(|_| !s.protection_armed)
            .or(b.ovsdb_drift.then_some(Reason::OvsdbDrift));
        let phase = if datapath.is_some() || unprotected.is_some() {
            Phase::Degraded
        } else {
            Phase::Active
        };
        (phase, unprotected.or(b.warning).or(working).or(datapath))
    } else {
        match b.identity {
            IdentityCondition::Starting => (Phase::Starting, b.warning),
            IdentityCondition::Working(r) => (Phase::Pending, r.or(b.warning)),
            IdentityCondition::Blocked(r) => (Phase::Failed, Some(r)),
        }
    };
    s.phase = phase;
    s.reason = reason;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::TokioClock;
    use std::time::Duration;

    fn board() -> StatusBoard {
        let base = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        StatusBoard::new(Arc::new(TokioClock::starting_at(base)))
    }

    #[tokio::test(start_paused = true)]
    async fn expiry_flips_readyz_and_phase() {
        let b = board();
        assert_eq!(b.snapshot().phase, Phase::Starting);
        assert!(b.readyz().is_err());
        let expires = Timestamp::from_unix(1_800_000_000 + 3600).unwrap();
        b.set_active(1, Sha256Digest::of(b"c"), expires);
        assert_eq!(b.snapshot().phase, Phase::Active);
        assert_eq!(b.identity_ready(), Ok(()));
        runtime_ready(&b, 1);
        assert_eq!(b.readyz(), Ok(()));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.readyz(), Err(Reason::Expired));
        assert_eq!(b.snapshot().phase, Phase::Expired);
    }

    fn runtime_ready(b: &StatusBoard, generation: u64) {
        b.set_trust(Sha256Digest::of(b"trust"));
        b.set_runtime_health(RuntimeComponent::IkeDaemon, true);
        b.set_runtime_health(RuntimeComponent::Monitor, true);
        b.set_protection(true, None);
        b.set_acknowledgement(generation, Some(Sha256Digest::of(b"trust")));
    }

    #[tokio::test(start_paused = true)]
    async fn readyz_needs_runtime_guards_and_the_current_trust_acknowledged() {
        let b = board();
        let expires = Timestamp::from_unix(1_800_000_000 + 3600).unwrap();
        b.set_active(1, Sha256Digest::of(b"c"), expires);
        assert_eq!(b.readyz(), Err(Reason::IkeDaemonUnhealthy));
        b.set_runtime_health(RuntimeComponent::IkeDaemon, true);
        assert_eq!(b.readyz(), Err(Reason::MonitorUnhealthy));
        b.set_runtime_health(RuntimeComponent::Monitor, true);
        assert!(b.snapshot().runtime_healthy);
        assert_eq!(b.readyz(), Err(Reason::GuardMissing));
        b.set_protection(false, Some(Reason::GuardConflict));
        assert_eq!(b.readyz(), Err(Reason::GuardConflict));
        b.set_protection(true, None);
        assert!(b.snapshot().protection_armed);
        assert_eq!(b.readyz(), Err(Reason::MonitorNotAcknowledged));
        b.set_trust(Sha256Digest::of(b"trust-1"));
        // An acknowledgement of another trust digest does not count.
        b.set_acknowledgement(1, Some(Sha256Digest::of(b"trust-0")));
        assert!(b.snapshot().configuration_applied);
        assert_eq!(b.readyz(), Err(Reason::MonitorNotAcknowledged));
        b.set_acknowledgement(1, Some(Sha256Digest::of(b"trust-1")));
        assert_eq!(b.readyz(), Ok(()));
        assert_eq!(
            b.snapshot().trust_digest,
            Some(Sha256Digest::of(b"trust-1"))
        );
        // A read-back of a generation that is not the active one is ignored.
        b.set_acknowledgement(7, None);
        assert_eq!(b.readyz(), Ok(()));
        // A new generation needs its own acknowledgement.
        b.set_active(2, Sha256Digest::of(b"c2"), expires);
        assert!(!b.snapshot().configuration_applied);
        assert_eq!(b.readyz(), Err(Reason::MonitorNotAcknowledged));
        b.set_acknowledgement(2, Some(Sha256Digest::of(b"trust-1")));
        assert_eq!(b.readyz(), Ok(()));
        // The monitor going down makes it not ready, the guards untouched.
        b.set_runtime_health(RuntimeComponent::Monitor, false);
        assert!(!b.snapshot().runtime_healthy);
        assert_eq!(b.readyz(), Err(Reason::MonitorUnhealthy));
        // The Prepare hook: an issued identity is enough.
        b.set_coordination_prepare(Some((2, Sha256Digest::of(b"c2"), expires)));
        assert_eq!(b.readyz(), Ok(()));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.readyz(), Err(Reason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn prepare_is_ready_on_an_issued_identity_before_any_activation() {
        let b = board();
        let expires = Timestamp::from_unix(1_800_000_000 + 60).unwrap();
        assert!(b.readyz().is_err());
        b.set_coordination_prepare(Some((1, Sha256Digest::of(b"c1"), expires)));
        let s = b.snapshot();
        assert_eq!(b.readyz(), Ok(()));
        assert_eq!(s.phase, Phase::Prepare);
        assert_eq!(s.reason, Some(Reason::WaitingForCoordination));
        assert_eq!(s.generation, Some(1));
        // Out of Prepare (Arm): the activation, guards and runtime count.
        b.set_coordination_prepare(None);
        assert_eq!(b.readyz(), Err(Reason::ActivationFailed));
        b.set_coordination_prepare(Some((1, Sha256Digest::of(b"c1"), expires)));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(
            b.readyz().is_err(),
            "an expired issued identity is not ready"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn readyz_answers_only_from_a_read_back_at_most_a_second_old() {
        let b = board();
        let expires = Timestamp::from_unix(1_800_000_000 + 3600).unwrap();
        b.set_active(1, Sha256Digest::of(b"c"), expires);
        runtime_ready(&b, 1);
        assert_eq!(b.readyz(), Ok(()));
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(b.readyz(), Ok(()));
        // No read-back for more than a second: armed, but not on evidence
        // fresh enough to be ready on.
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(b.readyz(), Err(Reason::GuardReadbackStale));
        assert!(b.snapshot().protection_armed);
        b.set_protection(true, None);
        assert_eq!(b.readyz(), Ok(()));
        // Drifted OVSDB keys: not ready until written back.
        b.set_ovsdb_drift(true);
        assert_eq!(b.readyz(), Err(Reason::OvsdbDrift));
        b.set_ovsdb_drift(false);
        assert_eq!(b.readyz(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn status_and_readyz_name_the_same_cause_on_an_active_node() {
        let b = board();
        let expires = Timestamp::from_unix(1_800_000_000 + 3600).unwrap();
        b.set_active(1, Sha256Digest::of(b"c"), expires);
        runtime_ready(&b, 1);
        assert_eq!(b.snapshot().phase, Phase::Active);
        // OVSDB down (the lease could not be confirmed), a corrupt lease
        // file, drifted keys: /status says what /readyz refuses on.
        for cause in [Reason::OvsdbUnavailable, Reason::LeaseFileInvalid] {
            b.set_protection(false, Some(cause));
            assert_eq!(b.readyz(), Err(cause));
            let s = b.snapshot();
            assert_eq!((s.phase, s.reason), (Phase::Degraded, Some(cause)));
        }
        b.set_protection(true, None);
        b.set_ovsdb_drift(true);
        assert_eq!(b.readyz(), Err(Reason::OvsdbDrift));
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason),
            (Phase::Degraded, Some(Reason::OvsdbDrift))
        );
        b.set_ovsdb_drift(false);
        assert_eq!(b.readyz(), Ok(()));
        assert_eq!(
            (b.snapshot().phase, b.snapshot().reason),
            (Phase::Active, None)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn capability_missing_is_its_own_phase() {
        let b = board();
        b.set_capability_missing();
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason),
            (Phase::CapabilityMissing, Some(Reason::CapabilityMissing))
        );
        assert!(b.readyz().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn failing_child_degrades_and_blocked_wins() {
        let b = board();
        b.set_active(
            1,
            Sha256Digest::of(b"c"),
            Timestamp::from_unix(1_900_000_000).unwrap(),
        );
        b.set_child_failing("ike", Reason::IkeDaemonUnhealthy);
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason),
            (Phase::Degraded, Some(Reason::IkeDaemonUnhealthy))
        );
        b.clear_child_failing("ike");
        assert_eq!(b.snapshot().phase, Phase::Active);
        b.set_identity_condition(IdentityCondition::Blocked(Reason::KeyDirReadOnly));
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason),
            (Phase::Failed, Some(Reason::KeyDirReadOnly))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unhealthy_data_path_degrades_an_active_node_but_not_readyz() {
        use kube_ovn_ipsec_api::datapath::{DatapathReport, Encapsulation, MtuReport, PeerState};
        let b = board();
        let expires = Timestamp::from_unix(1_800_000_000 + 3600).unwrap();
        b.set_active(1, Sha256Digest::of(b"c"), expires);
        runtime_ready(&b, 1);
        let peer = kube_ovn_ipsec_api::test_util::peer_health;
        b.set_datapath(Some(DatapathReport {
            peers: vec![peer(PeerState::Healthy, true)],
            mtu: None,
        }));
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason, s.datapath_healthy),
            (Phase::Active, None, Some(true))
        );
        b.set_datapath(Some(DatapathReport {
            peers: vec![peer(PeerState::GuardDrop, false)],
            mtu: Some(MtuReport::check(
                1500,
                1400,
                Encapsulation::Geneve,
                false,
                false,
            )),
        }));
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason, s.datapath_healthy),
            (Phase::Degraded, Some(Reason::GuardDrop), Some(false))
        );
        assert_eq!(
            b.readyz(),
            Ok(()),
            "readiness is about this node's configuration"
        );
        // An identity warning is named first; the phase stays Degraded.
        b.set_warning(Some(Reason::RenewalFailing));
        let s = b.snapshot();
        assert_eq!(
            (s.phase, s.reason),
            (Phase::Degraded, Some(Reason::RenewalFailing))
        );
        b.set_warning(None);
        b.set_datapath(None);
        let s = b.snapshot();
        assert_eq!((s.phase, s.datapath_healthy), (Phase::Active, None));
        assert!(s.peers.is_empty());
    }
}
