//! The one-machine lab driver: simulated nodes on the real components, with
//! the embedded Kubernetes API server (`apiserver` crate) as the cluster.
//!
//! # Layout
//!
//! - [`demo`]: the quick-start demo on the real OVS/OVN databases and
//!   ovn-northd: an identity generation activated and the NB/SB ipsec switch
//!   flipped (until the full lifecycle lands).
//! - [`cluster`]: the control plane — the embedded API server with the
//!   Kube-OVN-shaped cluster, OVN NB/SB with ovn-northd, and the real
//!   controller binary as a process with its ServiceAccount's token.
//! - [`node`]: one simulated node — namespaces, its ovsdb-server,
//!   `br-int`, the named emulation of the patched ovn-controller's version,
//!   and the agent binary as a process.
//! - [`state`]: one lab at a time (a lock in [`state::RUN_DIR`]) and a
//!   `down` that removes what a lab made, also after it crashed.
//! - `main.rs`: the `kube-ovn-ipsec-lab` binary, a thin subcommand dispatcher
//!   (`demo`, and `apiserver` to run the embedded API server on its own).

pub mod cluster;
pub mod demo;
pub mod emulated_ovn_controller;
pub mod lifecycle;
pub mod node;
pub mod state;
pub mod summary;
pub mod up;
