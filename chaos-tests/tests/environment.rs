//! Faults of the agent's environment while it runs and renews (an
//! activation every 4–6 s) on the one-node cluster: the API server
//! answering 500, 503, 429 and 409 to the requests of an activation and
//! dropping its watches mid-activation; the cluster's clock jumping past
//! the renewal point and past the certificate's expiry (a machine
//! suspended and resumed: the agent, the API server and the signer read
//! one clock); the key directory's filesystem full, and the directory
//! read-only. After each, the invariants of the actor kills
//! (docs/chaos.md): guards in every dump (2), one complete generation in
//! OVSDB (1), the identity kept and no half-written file (3), ready on a
//! new generation within the bound once the fault clears (4), foreign
//! policies untouched (5), no key material (7); and a full or read-only
//! key directory is reported by name while it lasts.
//!
//! Ignored by the workspace run: scripts/test.sh runs it in the chaos
//! section.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::faults::Rule;
use chaos::inject::Injector;
use chaos::plan::Point;
use chaos::report::{Row, print_run};
use common::{
    FOREIGN, GuardSampler, InProcessAgent, Logs, after_fault, generation, install_foreign,
    policies, read_state, status, wait_ready,
};
use harness::cluster::Cluster;
use kube_ovn_ipsec_runtime::agent::Seams;

/// The signer's certificate lifetime: a renewal every 4–6 s.
const LIFETIME: Duration = Duration::from_secs(10);
/// How long a fault may take to be met (the next renewal).
const REACH: Duration = Duration::from_secs(30);
/// Invariant 4's bound once the fault clears: the identity's retry
/// backoff (up to 30 s) plus an activation.
const RECOVERY_BOUND: Duration = Duration::from_secs(45);
/// The key directory's filesystem (a tmpfs of this size, so it can fill).
const KEY_FS_SIZE: &str = "4m";

/// One environment fault.
#[derive(Debug, Clone)]
enum Fault {
    /// The API server answers `code` to the next `times` requests that
    /// match `verb` on `resource`; with `drop`, every open watch is
    /// dropped too (a long-lived watch is only asked for again then).
    Api {
        verb: &'static str,
        resource: &'static str,
        code: u16,
        times: usize,
        drop: bool,
    },
    /// Every open watch is dropped while an activation waits for its
    /// certificate.
    DropWatches,
    /// The clock jumps forward by this many seconds.
    Clock(i64),
    /// The key directory's filesystem is full until the agent reports it.
    KeyDirFull,
    /// The key directory is read-only until the agent reports it: a bind
    /// mount of the directory over itself, remounted read-only. (The
    /// filesystem itself cannot be remounted so: the agent holds its lock
    /// file open for writing, and the kernel refuses a read-only remount
    /// of a mount with writers. The lock stays open on the mount below;
    /// every write through the path fails with EROFS.)
    KeyDirReadOnly,
}

impl Fault {
    fn name(&self) -> String {
        match self {
            Fault::Api {
                verb,
                resource,
                code,
                times,
                drop,
            } => format!(
                "API {code} ×{times} on {verb} {resource}{}",
                if *drop { ", watches dropped" } else { "" }
            ),
            Fault::DropWatches => "watches dropped mid-activation".into(),
            Fault::Clock(s) => format!("clock +{s} s"),
            Fault::KeyDirFull => "key directory full (ENOSPC)".into(),
            Fault::KeyDirReadOnly => "key directory read-only (EROFS)".into(),
        }
    }
}

fn faults() -> Vec<Fault> {
    let api = |verb, resource, code, times| Fault::Api {
        verb,
        resource,
        code,
        times,
        drop: false,
    };
    let dropped = |verb, resource, code, times| Fault::Api {
        verb,
        resource,
        code,
        times,
        drop: true,
    };
    let csrs = "certificatesigningrequests";
    let lifetime = LIFETIME.as_secs() as i64;
    vec![
        api("create", csrs, 500, 3),
        api("create", csrs, 503, 3),
        api("create", csrs, 429, 3),
        api("create", csrs, 409, 2),
        api("watch", csrs, 500, 3),
        api("list", csrs, 503, 3),
        // The trust bundle's watch, asked for again after a drop.
        dropped("watch", "configmaps", 500, 3),
        dropped("watch", "configmaps", 429, 3),
        Fault::DropWatches,
        // Past the renewal point (40–60 % of the lifetime), before expiry.
        Fault::Clock(lifetime * 7 / 10),
        // Past the expiry: the node slept through it.
        Fault::Clock(lifetime + 5),
        Fault::KeyDirFull,
        Fault::KeyDirReadOnly,
    ]
}

/// Runs `program` with `args`; a failure fails the test, naming it.
fn run(program: &str, args: &[&std::ffi::OsStr]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
}

/// A tmpfs of [`KEY_FS_SIZE`] at `at`, unmounted on drop.
struct KeyFs(PathBuf);

impl KeyFs {
    fn mount(at: &Path) -> KeyFs {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={KEY_FS_SIZE},mode=0700"))
            .arg("koi-chaos-keys")
            .arg(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount tmpfs: {out:?}");
        KeyFs(at.to_path_buf())
    }

    /// Fills the filesystem (a file beside the key directory).
    fn fill(&self) {
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.flush();
    }

    fn free(&self) {
        let _ = std::fs::remove_file(self.0.join("filler"));
    }
}

impl Drop for KeyFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

struct Node {
    // Field order is drop order: the mount goes before the directory that
    // holds it.
    keyfs: KeyFs,
    cluster: Cluster,
    key_dir: PathBuf,
    port: u16,
    injector: Arc<Injector>,
    agent: InProcessAgent,
    baseline: BTreeSet<String>,
}

impl Node {
    async fn start() -> Node {
        let cluster = Cluster::start(LIFETIME).await;
        install_foreign(cluster.netns.name());
        let keyfs = KeyFs::mount(&cluster.dir.path().join("keyfs"));
        let key_dir = keyfs.0.join("keys");
        let port = Cluster::free_port();
        let injector = Injector::new(Duration::from_millis(300));
        let inj = injector.clone();
        let agent = InProcessAgent::start(
            &cluster,
            &key_dir,
            port,
            Seams {
                wrap: Some(Box::new(move |a| inj.wrap(a))),
                // The agent reads the cluster's clock: a jump moves the
                // whole machine's time.
                clock: Some(cluster.clock.clone()),
                ..Seams::default()
            },
        )
        .await;
        let mut n = Node {
            keyfs,
            cluster,
            key_dir,
            port,
            injector,
            agent,
            baseline: BTreeSet::new(),
        };
        wait_ready(n.port, Duration::from_secs(60), 1)
            .await
            .unwrap();
        n.baseline = policies(n.cluster.netns.name());
        assert!(n.baseline.iter().any(|p| !p.starts_with(FOREIGN)));
        n
    }

    /// When `/status` says ready on a certificate that has expired by the
    /// cluster's clock: what it says.
    async fn expired(&self) -> Option<String> {
        use kube_ovn_ipsec_api::clock::Clock as _;
        let (ready, s) = status(self.port).await?;
        let expires = s["expires"].as_str()?;
        let at: kube_ovn_ipsec_api::time::Timestamp =
            serde_json::from_value(s["expires"].clone()).ok()?;
        let now = kube_ovn_ipsec_api::clock::unix_seconds(self.cluster.clock.now());
        (ready && at.unix() <= now).then(|| format!("expires {expires}, now {now}"))
    }

    /// Applies `fault` and waits until it was met; a violation if it never
    /// was. Returns when the fault has cleared.
    async fn apply(&self, fault: &Fault, violations: &mut Vec<String>) {
        match fault {
            Fault::Api {
                verb,
                resource,
                code,
                times,
                drop,
            } => {
                self.cluster.faults.fail(Rule {
                    verb: Some((*verb).into()),
                    resource: Some((*resource).into()),
                    code: *code,
                    times: *times,
                });
                if *drop {
                    self.cluster.faults.drop_watches();
                }
                let deadline = Instant::now() + REACH;
                while self.cluster.faults.pending() > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let left = self.cluster.faults.pending();
                if left > 0 {
                    self.cluster.faults.clear();
                    violations.push(format!(
                        "0: {left} of {times} faulted answers not asked for within {REACH:?}"
                    ));
                }
            }
            Fault::DropWatches => {
                let hit = self.injector.arm(Point::CsrCreated);
                match tokio::time::timeout(REACH, hit).await {
                    Ok(Ok(_)) => self.cluster.faults.drop_watches(),
                    _ => {
                        self.injector.disarm();
                        violations.push(format!("0: no CSR created within {REACH:?}"));
                    }
                }
            }
            Fault::Clock(secs) => self.cluster.clock.jump(*secs),
            Fault::KeyDirFull => {
                self.keyfs.fill();
                self.until_reason("KeyDirFull", violations).await;
                // While it lasts nothing valid may be lost.
                let state = read_state(&self.key_dir);
                if state.active.is_none() {
                    violations.push("3: no active identity while the disk is full".into());
                }
                self.keyfs.free();
            }
            Fault::KeyDirReadOnly => {
                let dir = self.key_dir.as_os_str();
                run("mount", &["--bind".as_ref(), dir, dir]);
                run("mount", &["-o".as_ref(), "remount,bind,ro".as_ref(), dir]);
                self.until_reason("KeyDirReadOnly", violations).await;
                if read_state(&self.key_dir).active.is_none() {
                    violations
                        .push("3: no active identity while the directory is read-only".into());
                }
                run("umount", &[dir]);
            }
        }
    }

    /// Waits for `/status` to give `reason`; a violation if it never does
    /// within [`REACH`].
    async fn until_reason(&self, reason: &str, violations: &mut Vec<String>) {
        let deadline = Instant::now() + REACH;
        while Instant::now() < deadline {
            if let Some((_, s)) = status(self.port).await
                && s["reason"] == reason
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        violations.push(format!(
            "0: the fault was not reported (reason {reason}) within {REACH:?}"
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn api_faults_clock_jumps_and_a_full_disk_keep_every_invariant() {
    harness::use_agent_binary!();
    for p in ["mount", "umount"] {
        testbed::require_program(p).unwrap();
    }
    let logs = Logs::default();
    logs.install();
    let mut from = 0;
    let t0 = Instant::now();
    let node = Node::start().await;
    let mut rows = Vec::new();
    for (i, fault) in faults().into_iter().enumerate() {
        let mut violations = Vec::new();
        let before = read_state(&node.key_dir).active.map(|a| a.generation);
        let gen_before = generation(node.port).await;
        let ns = node.cluster.netns.name().to_string();
        let sampler = GuardSampler::start(&ns, node.baseline.clone());
        let at = Instant::now();
        node.apply(&fault, &mut violations).await;
        let recovery = match wait_ready(node.port, RECOVERY_BOUND, gen_before + 1).await {
            Ok(_) => Some(at.elapsed()),
            Err(e) => {
                violations.push(format!("4: {e}"));
                None
            }
        };
        // Ready means a valid identity by the cluster's (jumped) clock.
        if recovery.is_some()
            && let Some(e) = node.expired().await
        {
            violations.push(format!("4: ready on an expired certificate: {e}"));
        }
        violations.extend(sampler.finish().await);
        let text = logs.since(&mut from);
        violations.extend(
            after_fault(
                &|| node.cluster.other_config(),
                &ns,
                &node.key_dir,
                node.port,
                before,
                &node.baseline,
                &text,
            )
            .await,
        );
        let row = Row {
            index: i,
            point: fault.name(),
            victim: "environment".into(),
            seed: 0,
            node: 0,
            recovery,
            violations,
        };
        eprintln!("{}", row.progress());
        rows.push(row);
    }
    let (report, failed) = print_run(0, &rows, "faults", t0.elapsed());
    node.agent.stop().await;
    assert_eq!(
        failed,
        0,
        "{failed} of {} faults violated an invariant:\n{report}",
        rows.len()
    );
}
