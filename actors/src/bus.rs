//! The events actors publish for each other, on [`OutputPort`]s that outlive
//! any one actor: the wiring creates the [`Bus`] once, each actor subscribes
//! itself in `pre_start`, so a respawned actor is connected again without
//! the publisher knowing its listeners.

use std::sync::Arc;

use kube_ovn_ipsec_api::pki::Certificate;
use ractor::OutputPort;

use crate::keydir::IdentityPaths;

/// A verified generation that should be written to OVSDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivationRequest {
    /// The generation.
    pub generation: u64,
    /// Its three files.
    pub paths: IdentityPaths,
}

/// The identity that OVSDB now points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveIdentity {
    /// The generation.
    pub generation: u64,
    /// Its leaf certificate (public).
    pub certificate: Certificate,
}

/// Published by the identity actor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityEvent {
    /// A generation is ready: please activate it.
    Ready(ActivationRequest),
    /// OVSDB confirmed this generation and the key directory records it.
    Active(ActiveIdentity),
    /// The key directory's state file was unusable and moved aside; a fresh
    /// identity is being requested. The runtime turns this into a
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
/// beyond the logs and a metric. The runtime turns these into Kubernetes
/// Events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtectionEvent {
    /// A guard had vanished from the kernel and was added again.
    GuardReadded(crate::ports::GuardChange),
    /// A foreign policy occupies a guard's place (published when the
    /// conflict starts, not on every read-back while it lasts).
    GuardConflict(crate::ports::GuardChange),
}

/// The output ports connecting the agent's actors.
#[derive(Debug, Clone, Default)]
pub struct Bus {
    /// Identity events.
    pub identity: Arc<OutputPort<IdentityEvent>>,
    /// Activation events.
    pub activation: Arc<OutputPort<ActivationEvent>>,
    /// Renewal events.
    pub renewal: Arc<OutputPort<RenewalEvent>>,
    /// Protection events.
    pub protection: Arc<OutputPort<ProtectionEvent>>,
}
