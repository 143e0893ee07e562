//! The connection task: one background task per connection target that owns
//! the socket, answers the server's `echo`, probes a silent server, routes
//! responses and monitor updates, and reconnects with backoff,
//! re-establishing monitors.
//!
//! The task is reached only through [`crate::Client`]: the handle sends it
//! commands over an unbounded channel and the task answers each on its
//! own oneshot. It ends when every handle and every monitor stream is
//! dropped, or on [`crate::Client::close`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::backoff::{Backoff, BackoffPolicy};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::Error;
use crate::framing::{DEFAULT_MAX_MESSAGE, Framer};
use crate::jsonrpc::Message;
use crate::protocol::{
    MonitorRequest, RowUpdate, RowUpdate2, TableUpdates, monitor_params, parse_table_updates1,
    parse_table_updates2,
};

/// Where the server listens, in OVS notation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `unix:/path/to/db.sock`
    Unix(PathBuf),
    /// `tcp:host:port`
    Tcp(String),
    /// `ssl:host:port`: TCP with mutual TLS ([`crate::tls`]; the files in
    /// [`Config::tls`]).
    Ssl(String),
}

impl Address {
    /// Parses `unix:PATH`, `tcp:HOST:PORT` or `ssl:HOST:PORT`; a bare path
    /// is taken as unix.
    pub fn parse(s: &str) -> Self {
        if let Some(p) = s.strip_prefix("unix:") {
            Address::Unix(PathBuf::from(p))
        } else if let Some(t) = s.strip_prefix("tcp:") {
            Address::Tcp(t.to_string())
        } else if let Some(t) = s.strip_prefix("ssl:") {
            Address::Ssl(t.to_string())
        } else {
            Address::Unix(PathBuf::from(s))
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp(t) => write!(f, "tcp:{t}"),
            Address::Ssl(t) => write!(f, "ssl:{t}"),
        }
    }
}

/// Client tuning.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest accepted server message (default 64 MiB).
    pub max_message: usize,
    /// First reconnect delay (default 1 s); doubles per failed attempt.
    pub backoff_initial: Duration,
    /// Reconnect delay cap (default 30 s).
    pub backoff_max: Duration,
    /// After this long without a byte from the server, send an `echo`; if
    /// another such period passes in silence, the connection is declared
    /// lost (a peer that vanished without closing the socket, e.g. a TCP
    /// peer whose host died). `None` disables the probe. Default 5 s, the
    /// same as ovsdb-server's own probe.
    pub inactivity_probe: Option<Duration>,
    /// The key, certificate and CA files for an `ssl:` address (read at
    /// every connect). Required for `ssl:`, ignored otherwise.
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_message: DEFAULT_MAX_MESSAGE,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            inactivity_probe: Some(Duration::from_secs(5)),
            tls: None,
        }
    }
}

/// One event on a monitor stream.
#[derive(Debug, Clone)]
pub enum MonitorEvent<U> {
    /// The monitored tables' full contents: first event of a stream, and again
    /// after every reconnect. Replace any local state with it.
    Initial(TableUpdates<U>),
    /// Changes since the previous event.
    Update(TableUpdates<U>),
    /// The connection broke; updates may have been missed. The client
    /// reconnects with backoff and follows with a fresh [`MonitorEvent::Initial`].
    Disconnected(Error),
}

/// Where a monitor's events go: the receiving end is a [`crate::MonitorStream`].
pub(crate) enum Sink {
    V1(mpsc::UnboundedSender<MonitorEvent<RowUpdate>>),
    V2(mpsc::UnboundedSender<MonitorEvent<RowUpdate2>>),
}

impl Sink {
    fn method(&self) -> &'static str {
        match self {
            Sink::V1(_) => "monitor",
            Sink::V2(_) => "monitor_cond",
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sink::V1(s) => s.is_closed(),
            Sink::V2(s) => s.is_closed(),
        }
    }

    /// Parses and forwards table updates; `false` when the receiver is gone.
    fn deliver(&self, initial: bool, updates: &Value) -> Result<bool, Error> {
        fn event<U>(initial: bool, u: TableUpdates<U>) -> MonitorEvent<U> {
            if initial {
                MonitorEvent::Initial(u)
            } else {
                MonitorEvent::Update(u)
            }
        }
        Ok(match self {
            Sink::V1(s) => s
                .send(event(initial, parse_table_updates1(updates)?))
                .is_ok(),
            Sink::V2(s) => s
                .send(event(initial, parse_table_updates2(updates)?))
                .is_ok(),
        })
    }

    fn disconnected(&self, e: &Error) {
        // A receiver that is gone is cleaned up by CancelMonitor, so a failed
        // send needs no handling here.
        match self {
            Sink::V1(s) => {
                let _ = s.send(MonitorEvent::Disconnected(e.clone()));
            }
            Sink::V2(s) => {
                let _ = s.send(MonitorEvent::Disconnected(e.clone()));
            }
        }
    }
}

/// One monitor as the task keeps it, to re-send after every reconnect.
pub(crate) struct MonitorEntry {
    db: String,
    tables: BTreeMap<String, MonitorRequest>,
    sink: Sink,
    /// Answered once, when the first establishment succeeds or fails.
    started: Option<oneshot::Sender<Result<(), Error>>>,
}

impl MonitorEntry {
    /// A monitor of `tables` in `db` whose first establishment is answered
    /// on `started`.
    pub(crate) fn new(
        db: &str,
        tables: BTreeMap<String, MonitorRequest>,
        sink: Sink,
        started: oneshot::Sender<Result<(), Error>>,
    ) -> Self {
        Self {
            db: db.to_string(),
            tables,
            sink,
            started: Some(started),
        }
    }
}

/// What the handle asks of the task.
pub(crate) enum Command {
    /// A request whose `result` (or error) goes back on `reply`.
    Call {
        method: String,
        params: Value,
        reply: oneshot::Sender<Result<Value, Error>>,
    },
    /// Start (and keep re-establishing) a monitor.
    Monitor { key: u64, entry: MonitorEntry },
    /// The stream was dropped: stop the monitor.
    CancelMonitor { key: u64 },
    /// Close the socket and end the task.
    Close,
}

enum Pending {
    Call {
        method: String,
        reply: oneshot::Sender<Result<Value, Error>>,
    },
    MonitorStart {
        key: u64,
    },
    /// A request whose answer nobody needs (monitor_cancel).
    Ignore,
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

async fn open(
    address: &Address,
    tls: Option<&crate::tls::TlsFiles>,
) -> Result<(Reader, Writer), Error> {
    let err = |e: std::io::Error| Error::Connect {
        address: address.to_string(),
        source: Arc::new(e),
    };
    match address {
        Address::Ssl(t) => {
            let refuse = |reason: String| Error::Tls {
                address: address.to_string(),
                reason,
            };
            let files = tls.ok_or_else(|| {
                refuse(
                    "an ssl: remote needs a private key, a certificate and a CA certificate \
                     file, and none were given"
                        .into(),
                )
            })?;
            let config = files.client_config().map_err(refuse)?;
            let host = t.rsplit_once(':').map_or(t.as_str(), |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| refuse(format!("host {host:?}: {e}")))?;
            let s = tokio::net::TcpStream::connect(t.as_str())
                .await
                .map_err(err)?;
            s.set_nodelay(true).map_err(err)?;
            // The handshake's failure (an untrusted server certificate, a
            // client certificate the server refuses) is a connect error
            // naming the remote, retried like any other.
            let s = tokio_rustls::TlsConnector::from(config)
                .connect(name, s)
                .await
                .map_err(err)?;
            let (r, w) = tokio::io::split(s);
            Ok((Box::new(r), Box::new(w)))
        }
        Address::Unix(p) => {
            let s = tokio::net::UnixStream::connect(p).await.map_err(err)?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
        Address::Tcp(t) => {
            let s = tokio::net::TcpStream::connect(t.as_str())
                .await
                .map_err(err)?;
            // Requests are small and latency-bound.
            s.set_nodelay(true).map_err(err)?;
            let (r, w) = s.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
    }
}

/// Connects (failing fast if the first attempt fails) and starts the task on
/// the current tokio runtime; returns the channel the handle talks to it on.
pub(crate) async fn spawn(
    address: Address,
    config: Config,
) -> Result<mpsc::UnboundedSender<Command>, Error> {
    let conn = open(&address, config.tls.as_ref()).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let task = Task {
        backoff: BackoffPolicy {
            initial: config.backoff_initial,
            max: config.backoff_max,
            ..BackoffPolicy::default()
        }
        .start(),
        address,
        config,
        rx,
        next_id: 0,
        pending: HashMap::new(),
        monitors: HashMap::new(),
    };
    tokio::spawn(task.run(conn));
    Ok(tx)
}

fn monitor_id(key: u64) -> Value {
    json!(format!("m{key}"))
}

fn monitor_key(id: &Value) -> Option<u64> {
    id.as_str()?.strip_prefix('m')?.parse().ok()
}

struct Task {
    address: Address,
    config: Config,
    backoff: Backoff,
    rx: mpsc::UnboundedReceiver<Command>,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    monitors: HashMap<u64, MonitorEntry>,
}

/// Why `serve` returned.
enum Ended {
    Closed,
    Broken(Error),
}

impl Task {
    async fn run(mut self, first: (Reader, Writer)) {
        let mut conn = Some(first);
        loop {
            let Some((rd, mut wr)) = conn.take() else {
                match self.reconnect().await {
                    Some(c) => {
                        conn = Some(c);
                        continue;
                    }
                    None => return,
                }
            };
            // Re-establish monitors on the fresh connection (on the first one
            // there are none yet).
            let mut out = Vec::new();
            let keys: Vec<u64> = self.monitors.keys().copied().collect();
            for key in keys {
                self.send_monitor(key, &mut out);
            }
            let ended = if !out.is_empty() && wr.write_all(&out).await.is_err() {
                Ended::Broken(Error::ConnectionLost {
                    address: self.address.to_string(),
                    reason: "write failed".into(),
                })
            } else {
                self.serve(rd, wr).await
            };
            match ended {
                Ended::Closed => {
                    self.fail_all(&Error::Closed);
                    return;
                }
                Ended::Broken(e) => {
                    tracing::warn!(address = %self.address, error = %e, "OVSDB connection lost");
                    self.fail_all(&e);
                }
            }
        }
    }

    /// Fails every outstanding request and tells every monitor.
    fn fail_all(&mut self, e: &Error) {
        for (_, p) in self.pending.drain() {
            match p {
                Pending::Call { reply, .. } => {
                    // The caller may have given up; nothing to tell then.
                    let _ = reply.send(Err(e.clone()));
                }
                Pending::MonitorStart { key } => {
                    if let Some(m) = self.monitors.get_mut(&key)
                        && let Some(s) = m.started.take()
                    {
                        let _ = s.send(Err(e.clone()));
                        self.monitors.remove(&key);
                    }
                }
                Pending::Ignore => {}
            }
        }
        self.monitors.retain(|_, m| !m.sink.is_closed());
        for m in self.monitors.values() {
            m.sink.disconnected(e);
        }
    }

    /// Sleeps through the backoff schedule, answering commands with
    /// `NotConnected`, until a connection succeeds. `None` = closed.
    async fn reconnect(&mut self) -> Option<(Reader, Writer)> {
        loop {
            let delay = self.backoff.next_delay();
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => break,
                    cmd = self.rx.recv() => match cmd {
                        None | Some(Command::Close) => return None,
                        Some(Command::Call { reply, .. }) => {
                            let _ = reply.send(Err(Error::NotConnected { address: self.address.to_string() }));
                        }
                        Some(Command::Monitor { mut entry, .. }) => {
                            if let Some(s) = entry.started.take() {
                                let _ = s.send(Err(Error::NotConnected { address: self.address.to_string() }));
                            }
                        }
                        Some(Command::CancelMonitor { key }) => {
                            self.monitors.remove(&key);
                        }
                    }
                }
            }
            match open(&self.address, self.config.tls.as_ref()).await {
                Ok(c) => {
                    tracing::info!(address = %self.address, "OVSDB reconnected");
                    self.backoff.reset();
                    return Some(c);
                }
                Err(e) => {
                    tracing::debug!(address = %self.address, error = %e, "OVSDB reconnect failed");
                }
            }
        }
    }

    fn request(&mut self, method: &str, params: Value, pending: Pending, out: &mut Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        let msg = Message::Request {
            id: json!(id),
            method: method.to_string(),
            params,
        };
        match msg.write_to(out) {
            Ok(()) => {
                self.pending.insert(id, pending);
            }
            Err(e) => {
                if let Pending::Call { reply, .. } = pending {
                    let _ = reply.send(Err(e));
                }
            }
        }
    }

    fn send_monitor(&mut self, key: u64, out: &mut Vec<u8>) {
        let Some(m) = self.monitors.get(&key) else {
            return;
        };
        let method = m.sink.method();
        let params = monitor_params(&m.db, &monitor_id(key), &m.tables);
        self.request(method, params, Pending::MonitorStart { key }, out);
    }

    fn handle_command(&mut self, cmd: Command, out: &mut Vec<u8>) -> bool {
        match cmd {
            Command::Close => return false,
            Command::Call {
                method,
                params,
                reply,
            } => {
                let m = method.clone();
                self.request(&m, params, Pending::Call { method, reply }, out);
            }
            Command::Monitor { key, entry } => {
                self.monitors.insert(key, entry);
                self.send_monitor(key, out);
            }
            Command::CancelMonitor { key } => {
                if self.monitors.remove(&key).is_some() {
                    self.request(
                        "monitor_cancel",
                        json!([monitor_id(key)]),
                        Pending::Ignore,
                        out,
                    );
                }
            }
        }
        true
    }

    async fn serve(&mut self, mut rd: Reader, mut wr: Writer) -> Ended {
        let mut framer = Framer::new(self.config.max_message);
        // One read buffer per connection, reused for every read.
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::with_capacity(4096);
        let probe = self.config.inactivity_probe;
        let mut last_rx = tokio::time::Instant::now();
        let mut probe_sent_at: Option<tokio::time::Instant> = None;
        loop {
            // The loss deadline counts from when the probe was sent, not from
            // the last byte: if this task itself was not polled for a while
            // (a blocked runtime), the server gets a full period to answer.
            let deadline = probe.map(|p| probe_sent_at.unwrap_or(last_rx) + p);
            let silence = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Biased so bytes already waiting in the socket are read
                // before the silence timer can declare the connection lost.
                biased;
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else { return Ended::Closed };
                    if !self.handle_command(cmd, &mut out) {
                        return Ended::Closed;
                    }
                    // Batch whatever else is queued into one write: requests
                    // from concurrent callers are pipelined.
                    while let Ok(cmd) = self.rx.try_recv() {
                        if !self.handle_command(cmd, &mut out) {
                            return Ended::Closed;
                        }
                    }
                }
                n = rd.read(&mut buf) => {
                    let n = match n {
                        Ok(0) => return Ended::Broken(Error::ConnectionLost { address: self.address.to_string(), reason: "server closed the connection".into() }),
                        Ok(n) => n,
                        Err(e) => return Ended::Broken(Error::ConnectionLost { address: self.address.to_string(), reason: e.to_string() }),
                    };
                    last_rx = tokio::time::Instant::now();
                    probe_sent_at = None;
                    let values = match framer.feed(&buf[..n]) {
                        Ok(v) => v,
                        Err(e) => return Ended::Broken(e),
                    };
                    for v in values {
                        let msg = match Message::from_value(v) {
                            Ok(m) => m,
                            Err(e) => return Ended::Broken(e),
                        };
                        if let Err(e) = self.handle_message(msg, &mut out) {
                            return Ended::Broken(e);
                        }
                    }
                }
                _ = silence => {
                    if probe_sent_at.is_some() {
                        return Ended::Broken(Error::ConnectionLost { address: self.address.to_string(), reason: "no reply to inactivity probe".into() });
                    }
                    self.request("echo", json!(["probe"]), Pending::Ignore, &mut out);
                    probe_sent_at = Some(tokio::time::Instant::now());
                }
            }
            if !out.is_empty() {
                if let Err(e) = wr.write_all(&out).await {
                    return Ended::Broken(Error::ConnectionLost {
                        address: self.address.to_string(),
                        reason: e.to_string(),
                    });
                }
                out.clear();
            }
        }
    }

    fn handle_message(&mut self, msg: Message, out: &mut Vec<u8>) -> Result<(), Error> {
        match msg {
            Message::Request { id, method, params } => {
                let reply = if method == "echo" {
                    Message::echo_reply(id, params)
                } else {
                    Message::Response {
                        id,
                        result: Value::Null,
                        error: json!("unknown method"),
                    }
                };
                reply.write_to(out)
            }
            Message::Notification { method, params } => {
                if method == "update" || method == "update2" {
                    let (Some(id), Some(updates)) = (params.get(0), params.get(1)) else {
                        return Err(Error::Malformed {
                            reason: format!("{method} without monitor id and updates"),
                        });
                    };
                    if let Some(key) = monitor_key(id)
                        && let Some(m) = self.monitors.get(&key)
                        && !m.sink.deliver(false, updates)?
                    {
                        // The stream was dropped between updates.
                        self.handle_command(Command::CancelMonitor { key }, out);
                    }
                }
                Ok(())
            }
            Message::Response { id, result, error } => {
                let Some(id) = id.as_u64() else {
                    return Ok(());
                };
                match self.pending.remove(&id) {
                    Some(Pending::Call { method, reply }) => {
                        let r = if error.is_null() {
                            Ok(result)
                        } else {
                            Err(Error::Rpc {
                                method,
                                error: error.to_string(),
                            })
                        };
                        let _ = reply.send(r);
                    }
                    Some(Pending::MonitorStart { key }) => self.monitor_started(key, result, error),
                    Some(Pending::Ignore) | None => {}
                }
                Ok(())
            }
        }
    }

    fn monitor_started(&mut self, key: u64, result: Value, error: Value) {
        let Some(m) = self.monitors.get_mut(&key) else {
            return;
        };
        let outcome = if error.is_null() {
            m.sink.deliver(true, &result).map(|_| ())
        } else {
            Err(Error::Rpc {
                method: m.sink.method().to_string(),
                error: error.to_string(),
            })
        };
        match (outcome, m.started.take()) {
            (r, Some(started)) => {
                let failed = r.is_err();
                let _ = started.send(r);
                if failed {
                    self.monitors.remove(&key);
                }
            }
            (Ok(()), None) => {}
            (Err(e), None) => {
                // Re-establishing after a reconnect failed: tell the stream and
                // end it, since it would otherwise wait forever.
                m.sink.disconnected(&e);
                self.monitors.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(Address::parse("unix:/a/b"), Address::Unix("/a/b".into()));
        assert_eq!(
            Address::parse("tcp:127.0.0.1:6641"),
            Address::Tcp("127.0.0.1:6641".into())
        );
        assert_eq!(
            Address::parse("tcp:127.0.0.1:6641").to_string(),
            "tcp:127.0.0.1:6641"
        );
    }

    #[test]
    fn monitor_ids_round_trip() {
        assert_eq!(monitor_key(&monitor_id(42)), Some(42));
        assert_eq!(monitor_key(&json!("x")), None);
    }
}
