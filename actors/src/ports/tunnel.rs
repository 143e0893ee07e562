//! Ports of the tunnel actors (protection, IKE, monitor): the
//! output-protection lease and guards, and the two foreground processes
//! (IKE daemon, monitor). The `runtime` crate implements them with its
//! `lease`, `guards`, `ike` and `monitor` modules; the actors hold the
//! policy (when to arm, probe, restart, acknowledge).

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::status::Reason;

use super::OvsdbIdentityKeys;
use crate::error::Result;

/// The node's lease as the protection actor reports it (no secrets: the
/// mark and reqid are published in OVSDB anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSummary {
    /// The lease's random id.
    pub lease_id: String,
    /// The output mark.
    pub mark: u32,
    /// The reqid.
    pub reqid: u32,
    /// Allocated now (as opposed to loaded from the key directory).
    pub allocated: bool,
}

/// Something that happened to a guard during an evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardChange {
    /// Installed for the first time.
    Armed {
        /// `ipv4` / `ipv6`.
        family: String,
        /// Kernel index.
        index: u32,
    },
    /// Had vanished from the kernel and was added again.
    Readded {
        /// `ipv4` / `ipv6`.
        family: String,
        /// The index it had.
        old_index: u32,
        /// The index it has now.
        new_index: u32,
    },
    /// An identical guard under another index was adopted.
    Adopted {
        /// `ipv4` / `ipv6`.
        family: String,
        /// The index found.
        new_index: u32,
    },
    /// Another policy occupies the guard's place; nothing was changed.
    Conflict {
        /// `ipv4` / `ipv6`.
        family: String,
        /// The conflicting policy's index.
        index: u32,
        /// How it differs (field names, no keys).
        detail: String,
    },
}

impl GuardChange {
    /// A metric label for the change.
    pub fn kind(&self) -> &'static str {
        match self {
            GuardChange::Armed { .. } => "armed",
            GuardChange::Readded { .. } => "readded",
            GuardChange::Adopted { .. } => "adopted",
            GuardChange::Conflict { .. } => "conflict",
        }
    }
}

/// The result of one guard evaluation (arm or read back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardReadback {
    /// Every guard was read back from the kernel identical.
    pub armed: bool,
    /// What happened.
    pub changes: Vec<GuardChange>,
}

/// One SA observation pass (SPEC §3): counts only — the record itself,
/// with the boot ID, is in the key directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaSummary {
    /// Tunnels of this node found in OVSDB (interfaces with the lease's reqid).
    pub tunnels: usize,
    /// Kernel SAs attributed to the lease.
    pub sas: usize,
    /// Kernel policies attributed to the lease (guards included).
    pub policies: usize,
    /// The record in the key directory was (re)written by this pass (it is
    /// written when what is attributed changes, not on every pass).
    pub recorded: bool,
}

/// The lease and the XFRM guards (SPEC §4).
///
/// The `runtime` crate implements it with `LeaseStore::obtain`,
/// `GuardKeeper` over netlink XFRM, and the guarded `external_ids` write.
/// Nothing in it removes a guard: that is the cleanup path's, not the
/// agent's.
#[async_trait]
pub trait ProtectionPort: Send + Sync + Debug + 'static {
    /// This node's lease: the persisted one, or — when `allocate` — a
    /// fresh allocation (`None`: no lease of this node is persisted and
    /// `allocate` is false). Errors carry the status reason
    /// (`BypassPolicyPresent`, `LeaseAllocationFailed`, `NodeUidMismatch`)
    /// in [`crate::Error::Protection`].
    async fn obtain_lease(&self, allocate: bool) -> Result<Option<LeaseSummary>>;
    /// Arms the lease's guards if needed and reads each back by index,
    /// persisting the lease when its recorded indexes changed.
    async fn evaluate_guards(&self) -> Result<GuardReadback>;
    /// Publishes the lease in `Open_vSwitch . external_ids` (one guarded
    /// transaction, other keys untouched) when OVSDB does not hold it
    /// already; returns the keys that were missing or different (empty:
    /// nothing written). Called on every read-back, so drift is restored.
    async fn publish_lease(&self) -> Result<Vec<String>>;
    /// Attributes the kernel's SAs and policies to the lease (reqid + mark +
    /// the exact selector of a tunnel this node has in OVSDB) and records
    /// the observation, with the boot ID, in the key directory. Reads no SA
    /// key material.
    async fn observe_sas(&self) -> Result<SaSummary>;
}

/// A foreground process an actor owns (IKE daemon or monitor).
#[async_trait]
pub trait RunningProcess: Send + Debug {
    /// Its PID (also its process group).
    fn pid(&self) -> u32;
    /// `Some(exit status text)` once it has exited (non-blocking).
    fn try_exited(&mut self) -> Option<String>;
    /// The health probe; an error says why it failed.
    async fn probe(&mut self) -> Result<()>;
    /// SIGTERM to its process group, SIGKILL after the grace period.
    async fn stop(&mut self) -> Result<()>;
    /// A probe wanted sooner than the normal period (the IKE daemon while
    /// an outbound connection waits to be initiated); `None` by default.
    fn probe_again_within(&self) -> Option<Duration> {
        None
    }
}

/// The IKE daemon: starts it, and installs the trust bundle it checks
/// peers' certificates against.
#[async_trait]
pub trait IkePort: Send + Sync + Debug + 'static {
    /// Starts a fresh daemon in the foreground.
    async fn start(&self) -> Result<Box<dyn RunningProcess>>;
    /// Installs the trust bundle OVSDB names (`keys.ca_cert`, read with
    /// the certificate `keys.certificate` it belongs to) into the daemon's
    /// CA directory, one file per CA, and has the daemon reread its CA
    /// certificates — unless `installed`, the bundle digest the caller
    /// installed last, is that bundle's already. Says what is installed
    /// now; `None` when OVSDB names no certificate or CA (nothing to
    /// install; the acknowledgement reports it).
    async fn install_trust(
        &self,
        keys: &OvsdbIdentityKeys,
        installed: Option<Sha256Digest>,
    ) -> Result<Option<TrustInstalled>>;
    /// Takes down, without waiting for the peers, every IKE_SA of the
    /// monitor's connections (with their CHILD_SAs; the connections and
    /// their traps stay loaded, nothing else of the daemon is touched).
    /// Returns what it ended (`<connection>[<unique id>]`). Used when the
    /// certificate those IKE_SAs were authenticated with has expired.
    async fn end_ike_sas(&self) -> Result<Vec<String>>;
}

/// The trust bundle the IKE daemon now checks peers against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustInstalled {
    /// Its digest.
    pub digest: Sha256Digest,
    /// CAs this installation took out of the daemon's CA directory: a CA
    /// retired from the bundle. IKE_SAs authenticated under it are then
    /// rebuilt ([`RunningMonitor::rebuild`]).
    pub retired: usize,
}

/// The monitor's and the IKE daemon's view of the active identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    /// Certificate, CA paths and digests matched, the daemon loaded them.
    pub configuration_applied: bool,
    /// The trust digest acknowledged (only when applied).
    pub trust_digest: Option<Sha256Digest>,
    /// Why not, when not (paths and digests; no PEM).
    pub mismatches: Vec<String>,
}

/// A running `ovs-monitor-ipsec`.
#[async_trait]
pub trait RunningMonitor: RunningProcess {
    /// Reads the monitor back (`tunnels/show`) and the IKE daemon's loaded
    /// certificates and compares them with the identity OVSDB points at
    /// (`keys`). Only reads: the caller has the trust bundle installed
    /// first ([`IkePort::install_trust`]).
    async fn acknowledge(&mut self, keys: &OvsdbIdentityKeys) -> Result<Acknowledgement>;
    /// Replaces, make-before-break, the connections the monitor kept
    /// across renewals (their IKE_SAs were authenticated with an earlier
    /// certificate, perhaps under a CA now retired): the tunnels rebuilt.
    async fn rebuild(&mut self) -> Result<Vec<String>>;
}

/// Starts the monitor.
#[async_trait]
pub trait MonitorPort: Send + Sync + Debug + 'static {
    /// Starts a fresh `ovs-monitor-ipsec --no-restart-ike-daemon`.
    async fn start(&self) -> Result<Box<dyn RunningMonitor>>;
}

/// The status reason a failed protection step maps to, for ports that
/// only have a text.
pub fn protection_reason(label: &str) -> Reason {
    match label {
        "bypass_present" => Reason::BypassPolicyPresent,
        "lease_exhausted" => Reason::LeaseAllocationFailed,
        "ovsdb" => Reason::OvsdbUnavailable,
        _ => Reason::GuardMissing,
    }
}
