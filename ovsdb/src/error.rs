//! The crate's one error type.

use std::sync::Arc;

/// Everything that can go wrong talking to an OVSDB server.
///
/// `Clone` because one connection failure is reported to every waiting
/// request and every monitor stream.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting (or reconnecting) to the server failed.
    #[error("cannot connect to OVSDB at {address}: {source}")]
    Connect {
        /// The address tried, as given (`unix:/path`, `tcp:host:port`).
        address: String,
        /// The socket error.
        source: Arc<std::io::Error>,
    },
    /// The connection broke while a request was outstanding. A `transact`
    /// that fails this way may or may not have been committed: re-read before
    /// retrying anything that is not idempotent.
    #[error("OVSDB connection to {address} lost: {reason}")]
    ConnectionLost {
        /// The server's address, as given.
        address: String,
        /// What broke it (EOF, socket error, protocol error).
        reason: String,
    },
    /// The client is between connections (reconnecting with backoff); the
    /// request was not sent.
    #[error("not connected to OVSDB at {address} (reconnecting)")]
    NotConnected {
        /// The server's address, as given.
        address: String,
    },
    /// A message from the server exceeded the configured size cap; the
    /// connection is dropped.
    #[error("OVSDB message exceeds the {limit}-byte cap")]
    Oversized {
        /// The cap in bytes.
        limit: usize,
    },
    /// The byte stream is not JSON-RPC (garbage, invalid JSON, wrong shape);
    /// the connection is dropped.
    #[error("malformed OVSDB message: {reason}")]
    Malformed {
        /// Why it was rejected.
        reason: String,
    },
    /// Well-formed JSON-RPC whose content does not match the OVSDB method
    /// (wrong result shape, bad UUID, unexpected column type).
    #[error("unexpected OVSDB reply: {reason}")]
    UnexpectedReply {
        /// What did not match.
        reason: String,
    },
    /// The server answered the request with a JSON-RPC level error (e.g.
    /// unknown database or method).
    #[error("OVSDB {method} failed: {error}")]
    Rpc {
        /// The request's method.
        method: String,
        /// The server's `error` value, rendered.
        error: String,
    },
    /// An operation of a transaction failed; nothing was committed.
    #[error("OVSDB transaction failed at operation {index} ({op}): {error}{}", details.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Transaction {
        /// Index of the failed operation (`== ops.len()` for a commit error).
        index: usize,
        /// The operation's name (`commit` for a commit error).
        op: String,
        /// The RFC 7047 error tag, e.g. `constraint violation`.
        error: String,
        /// The server's `details`, when present.
        details: Option<String>,
    },
    /// A `wait` guard failed: another writer changed the guarded columns
    /// since they were read. Nothing was committed; re-read and retry.
    #[error("OVSDB guard failed: {table} {columns:?} changed concurrently")]
    GuardFailed {
        /// The guarded table.
        table: String,
        /// The guarded columns.
        columns: Vec<String>,
    },
    /// A guarded update kept losing to concurrent writers.
    #[error("OVSDB guarded update gave up after {attempts} attempts")]
    RetriesExhausted {
        /// How many guarded writes were tried.
        attempts: u32,
    },
    /// The row a helper works on does not exist (e.g. no `NB_Global` row
    /// before `ovn-nbctl init`), or more than one matched.
    #[error("expected exactly one row in {table}, found {found}")]
    RowCount {
        /// The table.
        table: String,
        /// How many rows matched.
        found: usize,
    },
    /// A helper's deadline passed.
    #[error("timed out after {millis} ms waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline in milliseconds.
        millis: u128,
    },
    /// The client was closed (every handle dropped or `close()` called).
    #[error("OVSDB client closed")]
    Closed,
    /// An `ssl:` remote cannot be used as configured: a key, certificate
    /// or CA file missing or unreadable, or no files given at all. Not
    /// retried: the files must be fixed first.
    #[error("OVSDB over SSL to {address}: {reason}")]
    Tls {
        /// The remote, as given.
        address: String,
        /// What is wrong, naming the file.
        reason: String,
    },
}

impl Error {
    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Connect { .. } => "connect",
            Error::ConnectionLost { .. } => "connection_lost",
            Error::NotConnected { .. } => "not_connected",
            Error::Oversized { .. } => "oversized",
            Error::Malformed { .. } => "malformed",
            Error::UnexpectedReply { .. } => "unexpected_reply",
            Error::Rpc { .. } => "rpc",
            Error::Transaction { .. } => "transaction",
            Error::GuardFailed { .. } => "guard_failed",
            Error::RetriesExhausted { .. } => "retries_exhausted",
            Error::RowCount { .. } => "row_count",
            Error::Timeout { .. } => "timeout",
            Error::Closed => "closed",
            Error::Tls { .. } => "tls",
        }
    }

    /// True when the failure is about the connection, not the request: the
    /// request may succeed once the client has reconnected.
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. }
                | Error::ConnectionLost { .. }
                | Error::NotConnected { .. }
                | Error::Oversized { .. }
                | Error::Malformed { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_messages_carry_details() {
        let e = Error::Transaction {
            index: 1,
            op: "mutate".into(),
            error: "constraint violation".into(),
            details: Some("bad key".into()),
        };
        assert_eq!(
            e.to_string(),
            "OVSDB transaction failed at operation 1 (mutate): constraint violation: bad key"
        );
        assert_eq!(e.metric_label(), "transaction");
        assert_ne!(
            Error::NotConnected {
                address: "unix:/x".into()
            }
            .metric_label(),
            Error::Closed.metric_label()
        );
        assert!(
            Error::ConnectionLost {
                address: "unix:/x".into(),
                reason: "eof".into()
            }
            .is_connection()
        );
        // A connection error names the server it is about.
        assert_eq!(
            Error::NotConnected {
                address: "tcp:10.0.0.1:6641".into()
            }
            .to_string(),
            "not connected to OVSDB at tcp:10.0.0.1:6641 (reconnecting)"
        );
        assert!(
            !Error::GuardFailed {
                table: "t".into(),
                columns: vec![]
            }
            .is_connection()
        );
    }
}
