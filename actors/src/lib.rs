//! The kube-ovn-ipsec agent's actor core: a node supervisor that respawns
//! its children with backoff; the identity actors — the identity actor
//! (key, CSR, key directory), the renewal-jitter timer, the OVSDB writer;
//! the tunnel actors — output protection, IKE daemon, monitor; and the
//! status board. The `runtime` crate (`kube-ovn-ipsec run`) implements the
//! [`ports`] traits with kube-rs, the `ovsdb` crate, netlink XFRM and the
//! real processes, and wires the tree together.
//!
//! # Layout
//!
//! Pure pieces:
//! - [`clock`] — the injected wall clock ([`clock::TokioClock`] follows
//!   tokio's pausable time in tests).
//! - [`keydir_format`] — the key directory's layout, file names and state
//!   file records (what [`ports::KeyStore`] speaks in).
//! - [`keydir`] — the key directory: generations, state file, atomic
//!   writes, owner lock, garbage collection.
//! - [`pki`] — key generation, the CSR, verification of an issued leaf.
//! - [`status`] — the board holding the `/status` document and `readyz`:
//!   actors write to it, none reads it to decide.
//! - [`metrics`] — the metrics trait and its Prometheus implementation.
//! - [`ports`] — the side-effect traits the `runtime` crate implements.
//! - [`bus`] — the events actors publish on shared output ports (the table
//!   of who publishes what and who listens is there).
//! - [`process_watch`] — the probe and restart policy of a foreground
//!   process, shared by the IKE and monitor actors.
//!
//! Actors, one per file:
//! - [`supervisor`] — [`supervisor::NodeSupervisor`] and its child specs.
//! - [`identity`] — [`identity::IdentityActor`].
//! - [`renewal_timer`] — [`renewal_timer::RenewalTimer`].
//! - [`ovsdb_writer`] — [`ovsdb_writer::OvsdbWriter`].
//! - [`protection`] — [`protection::ProtectionActor`]: lease, XFRM guards
//!   and their periodic read-back, publication.
//! - [`ike`] — [`ike::IkeActor`]: the IKE daemon as a foreground child.
//! - [`monitor`] — [`monitor::MonitorActor`]: ovs-monitor-ipsec as a
//!   foreground child, and the acknowledgement of each activation (it
//!   listens to the identity's `Active` event).
//! - [`datapath`] — [`datapath::DatapathActor`]: per-peer data-path health
//!   from SA counters and the kernel's XFRM error counters (the rules are
//!   the pure [`datapath::classify`]), and the MTU check.
//! - [`coordinator`] — [`coordinator::NodeCoordinator`]: follows the
//!   cluster's coordination record (what to do for it is the pure
//!   [`coordinator::plan`]), grants the arm permit ([`gate::ArmPermit`])
//!   and publishes the node's signed receipts.
//!
//! Wiring: [`tree`] builds the child specs of these actors
//! ([`tree::identity_child_specs`], [`tree::tunnel_child_specs`]) and
//! starts the supervisor; the `runtime` crate calls [`tree::start`] with
//! its adapters.
//!
//! Test support: `testing` (feature `test-util`, and this crate's tests):
//! a fake CSR API with a test CA and a fake OVSDB; `testing::tunnel`, fakes
//! of the tunnel actors' ports.

pub mod bus;
pub mod clock;
pub mod coordinator;
pub mod datapath;
mod error;
pub mod gate;
pub mod identity;
pub mod ike;
pub mod keydir;
pub mod keydir_format;
pub mod metrics;
pub mod monitor;
pub mod ovsdb_writer;
pub mod pki;
pub mod ports;
pub mod process_watch;
pub mod protection;
pub mod renewal_timer;
pub mod status;
pub mod supervisor;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod tree;

pub use error::{Error, Result};
