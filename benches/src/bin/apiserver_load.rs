//! Load on the embedded API server (`lab::apiserver`): sustained ConfigMap
//! creates+updates per second over HTTPS while 100 watches are open, and the
//! delay from a write to its watch event (p50/p99/max over every watch).
//!
//! Target on 2 cores: ≥ 5,000 writes/s, watch p99 < 10 ms.
//! Run: `cargo run --release -p kube-ovn-ipsec-benches --bin apiserver_load`.
//!
//! Each write carries its send time (µs since the start) in an annotation;
//! watchers find it in the raw event bytes (no JSON parse on the hot path)
//! and record now − send time.

// A bench binary: a failed setup step should stop it with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::AsyncReadExt as _;
use http_body_util::BodyExt;
use lab::apiserver::{ADMIN_TOKEN, ApiServer};

/// Options.
#[derive(Debug, Parser)]
struct Args {
    /// Open watches.
    #[arg(long, default_value_t = 100)]
    watches: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 32)]
    writers: usize,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Measured seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

const NS: &str = "bench";
const MARK: &[u8] = b"\"bench/t\":\"";

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

fn find_stamp(line: &[u8]) -> Option<u64> {
    // Only check where a quote starts: a memcmp per byte would cost more than
    // the server's work for the event.
    let at = (0..line.len().saturating_sub(MARK.len()))
        .filter(|i| line[*i] == b'"' && line[*i + 1] == b'b')
        .find(|i| line[*i..].starts_with(MARK))?
        + MARK.len();
    let digits = line[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// CPU seconds (user + system, all threads) this process has used so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
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

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let server = ApiServer::builder()
        .history_window(50_000)
        .start()
        .await
        .unwrap();
    let client = server.client(ADMIN_TOKEN).await.unwrap();
    let start = Instant::now();
    let now_us = move || start.elapsed().as_micros() as u64;

    let ns = br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}"#.to_vec();
    let req = http::Request::post("/api/v1/namespaces")
        .header("content-type", "application/json")
        .body(ns)
        .unwrap();
    client.request_text(req).await.unwrap();
    let rv = server.store().resource_version();

    // Watches: each a long-lived HTTPS stream of its own.
    let measuring = Arc::new(AtomicBool::new(false));
    let mut watchers = Vec::new();
    for _ in 0..args.watches {
        let client = client.clone();
        let measuring = measuring.clone();
        let path = format!(
            "/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=600"
        );
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        let stream = client.request_stream(req).await.unwrap();
        watchers.push(tokio::spawn(async move {
            // Raw chunks, split on newlines in place: no String per event.
            futures::pin_mut!(stream);
            let mut samples = Vec::with_capacity(200_000);
            let mut events = 0u64;
            let mut partial: Vec<u8> = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            'read: loop {
                let n = match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let t_now = now_us();
                partial.extend_from_slice(&buf[..n]);
                let mut start = 0;
                while let Some(nl) = partial[start..].iter().position(|c| *c == b'\n') {
                    let line = &partial[start..start + nl];
                    start += nl + 1;
                    events += 1;
                    if line.starts_with(b"{\"type\":\"BOOKMARK\"") {
                        continue;
                    }
                    match find_stamp(line) {
                        Some(t) if measuring.load(Ordering::Relaxed) => {
                            samples.push(t_now.saturating_sub(t))
                        }
                        Some(_) => {}
                        // Only the stop object carries no stamp.
                        None if line.windows(12).any(|w| w == b"\"bench-stop\"") => break 'read,
                        None => {}
                    }
                }
                partial.drain(..start);
            }
            (samples, events)
        }));
    }

    // Writers: create an object, then update it, and again.
    let writes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let client = client.clone();
        let (writes, failures, stop, measuring) = (
            writes.clone(),
            failures.clone(),
            stop.clone(),
            measuring.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{w}-{n}");
                let create = http::Request::post(format!("/api/v1/namespaces/{NS}/configmaps"))
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body_for(&name, now_us(), n)))
                    .unwrap();
                let update =
                    http::Request::patch(format!("/api/v1/namespaces/{NS}/configmaps/{name}"))
                        .header("content-type", "application/merge-patch+json")
                        .body(kube::client::Body::from(patch_for(now_us(), n + 1)))
                        .unwrap();
                for req in [create, update] {
                    let ok = match client.send(req).await {
                        Ok(resp) => {
                            let ok = resp.status().is_success();
                            let _ = resp.into_body().collect().await;
                            ok
                        }
                        Err(_) => false,
                    };
                    if measuring.load(Ordering::Relaxed) {
                        if ok {
                            writes.fetch_add(1, Ordering::Relaxed)
                        } else {
                            failures.fetch_add(1, Ordering::Relaxed)
                        };
                    }
                }
                n += 2;
            }
        }));
    }

    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    measuring.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    measuring.store(false, Ordering::SeqCst);
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
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
    let mut all = Vec::new();
    let mut min_events = u64::MAX;
    for w in watchers {
        let (samples, events) = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("watcher drained")
            .unwrap();
        min_events = min_events.min(events);
        all.extend(samples);
    }
    all.sort_unstable();
    let total = writes.load(Ordering::Relaxed);
    let rate = total as f64 / elapsed;
    let p50 = percentile(&all, 0.50) as f64 / 1000.0;
    let p99 = percentile(&all, 0.99) as f64 / 1000.0;
    let max = all.last().copied().unwrap_or(0) as f64 / 1000.0;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "apiserver_load: {} watches, {} writers, {cores} cores, {elapsed:.1} s measured",
        args.watches, args.writers
    );
    println!(
        "  writes (creates+updates): {total} ok, {} failed, {rate:.0} writes/s   [target >= 5000]",
        failures.load(Ordering::Relaxed)
    );
    println!(
        "  write -> watch event delay over {} deliveries: p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms   [target p99 < 10 ms]",
        all.len()
    );
    println!("  fewest events seen by one watch: {min_events}");
    // The machine may be shared: say how much CPU this process actually got,
    // and what the same work per CPU-second would give on 2 dedicated cores.
    let per_cpu = total as f64 / cpu.max(0.001);
    println!(
        "  CPU used while measuring (server + clients, one process): {cpu:.2} s in {elapsed:.1} s = {:.2} cores; {per_cpu:.0} writes per CPU-second -> {:.0} writes/s projected on 2 dedicated cores",
        cpu / elapsed,
        per_cpu * 2.0
    );
    let ok = rate >= 5000.0 && p99 < 10.0;
    println!("  baseline: {}", if ok { "met" } else { "NOT met" });
    server.shutdown().await;
}
