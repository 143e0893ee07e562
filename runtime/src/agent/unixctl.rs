//! The agent's OVS-style control socket: what `ovs-appctl -t <socket>`
//! speaks to every OVS daemon — JSON-RPC 1.0 over a Unix stream socket, a
//! request `{"id", "method", "params"}` answered by `{"id", "result",
//! "error"}` with text in one of them — so operators use the tool they
//! already have:
//!
//! - `ipsec/show`: phase, generation, expiry, digests, guards and lease,
//!   and every peer with its data-path state and SA counters;
//! - `ipsec/refresh`: samples the data path now and then shows;
//! - `list-commands`: the above.
//!
//! Everything printed comes from the status board, which holds no key
//! material: counters, addresses, reasons, timestamps and digests.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use actors::datapath::RefreshSignal;
use actors::status::{Diagnostics, StatusBoard};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// The commands, with their usage, as `list-commands` prints them.
pub const COMMANDS: [(&str, &str); 3] = [
    ("ipsec/show", ""),
    ("ipsec/refresh", ""),
    ("list-commands", ""),
];

/// How long `ipsec/refresh` waits for the new sample.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request accepted: a command has no arguments worth more.
const MAX_REQUEST: usize = 64 * 1024;

/// What a request is answered with: `Ok(text)` as `result`, `Err(text)` as
/// `error` (`ovs-appctl` prints it and exits 2).
type Answer = Result<String, String>;

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The text of `ipsec/show` (pure; `pid` is the agent's).
pub fn render_show(d: &Diagnostics, pid: u32) -> String {
    let s = &d.status;
    let mut o = String::new();
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let _ = writeln!(o, "kube-ovn-ipsec agent (pid {pid})");
    let _ = writeln!(
        o,
        "phase: {:?}  reason: {}",
        s.phase,
        opt(s.reason.map(|r| r.to_string()))
    );
    if let Some(m) = s.message() {
        let _ = writeln!(o, "  {m}");
    }
    let _ = writeln!(
        o,
        "node: uid {}  chassis {}",
        opt(s.node_uid.as_ref().map(|u| u.as_str().to_owned())),
        opt(s.chassis.as_ref().map(|c| c.as_str().to_owned()))
    );
    let _ = writeln!(
        o,
        "identity: generation {}  expires {}",
        opt(s.generation.map(|g| g.to_string())),
        opt(s.expires.map(|e| e.to_string()))
    );
    let _ = writeln!(
        o,
        "  certificate sha256 {}\n  trust sha256 {} (acknowledged by the monitor)",
        opt(s.certificate_digest.map(|d| d.to_string())),
        opt(s.trust_digest.map(|d| d.to_string()))
    );
    let _ = writeln!(
        o,
        "configuration applied: {}  runtime healthy: {}  protection armed: {}",
        yes(s.configuration_applied),
        yes(s.runtime_healthy),
        yes(s.protection_armed)
    );
    match &d.lease {
        Some(l) => {
            let _ = writeln!(
                o,
                "lease: {}  mark {:#010x} ({})  reqid {}",
                l.lease_id, l.mark, l.mark, l.reqid
            );
        }
        None => {
            let _ = writeln!(o, "lease: none");
        }
    }
    let _ = writeln!(
        o,
        "guards: {}{}",
        if s.protection_armed {
            "armed"
        } else {
            "NOT armed"
        },
        match (d.readback_age, d.protection_problem) {
            (Some(age), None) => format!(", read back {:.1} s ago", age.as_secs_f64()),
            (Some(age), Some(r)) => format!(", read back {:.1} s ago: {r}", age.as_secs_f64()),
            (None, _) => ", never read back".into(),
        }
    );
    for (child, reason) in &d.failing {
        let _ = writeln!(o, "failing: {child} ({reason})");
    }
    let _ = writeln!(
        o,
        "datapath: {}  ({} samples{})",
        match s.datapath_healthy {
            Some(true) => "healthy",
            Some(false) => "UNHEALTHY",
            None => "not measured",
        },
        d.datapath_samples,
        if d.datapath_failed {
            "; the last one failed, see the log"
        } else {
            ""
        }
    );
    if let Some(m) = s.mtu {
        let _ = writeln!(o, "mtu: {m}");
    }
    if s.peers.is_empty() {
        let _ = writeln!(o, "peers: none with IPsec intent");
    } else {
        let _ = writeln!(o, "peers:");
    }
    for p in &s.peers {
        let _ = writeln!(
            o,
            "  {} (chassis {}): {}{} since {}",
            p.peer,
            opt(p.chassis.as_ref().map(|c| c.as_str().to_owned())),
            p.state,
            if p.healthy { "" } else { " [unhealthy]" },
            p.since
        );
        for (dir, c) in [("out", p.outbound), ("in ", p.inbound)] {
            let _ = writeln!(
                o,
                "    {dir}: {} SA(s), {} packets, {} bytes",
                c.sas, c.packets, c.bytes
            );
        }
        if let Some(ms) = p.enable_window_millis {
            let _ = writeln!(o, "    enable window: {:.2} s", ms as f64 / 1000.0);
        }
        if p.nat_traversal {
            let _ = writeln!(o, "    NAT-T (UDP 4500)");
        }
        if let Some(m) = p.message() {
            let _ = writeln!(o, "    check: {m}");
        }
    }
    o
}

/// Answers one command.
async fn answer(method: &str, board: &StatusBoard, refresh: &RefreshSignal) -> Answer {
    let pid = std::process::id();
    match method {
        "ipsec/show" => Ok(render_show(&board.diagnostics(), pid)),
        "ipsec/refresh" => {
            let (before, _) = board.datapath_samples();
            refresh.request();
            let deadline = tokio::time::Instant::now() + REFRESH_TIMEOUT;
            while board.datapath_samples().0 == before {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "no data-path sample within {} s; the datapath actor may be restarting — see the log",
                        REFRESH_TIMEOUT.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(render_show(&board.diagnostics(), pid))
        }
        "list-commands" => Ok(COMMANDS.iter().fold(
            "The available commands are:\n".to_string(),
            |mut o, (c, usage)| {
                let _ = writeln!(o, "  {c:<24}{usage}");
                o
            },
        )),
        other => Err(format!(
            "\"{other}\" is not a valid command (use list-commands to see the list)"
        )),
    }
}

/// The reply to one parsed request; `None` for a notification (no `id`).
async fn reply(request: &Value, board: &StatusBoard, refresh: &RefreshSignal) -> Option<Value> {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let result = match (
        request.get("method").and_then(Value::as_str),
        request.get("params"),
    ) {
        (Some(method), Some(Value::Array(params))) if params.is_empty() => {
            answer(method, board, refresh).await
        }
        (Some(method), Some(Value::Array(_))) => Err(format!("\"{method}\" takes no arguments")),
        _ => Err("malformed request: expected {\"method\": string, \"params\": array}".into()),
    };
    if id.is_null() {
        return None;
    }
    Some(match result {
        Ok(text) => json!({"id": id, "result": text, "error": Value::Null}),
        Err(text) => json!({"id": id, "result": Value::Null, "error": text}),
    })
}

/// Serves one connection: requests are JSON values back to back (no
/// framing, as OVS's jsonrpc streams are), each answered in order.
async fn serve_connection(mut stream: UnixStream, board: StatusBoard, refresh: RefreshSignal) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // Answer every complete request in the buffer.
        let mut consumed = 0;
        let mut parsed = Vec::new();
        {
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            loop {
                match it.next() {
                    Some(Ok(v)) => {
                        consumed = it.byte_offset();
                        parsed.push(v);
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "control socket: malformed JSON; closing the connection");
                        return;
                    }
                    None => break,
                }
            }
        }
        buf.drain(..consumed);
        for request in parsed {
            if let Some(r) = reply(&request, &board, &refresh).await {
                let mut bytes = r.to_string().into_bytes();
                bytes.push(b'\n');
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        }
        if buf.len() > MAX_REQUEST {
            tracing::warn!(
                bytes = buf.len(),
                "control socket: request too large; closing the connection"
            );
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Binds the control socket at `path` (replacing a stale socket file left
/// by an earlier agent — one nobody answers on; refusing to replace a live
/// socket or anything that is not a socket), and returns
/// the serving future, which ends when `shutdown` fires and removes the
/// socket file.
pub fn bind(
    path: &Path,
    board: StatusBoard,
    refresh: RefreshSignal,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<impl std::future::Future<Output = ()> + use<>> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "{} is served by a running process (another agent?)",
                        path.display()
                    ),
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    // Like OVS's control sockets: for root (and the group) only.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o750))?;
    let path: PathBuf = path.to_owned();
    Ok(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_connection(stream, board.clone(), refresh.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "control socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                () = async {
                    // The guard is dropped inside: it must not live across
                    // the select (it is not Send).
                    let _ = shutdown.wait_for(|stop| *stop).await;
                } => break,
            }
        }
        let _ = std::fs::remove_file(&path);
    })
}

#[cfg(test)]
mod tests;
