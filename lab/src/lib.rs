//! The one-machine lab: an embedded Kubernetes API server and (later) the lab
//! driver that puts simulated nodes on the real components.
//!
//! # Layout
//!
//! - [`apiserver`]: an in-memory Kubernetes API over HTTPS, good enough for
//!   kube-rs (including watches and reflectors) and kubectl.
//!   - `resources`: the table of served kinds;
//!   - `store`: objects, the global resourceVersion, event history, broadcast;
//!   - `watch`: per-watch filtering, bookmarks, timeouts;
//!   - `objects`: create/update/delete semantics (metadata, status, finalizers, CSR rules);
//!   - `patch`: merge, JSON and strategic merge patches;
//!   - `selectors`: label and field selectors;
//!   - `auth`, `rbac`: bearer tokens to identities, RBAC from stored objects;
//!   - `discovery`: `/version`, `/api`, `/apis` documents;
//!   - `handlers`: HTTP routing and operations; `tls`: CA and serving cert.
//! - [`demo`]: the quick-start demo on the real OVS/OVN databases and
//!   ovn-northd (until the full lab lands).
//! - `main.rs`: the `kube-ovn-ipsec-lab` binary, a thin subcommand dispatcher.

pub mod apiserver;
pub mod demo;
