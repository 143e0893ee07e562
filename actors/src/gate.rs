//! The protection gate (SPEC §4 "Order"): identity activation, the IKE
//! daemon and the monitor never start while the guards are not armed, read
//! back and the lease published. The protection actor opens and closes it
//! after every evaluation; the OVSDB writer defers an activation until it is
//! open, and the IKE and monitor actors refuse to start (the supervisor
//! retries them on its 1–30 s backoff, the reason on the board is the
//! protection's).
//!
//! The gate outlives every actor incarnation: a restarting protection actor
//! closes it on failure and the others see that on their next start. A
//! process that already runs is not stopped when the gate closes later —
//! its IPsec policies encrypt as before, and a guard that vanished is the
//! protection actor's to re-add.
//!
//! A tree without the tunnel actors (identity-only tests and tools) has no
//! guards to wait for: the gate starts `NotRequired` and only
//! [`ProtectionGate::require`] (called when the tunnel actors are added)
//! closes it.

use std::sync::Arc;

use kube_ovn_ipsec_api::status::Reason;
use tokio::sync::watch;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NotRequired,
    Closed,
    Armed,
}

/// A shared, cloneable view of whether the guards are armed.
#[derive(Debug, Clone)]
pub struct ProtectionGate {
    tx: Arc<watch::Sender<State>>,
}

impl Default for ProtectionGate {
    fn default() -> Self {
        ProtectionGate {
            tx: Arc::new(watch::Sender::new(State::NotRequired)),
        }
    }
}

impl ProtectionGate {
    /// Output protection is part of this tree: closed until the protection
    /// actor reports the guards armed.
    pub fn require(&self) {
        self.tx.send_if_modified(|s| {
            let was = *s;
            if was == State::NotRequired {
                *s = State::Closed;
            }
            was == State::NotRequired
        });
    }

    /// The protection actor's verdict after an evaluation: guards armed,
    /// read back and the lease published (`true`), or not.
    pub fn set_armed(&self, armed: bool) {
        let next = if armed { State::Armed } else { State::Closed };
        self.tx.send_if_modified(|s| {
            let changed = *s != next;
            *s = next;
            changed
        });
    }

    /// Whether what it guards may start now.
    pub fn is_open(&self) -> bool {
        matches!(*self.tx.borrow(), State::NotRequired | State::Armed)
    }

    /// `Ok` when open; otherwise the refusal `what` reports.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.is_open() {
            Ok(())
        } else {
            Err(Error::Protection {
                reason: Reason::GuardMissing,
                detail: format!(
                    "{what} waits: the output-protection guards are not armed and read back yet"
                ),
            })
        }
    }

    /// Resolves once the gate is open (at once when it is).
    pub async fn opened(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`, so the channel cannot close while
        // this waits.
        let _ = rx
            .wait_for(|s| matches!(s, State::NotRequired | State::Armed))
            .await;
    }
}

/// Whether this node may arm its output protection (SPEC §7): the
/// cluster's coordination says `Arm` (or `Enabled`) for it, or the agent
/// runs without coordination. Withheld, the protection actor allocates no
/// lease and arms nothing — unless the node already holds a lease, which it
/// keeps protecting whatever the coordination says.
///
/// Once granted it stays granted for the life of the process: guards cost
/// nothing while tunnels carry no mark (SPEC §4 "Marks follow IPsec
/// intent"), and only cleanup ever removes them.
#[derive(Debug, Clone)]
pub struct ArmPermit {
    tx: Arc<watch::Sender<bool>>,
}

impl ArmPermit {
    /// Granted from the start: the agent runs without coordination.
    pub fn granted() -> Self {
        ArmPermit {
            tx: Arc::new(watch::Sender::new(true)),
        }
    }

    /// Withheld until the node coordinator grants it.
    pub fn withheld() -> Self {
        ArmPermit {
            tx: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Grants arming (idempotent).
    pub fn grant(&self) {
        self.tx.send_if_modified(|g| !std::mem::replace(g, true));
    }

    /// Whether arming is granted.
    pub fn is_granted(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once arming is granted (at once when it is).
    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in `self`: the channel cannot close meanwhile.
        let _ = rx.wait_for(|g| *g).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn not_required_until_required_then_follows_the_guards() {
        let g = ProtectionGate::default();
        assert!(g.is_open() && g.check("x").is_ok());
        g.require();
        assert!(!g.is_open());
        let e = g.check("the IKE daemon").unwrap_err();
        assert!(e.to_string().contains("the IKE daemon waits"), "{e}");
        assert_eq!(e.status_reason(), Reason::GuardMissing);
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.opened().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        g.set_armed(true);
        waiter.await.unwrap();
        assert!(g.is_open());
        // Requiring again does not close an armed gate; a failed read-back
        // does.
        g.require();
        assert!(g.is_open());
        g.set_armed(false);
        assert!(!g.is_open());
    }

    #[tokio::test]
    async fn a_withheld_permit_is_granted_once_and_stays() {
        let p = ArmPermit::withheld();
        assert!(!p.is_granted());
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.wait().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        p.grant();
        waiter.await.unwrap();
        p.grant();
        assert!(p.is_granted() && ArmPermit::granted().is_granted());
    }
}
