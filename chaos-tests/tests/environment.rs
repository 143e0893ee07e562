//! Faults of the agent's environment while it runs and renews (an
//! activation every 4–6 s) on the one-node cluster: the API server
//! answering 500, 503, 429 and 409 to the requests of an activation and
//! dropping its watches mid-activation; the cluster's clock jumping past
//! the renewal point and past the certificate's expiry (a machine
//! suspended and resumed: the agent, the API server and the signer read
//! one clock); the key directory's filesystem full. After each, the
//! invariants of the actor kills (docs/chaos.md): guards in every dump
//! (2), one complete generation in OVSDB (1), the identity kept and no
//! half-written file (3), ready on a new generation within the bound once
//! the fault clears (4), foreign policies untouched (5), no key material
//! (7); and a full key directory is reported by name while it lasts.
//!
//! Ignored by the workspace run: scripts/test.sh runs it in the chaos
//! section.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;
#[path = "../../runtime/tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::faults::Rule;
use chaos::inject::Injector;
use chaos::plan::Point;
use chaos::report::{Row, table};
use common::{
    FOREIGN, GuardSampler, InProcessAgent, Logs, after_fault, generation, install_foreign,
    policies, read_state, status,
};
use kube_ovn_ipsec_runtime::agent::Seams;
use support::cluster::Cluster;

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
    ]
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
        n.wait_ready(Duration::from_secs(60), 1).await.unwrap();
        n.baseline = policies(n.cluster.netns.name());
        assert!(n.baseline.iter().any(|p| !p.starts_with(FOREIGN)));
        n
    }

    async fn wait_ready(&self, bound: Duration, min: u64) -> Result<u64, String> {
        let deadline = Instant::now() + bound;
        let mut last = String::from("/status never answered");
        loop {
            if let Some((ready, s)) = status(self.port).await {
                let g = s["generation"].as_u64().unwrap_or(0);
                if ready && g >= min {
                    return Ok(g);
                }
                last = format!(
                    "ready {ready}, generation {g} (want {min}), phase {}, reason {}",
                    s["phase"], s["reason"]
                );
            }
            if Instant::now() >= deadline {
                return Err(format!("not ready within {bound:?}: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
                let deadline = Instant::now() + REACH;
                let mut reported = false;
                while Instant::now() < deadline {
                    if let Some((_, s)) = status(self.port).await
                        && s["reason"] == "KeyDirFull"
                    {
                        reported = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if !reported {
                    violations.push(format!(
                        "0: the full key directory was not reported (reason KeyDirFull) within {REACH:?}"
                    ));
                }
                // While it lasts nothing valid may be lost.
                let state = read_state(&self.key_dir);
                if state.active.is_none() {
                    violations.push("3: no active identity while the disk is full".into());
                }
                self.keyfs.free();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long: scripts/test.sh and scripts/chaos.sh run it on its own"]
async fn api_faults_clock_jumps_and_a_full_disk_keep_every_invariant() {
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
        let recovery = match node.wait_ready(RECOVERY_BOUND, gen_before + 1).await {
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
                &node.cluster,
                &ns,
                &node.key_dir,
                node.port,
                before,
                &node.baseline,
                &text,
            )
            .await,
        );
        eprintln!(
            "chaos: #{i} {}: {}",
            fault.name(),
            if violations.is_empty() {
                "pass"
            } else {
                "FAIL"
            }
        );
        rows.push(Row {
            index: i,
            point: fault.name(),
            victim: "environment".into(),
            seed: 0,
            node: 0,
            recovery,
            violations,
        });
    }
    let report = table(0, &rows);
    println!("{report}");
    println!(
        "{} faults in {:.1} s",
        rows.len(),
        t0.elapsed().as_secs_f64()
    );
    let _ = std::io::stdout().flush();
    node.agent.stop().await;
    let failed = rows.iter().filter(|r| !r.violations.is_empty()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {} faults violated an invariant:\n{report}",
        rows.len()
    );
}
