//! Every committed change of an OVSDB table, as the server's own monitor
//! reports it (one update per commit), stamped with the wall-clock time it
//! arrived: what the tests judge transactions by (no state with part of a
//! change) and what the lab times its phases from (when `SB_Global.ipsec`
//! actually turned, not when a poll saw it).
//!
//! A thread with a runtime of its own runs the monitor, so its stamps do
//! not wait for whatever the caller is blocked in.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ovsdb::{Client, Datum, MonitorEvent, MonitorRequest, Row};
use testbed::probe::unix_now;

/// One row as a commit left it.
#[derive(Debug, Clone)]
pub struct Change {
    /// When the update arrived (seconds since the epoch, `ping -D`'s
    /// clock).
    pub at: f64,
    /// The row's UUID.
    pub uuid: String,
    /// The monitored columns after the commit; `None`: the row was deleted.
    pub row: Option<Row>,
}

impl Change {
    /// Column `column` as a string atom.
    pub fn text(&self, column: &str) -> Option<&str> {
        match self.row.as_ref()?.get(column)? {
            Datum::Atom(a) => a.as_str(),
            _ => None,
        }
    }

    /// Column `column` as a boolean.
    pub fn flag(&self, column: &str) -> Option<bool> {
        self.row.as_ref()?.get(column)?.as_bool()
    }

    /// Column `column` as a string map (empty when absent).
    pub fn map(&self, column: &str) -> BTreeMap<String, String> {
        self.row
            .as_ref()
            .and_then(|r| r.get(column))
            .and_then(Datum::as_string_map)
            .unwrap_or_default()
    }
}

/// A running monitor of one table; stopped on drop.
#[derive(Debug)]
pub struct TableWatch {
    changes: Arc<Mutex<Vec<Change>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TableWatch {
    /// Monitors `columns` of `table` in database `db` at `address`
    /// (`unix:<path>`); returns once the server accepted the monitor (its
    /// initial contents are the first changes), or why it could not.
    pub fn start(address: &str, db: &str, table: &str, columns: &[&str]) -> Result<Self, String> {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (address, db, table) = (address.to_owned(), db.to_owned(), table.to_owned());
        let columns: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
        let (seen, halt) = (changes.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("watch-{table}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return drop(ready_tx.send(Err(e.to_string()))),
                };
                rt.block_on(watch(address, db, table, columns, seen, halt, ready_tx));
            })
            .map_err(|e| e.to_string())?;
        let started = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the monitor did not start within 10 s".to_owned())
            .and_then(|r| r);
        let watch = TableWatch {
            changes,
            stop,
            thread: Some(thread),
        };
        started.map(|()| watch)
    }

    /// Every change so far, in arrival order.
    pub fn changes(&self) -> Vec<Change> {
        self.changes.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// When the first change with `done` arrived, if one has.
    pub fn first(&self, done: impl Fn(&Change) -> bool) -> Option<f64> {
        self.changes().iter().find(|c| done(c)).map(|c| c.at)
    }
}

impl Drop for TableWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The monitor loop: merges each update into the row it changes (an
/// update may carry only the changed columns) and records the result.
async fn watch(
    address: String,
    db: String,
    table: String,
    columns: Vec<String>,
    seen: Arc<Mutex<Vec<Change>>>,
    stop: Arc<AtomicBool>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let client = match Client::connect_str(&address).await {
        Ok(c) => c,
        Err(e) => return drop(ready.send(Err(format!("connecting to {address}: {e}")))),
    };
    let request = BTreeMap::from([(table.clone(), MonitorRequest::columns(columns))]);
    let mut stream = match client.monitor(&db, request).await {
        Ok(s) => s,
        Err(e) => return drop(ready.send(Err(format!("monitoring {db}.{table}: {e}")))),
    };
    let _ = ready.send(Ok(()));
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(100), stream.next()).await
        else {
            continue;
        };
        let at = unix_now();
        let updates = match event {
            MonitorEvent::Initial(u) | MonitorEvent::Update(u) => u,
            MonitorEvent::Disconnected(_) => continue,
        };
        let mut batch = Vec::new();
        for (uuid, update) in updates.get(&table).into_iter().flatten() {
            let uuid = format!("{uuid:?}");
            let row = match update.new.clone() {
                Some(new) => {
                    let row = rows.entry(uuid.clone()).or_default();
                    row.extend(new);
                    Some(row.clone())
                }
                None => {
                    rows.remove(&uuid);
                    None
                }
            };
            batch.push(Change { at, uuid, row });
        }
        if let Ok(mut s) = seen.lock() {
            s.extend(batch);
        }
    }
}
