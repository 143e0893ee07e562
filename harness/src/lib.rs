//! A cluster with agents on the real components, in one place: what the
//! runtime's and the controller's integration tests, the chaos suite, the
//! benches and the lab build on.
//!
//! # Layout
//!
//! - [`controller_cluster`]: the control plane the tests share — the
//!   embedded API server with RBAC, the kube-ovn-cni DaemonSet, Nodes and
//!   CNI Pods with Pod-bound tokens; its [`controller_cluster::coordination`]
//!   holds the coordinator's other side (node identities, receipt
//!   responders, reads of the record and of OVN's switches).
//! - [`cluster`]: the one-node cluster with its test signer (or the real
//!   controller in-process) on which the agent runs as a process.
//! - [`agent_node`]: a simulated node running the agent as a process
//!   with the real strongSwan and the patched monitor, for the tests that
//!   need IKE between agents; the coordinated environment (OVN central,
//!   the real controller) and the cleanup init container.
//! - [`ike_node`]: a simulated node built from the agent's own pieces
//!   (lease, guards, IKE daemon and monitor runners, ovs-vswitchd) without
//!   the agent process.
//! - [`control_plane`] and [`node`]: the lab's control plane (the
//!   controller binary as a process) and its simulated node.
//! - [`ovn_controller`]: the ovn-controller side of a node's tunnels (today
//!   the named emulation of the patched ovn-controller).
//! - [`cohort`]: what the cohort benches share (responders answering the
//!   barriers at scale, the shared record watch, process measures).
//! - [`binaries`]: which agent binary the calling test crate runs.
//! - [`watch`]: every committed change of an OVSDB table, stamped as it
//!   arrives (transactions judged whole, phases timed from the commit).
//!
//! Everything here starts real processes and panics on a broken fixture:
//! a harness that cannot build its cluster has nothing to report but where
//! it stopped.

// Fixtures: a failed step is a failed test, with the step's message.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

pub mod agent_node;
pub mod binaries;
pub mod cluster;
pub mod cohort;
pub mod control_plane;
pub mod controller_cluster;
pub mod ike_node;
pub mod node;
pub mod ovn_controller;
pub mod watch;
