//! Load on the embedded API server (`apiserver`): ConfigMap
//! creates+updates over HTTPS while 100 watches are open, and the delay from
//! a write to its watch event (p50/p99/max over every delivery to every watch).
//!
//! Target on 2 cores: ≥ 5,000 writes/s sustained, watch delivery p99 < 10 ms.
//! Run: `cargo run --release -p kube-ovn-ipsec-benches --bin apiserver_load`.
//!
//! The server runs in a child process (this binary with `--serve`), so the
//! CPU it uses is measured apart from the load generator's; both share the
//! same two cores, as they must on one machine.
//!
//! Two phases over the same 100 watches:
//! 1. **capacity**: writers in a closed loop (each sends its next write when
//!    the last is answered) — the most writes/s the server sustains. Its delay
//!    figures are printed too, but at saturation they only measure the queue
//!    the closed loop builds (Little's law), not the watch path.
//! 2. **at the target rate**: the same writers paced to an offered load of
//!    `--rate` writes/s (5,000), their schedules spread evenly over the
//!    period (one write every 200 µs, not 32 at once every 6.4 ms) — the
//!    delay from a write to each watch receiving its event, at the rate the
//!    target names.
//!
//! The load generator talks HTTP/1.1 over TLS through `rawhttp` by default
//! (one task per connection, parsed in place) so that less of the two shared
//! cores goes to it; `--client kube` uses kube-rs's client instead.
//!
//! Each write carries its send time (µs since the start) in an annotation;
//! watchers find it in the raw event bytes (no JSON parse on the hot path)
//! and count now − send time, and now − when the write's answer arrived, in
//! histograms (no memory growth and no sort at half a million deliveries a
//! second).

// A bench binary: a failed setup step should stop it with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use apiserver::{ADMIN_TOKEN, ApiServer};
use clap::Parser;
use futures::AsyncReadExt as _;
use http_body_util::BodyExt;
use kube_ovn_ipsec_benches::rawhttp;

/// Options.
#[derive(Debug, Parser)]
struct Args {
    /// Open watches.
    #[arg(long, default_value_t = 100)]
    watches: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 32)]
    writers: usize,
    /// Warm-up seconds before each phase (not measured).
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Offered load of the second phase, writes/s.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// The load generator's HTTP client: `raw` (one task per connection,
    /// parsing in place: leaves more of the shared cores to the server) or
    /// `kube` (kube-rs's client, as the agent and controller use it).
    #[arg(long, value_enum, default_value_t = ClientKind::Raw)]
    client: ClientKind,
    /// Internal: run only the server, write its admin kubeconfig here, print
    /// "ready" and serve until stdin closes.
    #[arg(long, hide = true)]
    serve: Option<PathBuf>,
}

/// Which HTTP client generates the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClientKind {
    Raw,
    Kube,
}

/// A watch stream from either client.
enum WatchStream {
    Kube(std::pin::Pin<Box<dyn futures::AsyncRead + Send>>),
    Raw(Box<rawhttp::Body>),
}

impl WatchStream {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            WatchStream::Kube(s) => s.read(buf).await,
            WatchStream::Raw(b) => b.read(buf).await,
        }
    }
}

/// A writer's connection from either client.
enum WriteConn {
    Kube(kube::Client),
    Raw(Box<rawhttp::Conn>),
}

impl WriteConn {
    /// Sends one write; its success and the answer's body (`None`: no answer).
    async fn send(
        &mut self,
        method: http::Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Option<(bool, Vec<u8>)> {
        match self {
            WriteConn::Kube(client) => {
                let req = http::Request::builder()
                    .method(method)
                    .uri(path)
                    .header("content-type", content_type)
                    .body(kube::client::Body::from(body))
                    .ok()?;
                let resp = client.send(req).await.ok()?;
                let ok = resp.status().is_success();
                let body = resp.into_body().collect().await.ok()?.to_bytes();
                Some((ok, body.to_vec()))
            }
            WriteConn::Raw(conn) => {
                let resp = conn
                    .request(method.as_str(), path, content_type, &body)
                    .await
                    .ok()?;
                Some(((200..300).contains(&resp.status), resp.body))
            }
        }
    }
}

const NS: &str = "bench";
const MARK: &[u8] = b"\"bench/t\":\"";
const STOP: &[u8] = b"\"bench-stop\"";
const RV: &[u8] = b"\"resourceVersion\":\"";
/// Response times are kept for resourceVersions below this (32 MiB of them).
const MAX_RV: usize = 1 << 22;

/// Phases, as stored in the shared phase flag.
const WARMUP: u8 = 0;
const CAPACITY: u8 = 1;
const PACED: u8 = 2;

fn body_for(name: &str, t_us: u64, n: u64) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"{NS}","labels":{{"app":"bench"}},"annotations":{{"bench/t":"{t_us}"}}}},"data":{{"n":"{n}","payload":"0123456789abcdef0123456789abcdef"}}}}"#
    )
    .into_bytes()
}

fn patch_for(t_us: u64, n: u64) -> Vec<u8> {
    format!(r#"{{"metadata":{{"annotations":{{"bench/t":"{t_us}"}}}},"data":{{"n":"{n}"}}}}"#)
        .into_bytes()
}

/// CPU seconds (user + system, all threads) process `pid` has used so far.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5) (utime, stime) are the 12th and 13th after the ")".
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The server alone, in this (child) process.
async fn serve(kubeconfig: &Path) {
    let server = ApiServer::builder()
        .history_window(50_000)
        .start()
        .await
        .unwrap();
    server.write_kubeconfig(kubeconfig, ADMIN_TOKEN).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    // The parent closes stdin (or dies): stop.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().lock().read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    })
    .await;
    server.shutdown().await;
}

/// Starts `--serve` as a child and waits until it is ready.
fn spawn_server(kubeconfig: &Path) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .arg(kubeconfig)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the server process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "server process did not start");
    child
}

/// Delays (µs) counted in 10 µs buckets up to 100 ms, longer ones kept
/// exactly: a watch records half a million deliveries a second, and a
/// counter per bucket costs neither memory growth nor a sort.
struct Histogram {
    buckets: Vec<u32>,
    over: Vec<u64>,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; Self::BUCKETS],
            over: Vec::new(),
            count: 0,
        }
    }
}

impl Histogram {
    const BUCKET_US: u64 = 10;
    const BUCKETS: usize = 10_000;

    fn record(&mut self, us: u64) {
        self.count += 1;
        match self.buckets.get_mut((us / Self::BUCKET_US) as usize) {
            Some(b) => *b += 1,
            None => self.over.push(us),
        }
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.over.extend(&other.over);
        self.count += other.count;
    }

    /// The delay at quantile `p` (the upper edge of its bucket), µs.
    fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((self.count as f64 - 1.0) * p).round() as u64;
        let mut below = 0u64;
        for (i, n) in self.buckets.iter().enumerate() {
            below += u64::from(*n);
            if below > rank {
                return (i as u64 + 1) * Self::BUCKET_US;
            }
        }
        let mut over = self.over.clone();
        over.sort_unstable();
        over.get((rank - below) as usize).copied().unwrap_or(0)
    }

    /// The largest delay recorded (to its bucket's upper edge), µs.
    fn max(&self) -> u64 {
        if let Some(m) = self.over.iter().max() {
            return *m;
        }
        self.buckets
            .iter()
            .rposition(|n| *n > 0)
            .map_or(0, |i| (i as u64 + 1) * Self::BUCKET_US)
    }
}

/// One phase's deliveries as one watch (or all) saw them.
#[derive(Default)]
struct Deliveries {
    /// From the write's answer reaching the writer to the event.
    after_answer: Histogram,
    /// From sending the write to the event.
    after_send: Histogram,
    /// Events read before their write's answer (counted as 0 above).
    early: u64,
    /// Events whose resourceVersion is beyond the answer table.
    unmatched: u64,
}

impl Deliveries {
    fn merge(&mut self, other: &Deliveries) {
        self.after_answer.merge(&other.after_answer);
        self.after_send.merge(&other.after_send);
        self.early += other.early;
        self.unmatched += other.unmatched;
    }
}

/// What one watch saw: its deliveries per phase, and how many events.
struct Seen {
    capacity: Deliveries,
    paced: Deliveries,
    events: u64,
}

/// The decimal number right after `at` in `bytes` (0 if none).
fn number_at(bytes: &[u8], at: usize) -> u64 {
    bytes[at.min(bytes.len())..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .fold(0u64, |acc, c| acc * 10 + u64::from(c - b'0'))
}

/// Finds the quoted number after `"resourceVersion":"` (0 if none).
fn resource_version(finder: &memchr::memmem::Finder<'_>, bytes: &[u8]) -> u64 {
    finder
        .find(bytes)
        .map(|at| number_at(bytes, at + RV.len()))
        .unwrap_or(0)
}

/// Reads one watch stream to the stop object, recording deliveries.
/// `answered[rv]` is when the write that made `rv` was answered (µs + 1; 0:
/// not yet, so the event came first).
async fn watch(
    mut stream: WatchStream,
    phase: Arc<AtomicU8>,
    answered: Arc<Vec<AtomicU64>>,
    now_us: impl Fn() -> u64,
) -> Seen {
    let mark = memchr::memmem::Finder::new(MARK);
    let stop = memchr::memmem::Finder::new(STOP);
    let rv = memchr::memmem::Finder::new(RV);
    let mut seen = Seen {
        capacity: Deliveries::default(),
        paced: Deliveries::default(),
        events: 0,
    };
    // Raw bytes, lines split in place: no String and no parse per event.
    let mut buf = vec![0u8; 256 * 1024];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = match stream.read(&mut buf[filled..]).await {
            Ok(0) | Err(_) => return seen,
            Ok(n) => n,
        };
        let t_now = now_us();
        let phase = phase.load(Ordering::Relaxed);
        filled += n;
        let mut start = 0;
        while let Some(nl) = memchr::memchr(b'\n', &buf[start..filled]) {
            let line = &buf[start..start + nl];
            start += nl + 1;
            seen.events += 1;
            let Some(at) = mark.find(line) else {
                if stop.find(line).is_some() {
                    return seen;
                }
                continue; // a bookmark
            };
            let d = match phase {
                CAPACITY => &mut seen.capacity,
                PACED => &mut seen.paced,
                _ => continue,
            };
            let sent = number_at(line, at + MARK.len());
            d.after_send.record(t_now.saturating_sub(sent));
            match answered
                .get(resource_version(&rv, line) as usize)
                .map(|a| a.load(Ordering::Relaxed))
            {
                Some(0) => {
                    d.early += 1;
                    d.after_answer.record(0);
                }
                Some(a) => d.after_answer.record(t_now.saturating_sub(a - 1)),
                None => d.unmatched += 1,
            }
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
    }
}

/// Counters the writers share.
#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Write round trips (send → response), µs, per measured phase.
    latency: std::sync::Mutex<[Histogram; 2]>,
}

/// One phase's figures.
struct PhaseResult {
    writes: u64,
    failed: u64,
    elapsed: f64,
    server_cpu: f64,
    client_cpu: f64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(path) = &args.serve {
        return serve(path).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut server = spawn_server(&kubeconfig);
    let server_pid = server.id().to_string();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let raw = rawhttp::Connector::from_kubeconfig(&kubeconfig).unwrap();
    let start = Instant::now();
    let now_us = move || start.elapsed().as_micros() as u64;

    let ns = br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}"#.to_vec();
    let req = http::Request::post("/api/v1/namespaces")
        .header("content-type", "application/json")
        .body(ns)
        .unwrap();
    let created: serde_json::Value =
        serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // When each write's response arrived (µs + 1; 0: none), by resourceVersion.
    let answered: Arc<Vec<AtomicU64>> = Arc::new((0..MAX_RV).map(|_| AtomicU64::new(0)).collect());
    // Watches: each a long-lived HTTPS stream (connection) of its own.
    let phase = Arc::new(AtomicU8::new(WARMUP));
    let mut watchers = Vec::new();
    for _ in 0..args.watches {
        let path = format!(
            "/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=600"
        );
        let stream = match args.client {
            ClientKind::Kube => {
                let req = http::Request::get(path).body(Vec::new()).unwrap();
                WatchStream::Kube(Box::pin(client.request_stream(req).await.unwrap()))
            }
            ClientKind::Raw => WatchStream::Raw(Box::new(
                raw.connect().await.unwrap().stream(&path).await.unwrap(),
            )),
        };
        watchers.push(tokio::spawn(watch(
            stream,
            phase.clone(),
            answered.clone(),
            now_us,
        )));
    }

    // Writers: create an object, then update it, and again. `pace` is the
    // gap between one writer's writes in the paced phase (0: closed loop).
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let pace_ns = Arc::new(AtomicU64::new(0));
    // When the paced phase's schedule starts (set before `pace_ns`).
    let pace_start = Arc::new(std::sync::OnceLock::<tokio::time::Instant>::new());
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let mut conn = match args.client {
            ClientKind::Kube => WriteConn::Kube(client.clone()),
            ClientKind::Raw => WriteConn::Raw(Box::new(raw.connect().await.unwrap())),
        };
        let (counts, stop, phase, pace_ns, pace_start, answered) = (
            counts.clone(),
            stop.clone(),
            phase.clone(),
            pace_ns.clone(),
            pace_start.clone(),
            answered.clone(),
        );
        let n_writers = args.writers as u64;
        writers.push(tokio::spawn(async move {
            let rv = memchr::memmem::Finder::new(RV);
            let mut latency = [Histogram::default(), Histogram::default()];
            let mut n = 0u64;
            let mut next = tokio::time::Instant::now();
            let mut paced = false;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{n}");
                for update in [false, true] {
                    let pace = pace_ns.load(Ordering::Relaxed);
                    if pace > 0 {
                        // Open loop: on a fixed schedule; one that fell
                        // behind sends at once (the achieved rate shows it).
                        // The writers' schedules are spread evenly over the
                        // period: started together they would send in
                        // bursts of one write per writer, an offered load
                        // far burstier than the rate it names.
                        if !paced {
                            paced = true;
                            let start = pace_start.get().copied().unwrap_or(next);
                            next = start + Duration::from_nanos(pace * w as u64 / n_writers);
                        }
                        next += Duration::from_nanos(pace);
                        tokio::time::sleep_until(next).await;
                    } else {
                        next = tokio::time::Instant::now();
                    }
                    let sent = now_us();
                    let answer = if update {
                        conn.send(
                            http::Method::PATCH,
                            &format!("/api/v1/namespaces/{NS}/configmaps/{name}"),
                            "application/merge-patch+json",
                            patch_for(sent, n + 1),
                        )
                        .await
                    } else {
                        conn.send(
                            http::Method::POST,
                            &format!("/api/v1/namespaces/{NS}/configmaps"),
                            "application/json",
                            body_for(&name, sent, n),
                        )
                        .await
                    };
                    let ok = match answer {
                        Some((ok, body)) => {
                            let t = now_us();
                            let rv = resource_version(&rv, &body) as usize;
                            if let Some(slot) = answered.get(rv) {
                                slot.store(t + 1, Ordering::Relaxed);
                            }
                            ok
                        }
                        None => false,
                    };
                    let p = phase.load(Ordering::Relaxed);
                    if p != WARMUP {
                        let c = if ok { &counts.ok } else { &counts.failed };
                        c.fetch_add(1, Ordering::Relaxed);
                        latency[usize::from(p == PACED)].record(now_us() - sent);
                    }
                }
                n += 2;
            }
            let mut all = counts.latency.lock().unwrap();
            for (mine, all) in latency.iter().zip(all.iter_mut()) {
                all.merge(mine);
            }
        }));
    }

    let measure = |which: u8| {
        let (phase, counts, server_pid) = (phase.clone(), counts.clone(), server_pid.clone());
        let (warmup, seconds) = (args.warmup, args.seconds);
        async move {
            tokio::time::sleep(Duration::from_secs(warmup)).await;
            let (ok0, failed0) = (
                counts.ok.load(Ordering::SeqCst),
                counts.failed.load(Ordering::SeqCst),
            );
            let (server0, client0) = (cpu_seconds(&server_pid), cpu_seconds("self"));
            let t0 = Instant::now();
            phase.store(which, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            phase.store(WARMUP, Ordering::SeqCst);
            PhaseResult {
                elapsed: t0.elapsed().as_secs_f64(),
                writes: counts.ok.load(Ordering::SeqCst) - ok0,
                failed: counts.failed.load(Ordering::SeqCst) - failed0,
                server_cpu: cpu_seconds(&server_pid) - server0,
                client_cpu: cpu_seconds("self") - client0,
            }
        }
    };
    let capacity = measure(CAPACITY).await;
    let _ = pace_start.set(tokio::time::Instant::now());
    pace_ns.store(
        1_000_000_000 * args.writers as u64 / args.rate.max(1),
        Ordering::SeqCst,
    );
    let paced = measure(PACED).await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    // A last object tells every watcher to finish.
    let stop_obj =
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bench-stop"}}"#.to_vec();
    let req = http::Request::post(format!("/api/v1/namespaces/{NS}/configmaps"))
        .header("content-type", "application/json")
        .body(stop_obj)
        .unwrap();
    client.request_text(req).await.unwrap();
    let (mut cap_deliveries, mut paced_deliveries) = (Deliveries::default(), Deliveries::default());
    let mut min_events = u64::MAX;
    for w in watchers {
        let seen = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("watcher drained")
            .unwrap();
        min_events = min_events.min(seen.events);
        cap_deliveries.merge(&seen.capacity);
        paced_deliveries.merge(&seen.paced);
    }
    drop(server.stdin.take());
    let _ = server.wait();

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "apiserver_load: {} watches, {} writers ({:?} client), {cores} cores, server in its own process, {} s per phase",
        args.watches, args.writers, args.client, args.seconds
    );
    let latencies = std::mem::take(&mut *counts.latency.lock().unwrap());
    let spread = |h: &Histogram| {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            h.percentile(0.50) as f64 / 1000.0,
            h.percentile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0
        )
    };
    let report = |name: &str, r: &PhaseResult, d: &Deliveries, rtt: Histogram| {
        let rate = r.writes as f64 / r.elapsed;
        println!("  {name}:");
        println!(
            "    writes (creates+updates): {} ok, {} failed, {rate:.0} writes/s; round trip {}",
            r.writes,
            r.failed,
            spread(&rtt)
        );
        println!(
            "    watch delivery, write answered -> event, {} deliveries: {}   [target p99 < 10 ms]",
            d.after_answer.count,
            spread(&d.after_answer)
        );
        println!(
            "      ({} events reached a watch before their write's answer (counted as 0); {} not matched to a write)",
            d.early, d.unmatched
        );
        println!(
            "    write sent -> event (adds the write's round trip): {}",
            spread(&d.after_send)
        );
        println!(
            "    CPU: server {:.2} cores, load generator {:.2} cores; {:.0} writes per server CPU-second",
            r.server_cpu / r.elapsed,
            r.client_cpu / r.elapsed,
            r.writes as f64 / r.server_cpu.max(0.001)
        );
        (rate, d.after_answer.percentile(0.99) as f64 / 1000.0)
    };
    let [cap_rtt, paced_rtt] = latencies;
    let (cap_rate, _) = report(
        "capacity (closed loop; its delays are mostly the queue the loop builds)",
        &capacity,
        &cap_deliveries,
        cap_rtt,
    );
    let (paced_rate, paced_p99) = report(
        &format!("at an offered {} writes/s (paced)", args.rate),
        &paced,
        &paced_deliveries,
        paced_rtt,
    );
    println!("  fewest events seen by one watch: {min_events}");
    let ok = cap_rate >= 5000.0 && paced_rate >= 0.98 * args.rate as f64 && paced_p99 < 10.0;
    println!(
        "  target (>= 5000 writes/s sustained; delivery p99 < 10 ms at 5000 writes/s): {}",
        if ok { "met" } else { "NOT met" }
    );
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    #[test]
    fn histogram_percentiles_are_bucket_upper_edges_and_overflow_is_exact() {
        let mut h = Histogram::default();
        for us in 1..=98 {
            h.record(us * 100); // 0.1 ms .. 9.8 ms
        }
        h.record(150_000); // beyond the buckets: kept exactly
        h.record(250_000);
        assert_eq!(h.count, 100);
        assert_eq!(h.percentile(0.0), 110);
        assert_eq!(h.percentile(0.5), 5_110); // rank 50: the 51st value, 5.1 ms
        assert_eq!(h.percentile(0.99), 150_000); // rank 98: the first overflow
        assert_eq!(h.max(), 250_000);
        let mut merged = Histogram::default();
        merged.merge(&h);
        merged.merge(&h);
        assert_eq!(merged.count, 200);
        assert_eq!(merged.percentile(0.5), h.percentile(0.5));
        assert_eq!(Histogram::default().percentile(0.99), 0);
    }
}
