//! An RFC 7047 OVSDB client for the agent and the controller.
//!
//! Talks to `ovsdb-server` over a unix socket or TCP: `transact` with every
//! RFC 7047 operation, `monitor` and `monitor_cond` streams, the server's
//! `echo` answered, and reconnection with exponential backoff (1 s, 2 s, 4 s
//! … capped) that re-establishes every monitor. On top sit the three helpers
//! this project needs (see [`helpers`]).
//!
//! # Layout
//! - [`framing`], [`jsonrpc`], [`datum`], [`protocol`]: the pure codec. Bytes
//!   to JSON values (partial reads, size cap), JSON-RPC messages, OVSDB atoms,
//!   sets and maps, operations, results and table updates. No I/O; unit-tested
//!   on round trips and bytes captured from `ovsdb-server`.
//! - [`connection`]: the connection task. It owns the socket, answers the
//!   server's `echo`, probes a silent server, routes responses and monitor
//!   updates, and reconnects (the one backoff schedule of
//!   `kube_ovn_ipsec_api::backoff`), re-establishing monitors. Also
//!   what it is configured with ([`Address`], [`Config`]) and what it emits
//!   on a monitor ([`MonitorEvent`]).
//! - [`client`]: the handle. [`Client`] is the request/response API (a
//!   cheap, cloneable channel to the task); [`MonitorStream`] a stream of
//!   [`MonitorEvent`]s that reports disconnects and resyncs. It knows nothing
//!   of what the helpers build on it.
//! - [`helpers`]: what this project does with OVSDB. [`helpers::map`]: map
//!   columns (`Open_vSwitch` `other_config` / `external_ids`), one guarded
//!   transaction on [`Client`], and [`MapWriter`], which keeps each column's
//!   last known value and holds the crate's one retry loop for guarded
//!   writes. [`helpers::ovn`]: `NB_Global.ipsec`, and waiting for
//!   `SB_Global.ipsec` through a monitor.
//! - [`Error`]: the one error type, with [`Error::metric_label`].
//!
//! # Connection semantics
//! - [`Client::connect`] fails fast if the first connection fails; after
//!   that the client owns reconnection (1 s, 2 s, 4 s … capped at 30 s, reset
//!   on success).
//! - A request outstanding when the connection breaks fails with the cause
//!   ([`Error::ConnectionLost`], or [`Error::Malformed`]/[`Error::Oversized`]
//!   for a bad stream); a `transact` that fails this way may have committed.
//!   Requests made while reconnecting fail at once with
//!   [`Error::NotConnected`]; nothing is queued behind the caller's back.
//! - Monitors report [`MonitorEvent::Disconnected`], are re-sent on the new
//!   connection, and deliver a fresh [`MonitorEvent::Initial`].
//! - The server's `echo` is answered; the client probes a silent server
//!   itself ([`Config::inactivity_probe`]).
//!
//! Integration tests against real `ovsdb-server` and `ovn-northd` processes
//! live in `tests/`.

pub mod client;
pub mod connection;
pub mod datum;
mod error;
pub mod framing;
pub mod helpers;
pub mod jsonrpc;
pub mod protocol;
pub mod tls;

pub use client::{Client, MonitorStream};
pub use connection::{Address, Config, MonitorEvent};
pub use datum::{Atom, Datum};
pub use error::Error;
pub use helpers::{
    MapChanges, MapColumn, MapSnapshot, MapWriter, OPEN_VSWITCH, OVN_NORTHBOUND, OVN_SOUTHBOUND,
};
pub use protocol::{
    Condition, MonitorRequest, Mutation, Operation, OperationResult, Row, RowUpdate, RowUpdate2,
    TableUpdates,
};
pub use tls::TlsFiles;
