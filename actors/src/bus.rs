//! The events actors publish for each other, on [`OutputPort`]s that outlive
//! any one actor: the wiring creates the [`Bus`] once, each actor subscribes
//! itself in `pre_start`, so a respawned actor is connected again without
//! the publisher knowing its listeners.
//!
//! Who publishes what, and who listens:
//!
//! | port | publisher | events | listeners |
//! | --- | --- | --- | --- |
//! | `identity` | identity actor | `Ready` | OVSDB writer, node coordinator (the identity it signs with in `Prepare`) |
//! | | | `Active` | renewal timer, monitor, node coordinator (from the current one, [`IdentityPort::subscribe_with_current`]) |
//! | | | `StateMovedAside` | the `runtime` crate's Event forwarder |
//! | `activation` | OVSDB writer | `Activated`, `Failed`, `WriterStarted` | identity actor |
//! | `renewal` | renewal timer | `Due`, `TimerStarted` | identity actor |
//! | `protection` | protection actor | `GuardReadded`, `GuardConflict` | the Event forwarder |
//!
//! The status board is not on the bus: actors write what they see into it
//! and no actor reads it back (see `status`).

use std::sync::{Arc, Mutex, MutexGuard};

use kube_ovn_ipsec_api::datapath::{MtuReport, PeerHealth};
use kube_ovn_ipsec_api::pki::Certificate;
use ractor::{ActorRef, Message, OutputPort};

use crate::keydir::{CsrBinding, IdentityPaths};

/// Published by the datapath actor when the data path needs an operator.
/// Defined with the bus that carries it (the datapath actor re-exports it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatapathEvent {
    /// A peer started counting against `datapathHealthy`.
    PeerUnhealthy(Box<PeerHealth>),
    /// The tunnel MTU does not leave room for ESP (published when found,
    /// and again when the numbers change).
    MtuTooSmall(MtuReport),
}
/// A verified generation that should be written to OVSDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivationRequest {
    /// The generation.
    pub generation: u64,
    /// Its three files.
    pub paths: IdentityPaths,
    /// Its leaf certificate (public; boxed: a parsed certificate is large).
    pub certificate: Box<Certificate>,
    /// The CSR its certificate was issued for (`None` when the key
    /// directory does not know it).
    pub csr: Option<CsrBinding>,
}

/// The identity that OVSDB now points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveIdentity {
    /// The generation.
    pub generation: u64,
    /// Its leaf certificate (public).
    pub certificate: Certificate,
    /// The CSR that certificate was issued for (`None` when the key
    /// directory does not know it).
    pub csr: Option<CsrBinding>,
}

/// Published by the identity actor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityEvent {
    /// A generation is ready: please activate it.
    Ready(ActivationRequest),
    /// OVSDB confirmed this generation and the key directory records it
    /// (boxed: a parsed certificate is large, and every listener gets a
    /// clone of each event).
    Active(Box<ActiveIdentity>),
    /// The key directory's state file was unusable and moved aside; a fresh
    /// identity is being requested. The `runtime` crate turns this into a
    /// Kubernetes Event.
    StateMovedAside {
        /// Where the old file now is.
        moved_to: std::path::PathBuf,
        /// Why it was unusable.
        reason: String,
    },
}

/// Published by the OVSDB writer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ActivationEvent {
    /// The transaction that points OVSDB at `generation` is committed (or
    /// OVSDB already pointed there).
    Activated {
        /// The generation.
        generation: u64,
    },
    /// Activation failed; OVSDB still points at the previous generation.
    Failed {
        /// The generation.
        generation: u64,
        /// The error's metric label.
        reason: String,
    },
    /// The writer (re)started and holds no request: a request sent to its
    /// predecessor died with it.
    WriterStarted,
}

/// Published by the renewal timer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalEvent {
    /// The renewal point of `generation` has come.
    Due {
        /// The active generation at the time.
        generation: u64,
    },
    /// The timer (re)started and knows no identity: please republish.
    TimerStarted,
}

/// Published by the protection actor: what an operator must hear about
/// beyond the logs and a metric. The `runtime` crate turns these into
/// Kubernetes Events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtectionEvent {
    /// A guard had vanished from the kernel and was added again.
    GuardReadded(crate::ports::GuardChange),
    /// A foreign policy occupies a guard's place (published when the
    /// conflict starts, not on every read-back while it lasts).
    GuardConflict(crate::ports::GuardChange),
    /// Keys the agent publishes in OVSDB had been removed or changed by
    /// someone else and were written back.
    OvsdbDriftRestored {
        /// `lease` (external_ids) or `identity` (other_config paths).
        what: &'static str,
        /// The keys that had drifted.
        keys: Vec<String>,
    },
}

/// The identity actor's port: an [`OutputPort`] that also remembers the
/// last [`IdentityEvent::Active`], because a port forgets what it sent
/// before a listener subscribed and a respawned listener must still learn
/// which identity is active now.
#[derive(Debug, Default)]
pub struct IdentityPort {
    port: OutputPort<IdentityEvent>,
    /// The last `Active` sent; held while sending and while a listener
    /// subscribes, so a replay never overtakes or repeats a newer event.
    current: Mutex<Option<Box<ActiveIdentity>>>,
}

impl IdentityPort {
    fn current(&self) -> MutexGuard<'_, Option<Box<ActiveIdentity>>> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes `event` to every listener.
    pub fn send(&self, event: IdentityEvent) {
        let mut current = self.current();
        if let IdentityEvent::Active(a) = &event {
            *current = Some(a.clone());
        }
        self.port.send(event);
    }

    /// Subscribes `receiver` to the events sent from now on, each mapped
    /// through `converter` (`None` skips it).
    pub fn subscribe<R, F>(&self, receiver: ActorRef<R>, converter: F)
    where
        R: Message,
        F: Fn(IdentityEvent) -> Option<R> + Send + 'static,
    {
        self.port.subscribe(receiver, converter);
    }

    /// Like [`IdentityPort::subscribe`], but first delivers the identity
    /// active now (its last `Active`), if there is one: for a listener that
    /// must act on the current identity also after a respawn.
    pub fn subscribe_with_current<R, F>(&self, receiver: ActorRef<R>, converter: F)
    where
        R: Message,
        F: Fn(IdentityEvent) -> Option<R> + Send + Sync + 'static,
    {
        let converter = Arc::new(converter);
        let current = self.current();
        let forward = converter.clone();
        self.port.subscribe(receiver.clone(), move |e| forward(e));
        if let Some(msg) = current
            .clone()
            .and_then(|a| converter(IdentityEvent::Active(a)))
        {
            // Cast while still holding the lock: later events reach the
            // mailbox after this one. A stopped receiver has no use for it.
            let _ = receiver.cast(msg);
        }
    }
}

/// The output ports connecting the agent's actors.
#[derive(Debug, Clone, Default)]
pub struct Bus {
    /// Identity events.
    pub identity: Arc<IdentityPort>,
    /// Activation events.
    pub activation: Arc<OutputPort<ActivationEvent>>,
    /// Renewal events.
    pub renewal: Arc<OutputPort<RenewalEvent>>,
    /// Protection events.
    pub protection: Arc<OutputPort<ProtectionEvent>>,
    /// Data-path events (unhealthy peers, MTU).
    pub datapath: Arc<OutputPort<DatapathEvent>>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a panic is a test failure

    use std::sync::Mutex;
    use std::time::Duration;

    use ractor::{Actor, ActorProcessingErr, ActorRef};

    use super::*;

    /// Collects the generations it is sent.
    struct Generations(Arc<Mutex<Vec<u64>>>);

    impl Actor for Generations {
        type Msg = u64;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<u64>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
        async fn handle(
            &self,
            _: ActorRef<u64>,
            generation: u64,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            self.0.lock().unwrap().push(generation);
            Ok(())
        }
    }

    fn active(generation: u64, certificate: &Certificate) -> IdentityEvent {
        IdentityEvent::Active(Box::new(ActiveIdentity {
            generation,
            certificate: certificate.clone(),
            csr: None,
        }))
    }

    async fn listener(port: &IdentityPort, with_current: bool) -> Arc<Mutex<Vec<u64>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (actor, _) = Actor::spawn(None, Generations(seen.clone()), ())
            .await
            .unwrap();
        let generation = |e| match e {
            IdentityEvent::Active(a) => Some(a.generation),
            _ => None,
        };
        if with_current {
            port.subscribe_with_current(actor, generation);
        } else {
            port.subscribe(actor, generation);
        }
        seen
    }

    #[tokio::test]
    async fn a_late_listener_starts_from_the_current_identity_once() {
        let cert = rcgen::generate_simple_self_signed(vec!["node".into()]).unwrap();
        let cert = Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap();
        let port = IdentityPort::default();
        let early = listener(&port, true).await;
        port.send(active(1, &cert));
        port.send(active(2, &cert));
        let late = listener(&port, true).await;
        let plain = listener(&port, false).await;
        port.send(IdentityEvent::StateMovedAside {
            moved_to: "/tmp/state.json.bad".into(),
            reason: "test".into(),
        });
        port.send(active(3, &cert));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            *early.lock().unwrap(),
            vec![1, 2, 3],
            "no replay before any Active"
        );
        assert_eq!(
            *late.lock().unwrap(),
            vec![2, 3],
            "the current one first, then later ones"
        );
        assert_eq!(
            *plain.lock().unwrap(),
            vec![3],
            "a plain subscription does not replay"
        );
    }
}
