//! The handle: [`Client`] sends requests to the connection task
//! ([`crate::connection`]) and awaits their answers; [`MonitorStream`] is the
//! receiving end of one monitor. Cheap to clone; all clones share one socket.
//!
//! The handle is the request/response API only. What this project builds on
//! it (map columns, `NB_Global.ipsec`) lives in the `helpers` module.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::Error;
use crate::connection::{self, Address, Command, Config, MonitorEntry, MonitorEvent, Sink};
use crate::protocol::{
    MonitorRequest, Operation, OperationResult, RowUpdate, RowUpdate2, parse_transact_result,
    transact_params,
};

/// Updates of a `monitor` (`RowUpdate`) or `monitor_cond` (`RowUpdate2`).
///
/// Ends (`None`) only when the client is closed or the monitor could not be
/// re-established after a reconnect (reported as `Disconnected` first).
pub struct MonitorStream<U> {
    rx: mpsc::UnboundedReceiver<MonitorEvent<U>>,
    key: u64,
    client: Client,
}

impl<U> MonitorStream<U> {
    /// The next event.
    pub async fn next(&mut self) -> Option<MonitorEvent<U>> {
        self.rx.recv().await
    }
}

impl<U> futures::Stream for MonitorStream<U> {
    type Item = MonitorEvent<U>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl<U> Drop for MonitorStream<U> {
    fn drop(&mut self) {
        // Tell the server to stop sending; ignoring a closed task is right:
        // then there is nothing left to cancel.
        let _ = self
            .client
            .tx
            .send(Command::CancelMonitor { key: self.key });
    }
}

impl<U> fmt::Debug for MonitorStream<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MonitorStream")
            .field("key", &self.key)
            .finish()
    }
}

/// Handle to an OVSDB connection. Cheap to clone; all clones share one
/// socket.
#[derive(Clone)]
pub struct Client {
    tx: mpsc::UnboundedSender<Command>,
    next_monitor: Arc<AtomicU64>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("closed", &self.tx.is_closed())
            .finish()
    }
}

impl Client {
    /// Connects (failing fast if the first attempt fails) and starts the
    /// connection task on the current tokio runtime. Later connection losses
    /// are retried with backoff.
    pub async fn connect(address: Address, config: Config) -> Result<Self, Error> {
        let tx = connection::spawn(address, config).await?;
        Ok(Self {
            tx,
            next_monitor: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Connects to `unix:`/`tcp:` `address` with default [`Config`].
    pub async fn connect_str(address: &str) -> Result<Self, Error> {
        Self::connect(Address::parse(address), Config::default()).await
    }

    /// Sends a raw JSON-RPC request and returns its `result`. A non-null
    /// `error` becomes [`Error::Rpc`].
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Call {
                method: method.to_string(),
                params,
                reply,
            })
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// `transact`: runs `ops` atomically in `db`. A failed operation is
    /// returned as [`Error::Transaction`] (or [`Error::GuardFailed`] for a
    /// `wait`) with the server's `error` and `details`.
    pub async fn transact(
        &self,
        db: &str,
        ops: &[Operation],
    ) -> Result<Vec<OperationResult>, Error> {
        let result = self.call("transact", transact_params(db, ops)).await?;
        parse_transact_result(ops, &result)
    }

    /// `echo`: a round trip that proves the server is answering.
    pub async fn echo(&self) -> Result<(), Error> {
        self.call("echo", json!(["ping"])).await.map(|_| ())
    }

    /// `list_dbs`.
    pub async fn list_dbs(&self) -> Result<Vec<String>, Error> {
        let v = self.call("list_dbs", json!([])).await?;
        serde_json::from_value(v).map_err(|e| Error::UnexpectedReply {
            reason: format!("list_dbs: {e}"),
        })
    }

    /// `monitor` (RFC 7047 §4.1.5): the stream's first event is the current
    /// contents; the call returns once the server accepted the request.
    pub async fn monitor(
        &self,
        db: &str,
        tables: BTreeMap<String, MonitorRequest>,
    ) -> Result<MonitorStream<RowUpdate>, Error> {
        self.start_monitor(db, tables, Sink::V1).await
    }

    /// `monitor_cond` (ovsdb-server(7)): like [`Client::monitor`] with
    /// per-table `where` conditions and `update2` diffs.
    pub async fn monitor_cond(
        &self,
        db: &str,
        tables: BTreeMap<String, MonitorRequest>,
    ) -> Result<MonitorStream<RowUpdate2>, Error> {
        self.start_monitor(db, tables, Sink::V2).await
    }

    /// Registers a monitor whose events go to a new stream; `sink` wraps the
    /// stream's sending end for the connection task.
    async fn start_monitor<U>(
        &self,
        db: &str,
        tables: BTreeMap<String, MonitorRequest>,
        sink: fn(mpsc::UnboundedSender<MonitorEvent<U>>) -> Sink,
    ) -> Result<MonitorStream<U>, Error> {
        let (tx, events) = mpsc::unbounded_channel();
        let key = self.next_monitor.fetch_add(1, Ordering::Relaxed);
        let (started, rx) = oneshot::channel();
        let entry = MonitorEntry::new(db, tables, sink(tx), started);
        self.tx
            .send(Command::Monitor { key, entry })
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)??;
        Ok(MonitorStream {
            rx: events,
            key,
            client: self.clone(),
        })
    }

    /// Stops the connection task and closes the socket; outstanding and
    /// later requests fail with [`Error::Closed`].
    pub fn close(&self) {
        // Already closed is fine.
        let _ = self.tx.send(Command::Close);
    }
}
