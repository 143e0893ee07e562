//! The status board: the SPEC §5 document, fed by the actors, read by the
//! runtime's `/status` and `/readyz` handlers.
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

use crate::clock::WallClock;

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
}

/// The shared status board. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    inner: Arc<Mutex<Board>>,
    tx: Arc<watch::Sender<Status>>,
    clock: Arc<dyn WallClock>,
}

impl StatusBoard {
    /// A board in phase `Starting`, judging expiry with `clock`.
    pub fn new(clock: Arc<dyn WallClock>) -> Self {
        let (tx, _) = watch::channel(Status::starting());
        StatusBoard {
            inner: Arc::new(Mutex::new(Board {
                status: Status::starting(),
                identity: IdentityCondition::Starting,
                warning: None,
                activated: None,
                trust: None,
                failing: BTreeMap::new(),
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

    /// The current document (phase re-derived against the clock).
    pub fn snapshot(&self) -> Status {
        self.update(|_| {});
        self.lock().status.clone()
    }

    /// Follows the document as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.tx.subscribe()
    }

    /// The readiness rule for now (issue 4): an unexpired active identity
    /// whose OVSDB activation was confirmed. Later issues add processes,
    /// guards and the monitor's acknowledgement (`Status::is_ready`).
    pub fn readyz(&self) -> Result<(), Reason> {
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
    let (phase, reason) = if let IdentityCondition::Blocked(r) = b.identity {
        (Phase::Failed, Some(r))
    } else if expired {
        (Phase::Expired, Some(Reason::Expired))
    } else if let Some(r) = b.failing.values().next() {
        (Phase::Degraded, Some(*r))
    } else if active {
        let working = match b.identity {
            IdentityCondition::Working(r) => r,
            _ => None,
        };
        (Phase::Active, b.warning.or(working))
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
        assert_eq!(b.readyz(), Ok(()));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(b.readyz(), Err(Reason::Expired));
        assert_eq!(b.snapshot().phase, Phase::Expired);
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
}
