//! The kube-ovn-ipsec agent's actor core: a node supervisor that respawns
//! its children with backoff, the identity actor (key, CSR, key directory),
//! the renewal-jitter timer, the OVSDB writer and the status board
//! (issue 4), and the runtime actors — output protection, IKE daemon,
//! monitor (issue 5). The runtime (`kube-ovn-ipsec run`) implements the [`ports`] traits
//! with kube-rs and the `ovsdb` crate and wires the tree together.
//!
//! # Layout
//!
//! Pure pieces:
//! - [`backoff`] — the 1 s … 30 s restart/retry schedule, reset after 60 s.
//! - [`clock`] — the injected wall clock ([`clock::TokioClock`] follows
//!   tokio's pausable time in tests).
//! - [`keydir`] — the key directory: generations, state file, atomic
//!   writes, owner lock, garbage collection.
//! - [`pki`] — key generation, the CSR, verification of an issued leaf.
//! - [`status`] — the board holding the `/status` document and `readyz`.
//! - [`metrics`] — the metrics trait and its Prometheus implementation.
//! - [`ports`] — the side-effect traits the runtime implements.
//! - [`bus`] — the events actors publish on shared output ports.
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
//!   foreground child, and the acknowledgement of each activation.
//!
//! The IKE and monitor actors share their probe policy (`process_watch`).
//!
//! Wiring: [`tree`] builds the child specs of these actors and starts the
//! supervisor; the runtime calls [`tree::start`] with its adapters.
//!
//! Test support: `testing` (feature `test-util`, and this crate's tests):
//! a fake CSR API with a test CA and a fake OVSDB.

pub mod backoff;
pub mod bus;
pub mod clock;
mod error;
pub mod identity;
pub mod ike;
pub mod keydir;
pub mod metrics;
pub mod monitor;
pub mod ovsdb_writer;
pub mod pki;
pub mod ports;
mod process_watch;
pub mod protection;
pub mod renewal_timer;
pub mod status;
pub mod supervisor;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod tree;

pub use error::{Error, Result};
