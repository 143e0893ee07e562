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
//! - [`client`]: the tokio transport. A background task owns the socket;
//!   [`Client`] is a cloneable handle, [`MonitorStream`] a stream of
//!   [`MonitorEvent`]s that reports disconnects and resyncs.
//! - [`helpers`]: guarded, key-preserving updates of a map column
//!   (`Open_vSwitch` `other_config` / `external_ids`), `NB_Global.ipsec`,
//!   and waiting for `SB_Global.ipsec` through a monitor.
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
pub mod datum;
mod error;
pub mod framing;
pub mod helpers;
pub mod jsonrpc;
pub mod protocol;

pub use client::{Address, Backoff, Client, Config, MonitorEvent, MonitorStream};
pub use datum::{Atom, Datum};
pub use error::Error;
pub use helpers::{
    MapChanges, MapColumn, MapSnapshot, OPEN_VSWITCH, OVN_NORTHBOUND, OVN_SOUTHBOUND,
};
pub use protocol::{
    Condition, MonitorRequest, Mutation, Operation, OperationResult, Row, RowUpdate, RowUpdate2,
    TableUpdates,
};
