//! The one-machine lab driver: simulated nodes on the real components, with
//! the embedded Kubernetes API server (`apiserver` crate) as the cluster.
//! docs/lab.md describes what a run does and why.
//!
//! # Layout
//!
//! - [`up`]: `kube-ovn-ipsec-lab up` on the host — the lock, the kernel
//!   chosen (re-running itself in the Debian guest when this kernel lacks
//!   ESP, GENEVE or openvswitch), the live status file.
//! - [`lifecycle`]: the run itself, step by step, each checked and printed.
//! - [`summary`]: what a run came to (table, JSON, console status lines) —
//!   a pure codec.
//! - [`cluster`]: the control plane — the embedded API server with the
//!   Kube-OVN-shaped cluster, OVN NB/SB with ovn-northd, and the real
//!   controller binary as a process with its ServiceAccount's token.
//! - [`node`]: one simulated node — namespaces, its ovsdb-server,
//!   `br-int`, the named emulation of the patched ovn-controller's version,
//!   and the agent binary as a process (`run`, and `cleanup` as the init
//!   container).
//! - [`emulated_ovn_controller`]: the patched ovn-controller's tunnel
//!   management, played in each node's OVSDB.
//! - [`state`]: one lab at a time (a lock in [`state::RUN_DIR`]) and a
//!   `down` that removes what a lab made, also after it crashed.
//! - `main.rs`: the `kube-ovn-ipsec-lab` binary, a thin subcommand
//!   dispatcher (`up`, `status`, `down`, and `apiserver` to run the
//!   embedded API server on its own).

pub mod lifecycle;
pub mod state;
pub mod summary;
pub mod up;

pub use harness::control_plane as cluster;
pub use harness::node;
pub use harness::ovn_controller as emulated_ovn_controller;
