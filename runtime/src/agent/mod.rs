//! `kube-ovn-ipsec run`: the agent's wiring. The actors (crate `actors`)
//! hold the logic; this module gives them their real adapters — kube-rs for
//! the CSR API and the trust ConfigMap, the `ovsdb` crate for the identity
//! keys, netlink XFRM, strongSwan and ovs-monitor-ipsec for the tunnel
//! actors — runs the capability gate first, serves `/status`, `/readyz`, `/healthz` and `/metrics`, and stops
//! the tree on SIGTERM.
//!
//! # Layout
//! - [`config`]: flags with environment fallbacks (downward API).
//! - [`kube_csr`]: [`actors::ports::CsrApi`] over `certificates.k8s.io/v1`.
//! - [`ovsdb_identity`]: [`actors::ports::OvsdbIdentity`] over the guarded
//!   `other_config` write.
//! - [`ports`]: the tunnel actors' ports — lease and XFRM guards, the IKE
//!   daemon, the monitor and its acknowledgement.
//! - [`trust`]: follows ConfigMap `ovn-ipsec-trust` into a watch channel.
//! - [`events`]: Kubernetes Events on the Node for what operators must
//!   hear about (a state file moved aside, a guard re-added, a peer whose
//!   data path broke, an MTU that does not fit ESP).
//! - [`http`]: the status server.
//! - [`unixctl`]: the OVS-style control socket (`ovs-appctl ipsec/show`,
//!   `ipsec/refresh`).
//! - [`run`]: start-up order and shutdown.

pub mod config;
pub mod coordination;
pub mod events;
pub mod http;
pub mod kube_csr;
pub mod ovsdb_identity;
pub mod ports;
pub mod run;
pub mod trust;
pub mod unixctl;

pub use config::RunArgs;
pub use run::{Adapters, Agent, AgentError, Seams};
