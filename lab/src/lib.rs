//! The one-machine lab driver: the lifecycle and its report, on the
//! harness's simulated nodes and the real components, with the embedded
//! Kubernetes API server (`apiserver` crate) as the cluster.
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
//! - The parts it runs the lifecycle on come from the `harness` crate,
//!   shared with the tests: `harness::control_plane` (the embedded API
//!   server with the Kube-OVN-shaped cluster, OVN NB/SB with ovn-northd,
//!   the real controller binary as a process with its ServiceAccount's
//!   token), `harness::node` (one simulated node: namespaces, its
//!   ovsdb-server, `br-int`, the agent binary as a process — `run`, and
//!   `cleanup` as the init container) and `harness::ovn_controller` (who
//!   builds the nodes' tunnels from SB: a patched ovn-controller, or the
//!   named emulation of it).
//! - [`state`]: one lab at a time (a lock in [`state::RUN_DIR`]) and a
//!   `down` that removes what a lab made, also after it crashed.
//! - `main.rs`: the `kube-ovn-ipsec-lab` binary, a thin subcommand
//!   dispatcher (`up`, `status`, `down`, and `apiserver` to run the
//!   embedded API server on its own).

pub mod lifecycle;
pub mod state;
pub mod summary;
pub mod up;
