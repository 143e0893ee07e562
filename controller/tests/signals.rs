//! The controller binary stops cleanly on SIGTERM (what the kubelet sends to
//! stop a Pod) and SIGINT: exit status 0 within a few seconds, a shutdown line
//! in its log.
// Test helpers outside #[test] fns panic on failure on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A real process in real time: deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the controller may take to exit after the signal.
const EXIT_BOUND: Duration = Duration::from_secs(5);

/// The controller's log lines (JSON on stdout), read on a thread.
struct Log {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Log {
    fn of(child: &mut Child) -> Self {
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            lines,
            seen: Vec::new(),
        }
    }

    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// Waits (bounded) for a line containing `text`.
    async fn wait_for(&mut self, text: &str, within: Duration) {
        let t = Instant::now();
        loop {
            self.drain();
            if self.seen.iter().any(|l| l.contains(text)) {
                return;
            }
            assert!(
                t.elapsed() < within,
                "no log line with {text:?} within {within:?}:\n{}",
                self.seen.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Polls for the exit status; `None` if it has not exited within `within`.
async fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < within {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Starts the controller binary, sends `signal` once its log has a line
/// with `after`, and checks the clean stop.
async fn stops_cleanly_on(signal: Signal, after: &str) {
    let c = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    c.server
        .write_kubeconfig(&kubeconfig, "controller")
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"))
        .args(["--namespace", NS, "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = Log::of(&mut child);
    log.wait_for(after, Duration::from_secs(30)).await;

    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    kill(pid, signal).unwrap();
    let status = exit_within(&mut child, EXIT_BOUND).await;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    log.drain();
    let all = log.seen.join("\n");
    let status =
        status.unwrap_or_else(|| panic!("still running {EXIT_BOUND:?} after {signal}:\n{all}"));
    assert!(
        status.success(),
        "exit after {signal}: {status:?} (a signal is the default disposition):\n{all}"
    );
    // The reader thread may still be passing on the last lines.
    log.wait_for("shutting down", Duration::from_secs(2)).await;
    log.wait_for("kube-ovn-ipsec-controller stopped", Duration::from_secs(2))
        .await;
    assert!(
        log.seen
            .iter()
            .any(|l| l.contains("shutting down") && l.contains(signal.as_str())),
        "the shutdown line names {signal}:\n{}",
        log.seen.join("\n")
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_controller_cleanly() {
    stops_cleanly_on(Signal::SIGTERM, "kube-ovn-ipsec-controller starting").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_start_up_stops_the_controller_cleanly() {
    // The first line of start-up (a fresh cluster has no CA yet): the stop
    // is asked for before the CSR watch has listed anything.
    stops_cleanly_on(Signal::SIGTERM, "generated the IPsec CA").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_the_controller_cleanly() {
    stops_cleanly_on(Signal::SIGINT, "kube-ovn-ipsec-controller starting").await;
}
