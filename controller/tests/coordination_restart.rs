//! Restart safety of the enable coordinator, with the controller run as the
//! real binary (authenticating with its ServiceAccount's token, RBAC on)
//! and killed with SIGKILL — no clean stop, no last write — against the
//! embedded API server and real OVN NB/SB with ovn-northd. The nodes are
//! the shared in-test responders (`common::coordination`) publishing real
//! signed receipts.
//!
//! - killed at every boundary of the enable (each record write, the NB
//!   flip) and once in the middle of a barrier, a restarted controller
//!   resumes from the stored record: Prepare → Arm → Enabled with no phase
//!   skipped or repeated, epochs only growing, `NB_Global.ipsec` turning
//!   true exactly once and never while the record is `Prepare`;
//! - killed at every boundary of the disable (each record write, NB turned
//!   off, the hold for the cleanup shape, mid-`Release` with one release
//!   receipt missing), a restarted controller resumes: `Disabling →
//!   Cleanup → Release → Disabled` with no phase skipped or repeated, one
//!   challenge throughout (the disable never restarts), `NB_Global.ipsec`
//!   turned off exactly once and never on again;
//! - two replicas at once: one holds the Lease, only it writes, the other
//!   follows; killed, the leader is replaced by the other, which takes the
//!   cohort over as it stands (`Enabled`, same epoch) without re-running a
//!   barrier.
//!
//! Each restart here reuses the killed replica's Pod name: what a container
//! restart in the same Pod looks like (an OOM kill, a failed liveness
//! probe), the common way a controller dies mid-enable. The new process
//! renews its own Lease at once instead of waiting it out, so the test
//! exercises resumption from the record at every boundary without paying
//! the Lease duration five times; the takeover by another replica after
//! the Lease expires is the second test's (and coordination_enable's).

// Helpers outside #[test] functions panic too: a panic is the test's failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Real processes against real daemons in real time: deadlines are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::controller_cluster as common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::coordination::*;
use common::*;
use kube::Client;
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::ovs::OvnCentral;

use CoordinationPhase::{Arm, Cleanup, Disabled, Disabling, Enabled, Prepare, Release};

/// How often the test looks at the record, NB and the Lease: well under
/// the 1 s pass period, so no boundary goes by unseen.
const POLL: Duration = Duration::from_millis(50);

/// The enable's phases in the order they must be written.
const ORDER: [CoordinationPhase; 3] = [Prepare, Arm, Enabled];

/// The disable's phases in the order they must be written.
const DISABLE_ORDER: [CoordinationPhase; 4] = [Disabling, Cleanup, Release, Disabled];

/// Where `phase` stands in an enable followed by a disable.
fn rank(phase: CoordinationPhase) -> usize {
    ORDER
        .iter()
        .chain(&DISABLE_ORDER)
        .position(|p| *p == phase)
        .unwrap_or_else(|| panic!("no rank for {phase}"))
}

/// The cluster, OVN, a kubeconfig with the controller's own token, the
/// nodes' identities and their responders.
struct Run {
    c: Cluster,
    central: OvnCentral,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    ids: Vec<Identity>,
    responders: Vec<tokio::task::JoinHandle<()>>,
    /// Numbers the processes' log files (a restart reuses the name).
    started: usize,
}

/// One run of the controller binary as replica `name`. Its log (JSON
/// lines) goes to a file so it outlives the process: the assertions read
/// what every process, killed or not, did.
struct Replica {
    name: String,
    child: Child,
    log: PathBuf,
    started: SystemTime,
    alive: bool,
}

impl Run {
    /// `nodes` nodes with identities issued by a first controller run with
    /// the coordinator off (signing only, as before an operator turns
    /// IPsec on), and a responder for each node but `held`.
    async fn start(nodes: usize, held: Option<usize>) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let central = OvnCentral::start(dir.path()).unwrap();
        let c = Cluster::start(nodes).await;
        let kubeconfig = dir.path().join("controller.kubeconfig");
        c.server
            .write_kubeconfig(&kubeconfig, "controller")
            .unwrap();
        let mut run = Run {
            c,
            central,
            dir,
            kubeconfig,
            ids: Vec::new(),
            responders: Vec::new(),
            started: 0,
        };
        let mut signer = run.replica("signer", &[]);
        for n in 0..nodes {
            let id = identity(&run.c, n).await;
            run.ids.push(id);
        }
        signer.sigkill().await;
        for n in (0..nodes).filter(|n| Some(*n) != held) {
            let h = responder(&run.c, n, &run.ids[n]);
            run.responders.push(h);
        }
        run
    }

    /// Starts the binary as replica `name` with `extra` flags.
    fn replica(&mut self, name: &str, extra: &[&str]) -> Replica {
        self.started += 1;
        let log = self
            .dir
            .path()
            .join(format!("{:02}-{name}.log", self.started));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kube-ovn-ipsec-controller"))
            .args(["--namespace", NS, "--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .env("KUBECONFIG", &self.kubeconfig)
            // The follower's "following" lines are debug: the second test
            // reads them.
            .env("RUST_LOG", "info,controller::coordination=debug")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Replica {
            name: name.to_owned(),
            child,
            log,
            started: SystemTime::now(),
            alive: true,
        }
    }

    /// [`Self::replica`] with the coordinator on, enable wanted.
    fn coordinator(&mut self, name: &str) -> Replica {
        self.coordinator_wanting(name, true)
    }

    /// [`Self::replica`] with the coordinator on and the intent `enable`.
    fn coordinator_wanting(&mut self, name: &str, enable: bool) -> Replica {
        let (nb, sb) = (self.central.nb.address(), self.central.sb.address());
        self.replica(name, &flags_wanting(enable, &nb, &sb, name))
    }

    async fn stop(self) {
        for h in self.responders {
            h.abort();
        }
        self.c.stop().await;
    }
}

impl Replica {
    /// SIGKILL, then reaps the process: once this returns it makes no
    /// further request.
    async fn sigkill(&mut self) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        kill(pid, Signal::SIGKILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{} survived SIGKILL", self.name);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.alive = false;
    }

    /// The `fields` of each log line whose message is `message`.
    fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["fields"]["message"] == message)
            .map(|l| l["fields"].clone())
            .collect()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.alive {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A failing test says what each process was doing.
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            eprintln!("--- {} ({:?}):\n{}", self.name, self.log, tail.join("\n"));
        }
    }
}

/// Counts, over every process's log, the record writes to each phase and
/// the times `NB_Global.ipsec` was set.
fn writes(replicas: &[Replica]) -> (Vec<String>, usize) {
    let mut to = Vec::new();
    let mut nb_sets = 0;
    for r in replicas {
        to.extend(
            r.logged("coordination")
                .iter()
                .map(|f| f["to"].as_str().unwrap_or_default().to_owned()),
        );
        nb_sets += r.logged("setting NB_Global.ipsec").len();
    }
    (to, nb_sets)
}

/// When the Lease was last renewed (every election round of its holder
/// renews it: a round is followed by that replica's pass).
fn renewed(spec: &k8s_openapi::api::coordination::v1::LeaseSpec) -> Option<SystemTime> {
    spec.renew_time.as_ref().map(|t| SystemTime::from(t.0))
}

/// What the NB poller saw.
#[derive(Debug, Default)]
struct NbTrail {
    reads: u64,
    /// false → true transitions.
    ups: u32,
    /// true → false transitions.
    downs: u32,
    /// Reads of true while the record (read after NB) was `Prepare` or
    /// absent, with what the record was.
    early: Vec<String>,
}

/// Reads `NB_Global.ipsec` every [`POLL`], then the record, until `stop`
/// is set. Reading NB first makes a true read against a `Prepare` record a
/// proof: the record was at most `Prepare` when NB already read true.
fn watch_nb(
    central: &OvnCentral,
    admin: &Client,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<NbTrail>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, address, admin) = (stop.clone(), central.nb.address(), admin.clone());
    let task = tokio::spawn(async move {
        let nb = ovsdb::Client::connect_str(&address).await.unwrap();
        let mut trail = NbTrail::default();
        let mut last = false;
        while !flag.load(Ordering::SeqCst) {
            let on = nb.read_nb_ipsec().await.unwrap();
            let phase = record(&admin).await.map(|r| r.phase);
            trail.reads += 1;
            match (last, on) {
                (false, true) => trail.ups += 1,
                (true, false) => trail.downs += 1,
                _ => {}
            }
            if on && matches!(phase, None | Some(Prepare)) {
                trail.early.push(format!("{phase:?}"));
            }
            last = on;
            tokio::time::sleep(POLL).await;
        }
        nb.close();
        trail
    });
    (stop, task)
}

/// The points at which the first test kills the controller, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Boundary {
    /// The record reads `Prepare`.
    PrepareWritten,
    /// `Prepare` with two of three receipts in, the third node held, and
    /// the current process has finished a pass on it.
    MidPrepareBarrier,
    /// The record reads `Arm`.
    ArmWritten,
    /// NB reads true while the record is `Arm`: set, not yet confirmed.
    NbOnWhileArm,
    /// The record reads `Enabled`.
    EnabledWritten,
    /// The record reads `Disabling` (NB may still be on).
    DisablingWritten,
    /// NB reads false while the record is `Disabling`: set, not yet
    /// confirmed.
    NbOffWhileDisabling,
    /// `Disabling` with NB and SB off, the current process holding for the
    /// DaemonSet's cleanup shape (its status says so).
    HoldingForCleanupShape,
    /// The record reads `Cleanup`.
    CleanupWritten,
    /// The record reads `Release`.
    ReleaseWritten,
    /// `Release` with two of three release receipts verified, the third
    /// node's missing, and the current process has finished a pass on it.
    MidRelease,
    /// The record reads `Disabled`.
    DisabledWritten,
}

impl Boundary {
    /// The phase the record has at this boundary.
    fn phase(self) -> CoordinationPhase {
        match self {
            Boundary::PrepareWritten | Boundary::MidPrepareBarrier => Prepare,
            Boundary::ArmWritten | Boundary::NbOnWhileArm => Arm,
            Boundary::EnabledWritten => Enabled,
            Boundary::DisablingWritten
            | Boundary::NbOffWhileDisabling
            | Boundary::HoldingForCleanupShape => Disabling,
            Boundary::CleanupWritten => Cleanup,
            Boundary::ReleaseWritten | Boundary::MidRelease => Release,
            Boundary::DisabledWritten => Disabled,
        }
    }
}

/// One look at the cluster.
struct Seen {
    record: Option<CoordinationRecord>,
    nb: bool,
    status: serde_json::Value,
    lease: Option<k8s_openapi::api::coordination::v1::LeaseSpec>,
}

/// Follows the record across processes: every (phase, generation, epoch)
/// it took, in order, checked on each look never to go backwards.
struct Trail {
    t0: Instant,
    nb: ovsdb::Client,
    seen: Vec<(CoordinationPhase, u64, u64)>,
}

impl Trail {
    async fn new(central: &OvnCentral) -> Trail {
        Trail {
            t0: Instant::now(),
            nb: ovsdb::Client::connect_str(&central.nb.address())
                .await
                .unwrap(),
            seen: Vec::new(),
        }
    }

    async fn look(&mut self, admin: &Client) -> Seen {
        let record = record(admin).await;
        let nb = self.nb.read_nb_ipsec().await.unwrap();
        if let Some(r) = &record {
            let now = (r.phase, r.generation, r.epoch);
            if let Some(&(phase, generation, epoch)) = self.seen.last() {
                assert!(
                    (r.generation, r.epoch) >= (generation, epoch),
                    "the record went back from {phase} {generation}/{epoch} to {now:?}"
                );
                assert!(
                    rank(r.phase) >= rank(phase),
                    "the record went back from {phase} to {}",
                    r.phase
                );
            }
            if self.seen.last() != Some(&now) {
                println!(
                    "{:>6.2?}  {} generation {} epoch {}",
                    self.t0.elapsed(),
                    r.phase,
                    r.generation,
                    r.epoch
                );
                self.seen.push(now);
            }
        }
        Seen {
            record,
            nb,
            status: status(admin).await,
            lease: lease(admin).await,
        }
    }

    /// The phases seen, each once, in order.
    fn phases(&self) -> Vec<CoordinationPhase> {
        let mut phases: Vec<_> = self.seen.iter().map(|s| s.0).collect();
        phases.dedup();
        phases
    }
}

/// Whether what `seen` shows is boundary `b`; `renewals` counts the Lease
/// renewals since the running process started.
fn at(b: Boundary, seen: &Seen, renewals: usize) -> bool {
    let Some(r) = &seen.record else { return false };
    let nodes = &seen.status["nodes"];
    match b {
        Boundary::PrepareWritten
        | Boundary::ArmWritten
        | Boundary::EnabledWritten
        | Boundary::DisablingWritten
        | Boundary::CleanupWritten
        | Boundary::ReleaseWritten
        | Boundary::DisabledWritten => r.phase == b.phase(),
        // Two rounds: the first one's pass has finished before the second.
        Boundary::MidPrepareBarrier => {
            r.phase == Prepare
                && renewals >= 2
                && nodes["node-0"] == "ok"
                && nodes["node-1"] == "ok"
                && nodes["node-2"] == "no receipt yet"
        }
        Boundary::NbOnWhileArm => r.phase == Arm && seen.nb,
        Boundary::NbOffWhileDisabling => r.phase == Disabling && !seen.nb,
        Boundary::HoldingForCleanupShape => {
            r.phase == Disabling
                && renewals >= 2
                && seen.status["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("waiting for the kube-ovn-cni DaemonSet"))
        }
        Boundary::MidRelease => {
            r.phase == Release
                && renewals >= 2
                && nodes["node-0"] == "ok"
                && nodes["node-1"] == "ok"
                && nodes["node-2"] == "no release receipt yet"
        }
    }
}

/// The record as the last process found it, once that process has led
/// three rounds without changing it.
async fn left_alone(run: &Run, trail: &mut Trail, replicas: &[Replica]) -> CoordinationRecord {
    let found = record(&run.c.admin).await.unwrap();
    let since = replicas.last().unwrap().started;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut renewals = Vec::new();
    while renewals.len() < 3 {
        let seen = trail.look(&run.c.admin).await;
        if let Some(t) = seen.lease.as_ref().and_then(renewed)
            && t > since
            && renewals.last() != Some(&t)
        {
            renewals.push(t);
        }
        assert_eq!(
            seen.record.as_ref(),
            Some(&found),
            "{} is left alone",
            found.phase
        );
        assert!(Instant::now() < deadline, "the last process did not lead");
        tokio::time::sleep(POLL).await;
    }
    found
}

/// Waits until the cluster shows `b` (rounds counted since the running
/// process started; the record may not pass `b`'s phase unseen), then
/// SIGKILLs that process and starts the next one at once, with the
/// intent `enable`.
async fn kill_at(
    run: &mut Run,
    trail: &mut Trail,
    replicas: &mut Vec<Replica>,
    b: Boundary,
    enable: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let since = replicas.last().unwrap().started;
    let mut renewals = Vec::new();
    loop {
        let seen = trail.look(&run.c.admin).await;
        if let Some(t) = seen.lease.as_ref().and_then(renewed)
            && t > since
            && renewals.last() != Some(&t)
        {
            renewals.push(t);
        }
        if at(b, &seen, renewals.len()) {
            break;
        }
        if let Some(r) = &seen.record {
            assert!(
                rank(r.phase) <= rank(b.phase()),
                "{b:?} went by unseen: the record is already {}",
                r.phase
            );
        }
        assert!(
            Instant::now() < deadline,
            "{b:?} not reached in 20 s: {:?}\nstatus: {}",
            seen.record,
            seen.status
        );
        tokio::time::sleep(POLL).await;
    }
    let at_kill = trail.t0.elapsed();
    let current = replicas.last_mut().unwrap();
    current.sigkill().await;
    let up = since.elapsed().unwrap();
    let name = current.name.clone();
    println!("{at_kill:>6.2?}  SIGKILL {name} at {b:?}, {up:.2?} after it started; new process");
    let next = run.coordinator_wanting(&name, enable);
    replicas.push(next);
}

/// SIGKILL at every boundary of the enable and once mid-barrier, each time
/// a new process at once; the cohort ends `Enabled` as if nothing had
/// happened: one write per phase, one NB flip, epochs 1, 2, 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_every_phase_boundary_resumes_and_flips_nb_once() {
    let t_setup = Instant::now();
    // node-2 holds back its receipts until the mid-barrier kill.
    let mut run = Run::start(3, Some(2)).await;
    println!("cluster, OVN and identities in {:?}", t_setup.elapsed());
    let (nb_stop, nb_task) = watch_nb(&run.central, &run.c.admin);
    let mut trail = Trail::new(&run.central).await;
    let mut replicas = vec![run.coordinator("controller-0")];
    let boundaries = [
        Boundary::PrepareWritten,
        Boundary::MidPrepareBarrier,
        Boundary::ArmWritten,
        Boundary::NbOnWhileArm,
        Boundary::EnabledWritten,
    ];
    let mut kills = Vec::new();
    for b in boundaries {
        kill_at(&mut run, &mut trail, &mut replicas, b, true).await;
        kills.push(b);
        if b == Boundary::MidPrepareBarrier {
            run.responders.push(responder(&run.c, 2, &run.ids[2]));
        }
    }
    assert_eq!(kills, boundaries, "a kill at every boundary");

    // The last process finds the cohort Enabled and leaves it so.
    let enabled = left_alone(&run, &mut trail, &replicas).await;
    nb_stop.store(true, Ordering::SeqCst);
    let nb_trail = nb_task.await.unwrap();
    println!(
        "{:>6.2?}  done: {} kills; NB read {} times: {nb_trail:?}",
        trail.t0.elapsed(),
        kills.len(),
        nb_trail.reads
    );

    assert_eq!(trail.phases(), ORDER, "phases in order, none skipped");
    assert_eq!(
        trail.seen.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>(),
        [(1, 1), (1, 2), (1, 3)],
        "one epoch per phase: resumed every time, never restarted"
    );
    assert_eq!(nb_trail.ups, 1, "NB turned true exactly once: {nb_trail:?}");
    assert_eq!(nb_trail.downs, 0, "NB never turned back: {nb_trail:?}");
    assert!(
        nb_trail.early.is_empty(),
        "NB read true while the record was {:?}",
        nb_trail.early
    );
    assert_eq!(nb_sb(&run.central).await, (true, true));
    assert_eq!(enabled.phase, Enabled);
    assert_eq!(enabled.targets.len(), 3);
    // From the processes' side: no phase written twice, NB set once, by
    // whichever process happened to be running.
    let (to, nb_sets) = writes(&replicas);
    assert_eq!(to, ["Prepare", "Arm", "Enabled"], "record writes");
    assert_eq!(nb_sets, 1, "NB_Global.ipsec set by one process, once");
    // Each restart renewed its own Lease: never a takeover.
    let spec = lease(&run.c.admin).await.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("controller-0"));
    assert_eq!(spec.lease_transitions, Some(0));
    println!("whole test {:?}", t_setup.elapsed());
    drop(replicas);
    run.stop().await;
}

/// Enabled by one process, then SIGKILL at every boundary of the disable,
/// each time a new process with the intent off at once; the cohort ends
/// `Disabled` as if nothing had happened: one write per phase, one
/// challenge (the disable never went back to `Disabling`), NB turned off
/// once and never on again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_every_disable_boundary_resumes_and_turns_nb_off_once() {
    const CLEANUP_HASH: &str = "5e0c3b8a1";
    let t_setup = Instant::now();
    let mut run = Run::start(3, None).await;
    let (nb_stop, nb_task) = watch_nb(&run.central, &run.c.admin);
    let mut trail = Trail::new(&run.central).await;
    let mut replicas = vec![run.coordinator("controller-0")];
    let deadline = Instant::now() + Duration::from_secs(30);
    while trail.look(&run.c.admin).await.record.map(|r| r.phase) != Some(Enabled) {
        assert!(Instant::now() < deadline, "not Enabled in 30 s");
        tokio::time::sleep(POLL).await;
    }
    for h in run.responders.drain(..) {
        h.abort();
    }
    // The operator's chart upgrade turns the intent off: a new process.
    replicas.last_mut().unwrap().sigkill().await;
    println!(
        "{:>6.2?}  Enabled; restarted with the intent off",
        trail.t0.elapsed()
    );
    replicas.push(run.coordinator_wanting("controller-0", false));

    let boundaries = [
        Boundary::DisablingWritten,
        Boundary::NbOffWhileDisabling,
        Boundary::HoldingForCleanupShape,
        Boundary::CleanupWritten,
        Boundary::ReleaseWritten,
        Boundary::MidRelease,
        Boundary::DisabledWritten,
    ];
    for b in boundaries {
        kill_at(&mut run, &mut trail, &mut replicas, b, false).await;
        match b {
            // The chart's cleanup shape rolls out; every init container
            // completes.
            Boundary::HoldingForCleanupShape => {
                run.c.roll_daemon_set(Shape::Cleanup, CLEANUP_HASH).await;
                for n in 0..3 {
                    run.c.set_cleanup_init(n, Some(0)).await;
                }
            }
            Boundary::ReleaseWritten => {
                for n in 0..2 {
                    publish_release(&run.c, n, &run.ids[n], |_| {}).await;
                }
            }
            Boundary::MidRelease => {
                publish_release(&run.c, 2, &run.ids[2], |_| {}).await;
            }
            _ => {}
        }
    }

    // The last process finds the cohort Disabled and leaves it so.
    let disabled = left_alone(&run, &mut trail, &replicas).await;
    nb_stop.store(true, Ordering::SeqCst);
    let nb_trail = nb_task.await.unwrap();
    println!(
        "{:>6.2?}  done: {} kills in the disable; NB read {} times: {nb_trail:?}",
        trail.t0.elapsed(),
        boundaries.len(),
        nb_trail.reads
    );
    let all: Vec<CoordinationPhase> = ORDER.iter().chain(&DISABLE_ORDER).copied().collect();
    assert_eq!(trail.phases(), all, "phases in order, none skipped");
    assert_eq!(
        trail.seen.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>(),
        [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5), (2, 6), (2, 7)],
        "one epoch per phase: resumed every time, the disable never restarted"
    );
    assert_eq!(
        nb_trail.ups, 1,
        "NB turned true once, by the enable: {nb_trail:?}"
    );
    assert_eq!(
        nb_trail.downs, 1,
        "NB turned false exactly once: {nb_trail:?}"
    );
    assert_eq!(nb_sb(&run.central).await, (false, false));
    assert_eq!(disabled.phase, Disabled);
    assert_eq!(disabled.targets.len(), 3);
    let (to, nb_sets) = writes(&replicas);
    let names: Vec<&str> = all.iter().map(|p| p.as_str()).collect();
    assert_eq!(to, names, "record writes");
    assert_eq!(nb_sets, 2, "NB_Global.ipsec set twice in all: on, then off");
    println!("whole test {:?}", t_setup.elapsed());
    drop(replicas);
    run.stop().await;
}

/// Two replicas started together: one Lease holder, only it writes (the
/// status names it, the other's log has no write), the cohort reaches
/// `Enabled`; the leader SIGKILLed, the other takes the Lease over once it
/// expires and leaves the record exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_no_double_write() {
    let t_setup = Instant::now();
    let mut run = Run::start(3, None).await;
    println!("cluster, OVN and identities in {:?}", t_setup.elapsed());
    let mut trail = Trail::new(&run.central).await;
    let mut replicas = vec![
        run.coordinator("controller-a"),
        run.coordinator("controller-b"),
    ];

    // Both live: one holder throughout, the status only ever names it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut holder: Option<String> = None;
    let mut enabled_at = None;
    let mut renewals_after = Vec::new();
    loop {
        let seen = trail.look(&run.c.admin).await;
        // The status was read before the Lease: whoever it names held the
        // Lease then, and still must.
        let spec = seen.lease.as_ref();
        let named = spec.and_then(|s| s.holder_identity.clone());
        if let Some(h) = &named {
            let first = holder.get_or_insert_with(|| h.clone());
            assert_eq!(first, h, "the Lease changed hands while both live");
        }
        if let Some(leader) = seen.status["leader"].as_str() {
            assert_eq!(
                Some(leader),
                holder.as_deref(),
                "status written by a replica not holding the Lease"
            );
        }
        if seen.record.as_ref().map(|r| r.phase) == Some(Enabled) {
            enabled_at.get_or_insert(SystemTime::now());
        }
        // Two more rounds of the leader after Enabled: time for a
        // follower's stray write to show.
        if let (Some(at), Some(t)) = (enabled_at, spec.and_then(renewed))
            && t > at
            && renewals_after.last() != Some(&t)
        {
            renewals_after.push(t);
        }
        if renewals_after.len() >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not Enabled in 30 s: {:?}\nstatus: {}",
            seen.record,
            seen.status
        );
        tokio::time::sleep(POLL).await;
    }
    let holder = holder.unwrap();
    println!("{:>6.2?}  Enabled, leader {holder}", trail.t0.elapsed());
    assert_eq!(trail.phases(), ORDER);
    let (li, fi) = if replicas[0].name == holder {
        (0, 1)
    } else {
        (1, 0)
    };
    let (leader, follower) = (&replicas[li], &replicas[fi]);
    assert_eq!(leader.name, holder);
    let (to, nb_sets) = writes(std::slice::from_ref(leader));
    assert_eq!(to, ["Prepare", "Arm", "Enabled"], "the leader's writes");
    assert_eq!(nb_sets, 1);
    assert_eq!(leader.logged("acquired the coordination lease").len(), 1);
    let (to, nb_sets) = writes(std::slice::from_ref(follower));
    assert!(to.is_empty() && nb_sets == 0, "the follower wrote {to:?}");
    assert!(
        follower
            .logged("acquired the coordination lease")
            .is_empty(),
        "both acquired"
    );
    let following = follower.logged("following the coordination leader");
    assert!(
        following
            .iter()
            .any(|f| f["holder"].as_str().is_some_and(|h| h.contains(&holder))),
        "the follower followed {holder}: {following:?}"
    );
    let before = record(&run.c.admin).await.unwrap();
    assert_eq!((before.generation, before.epoch), (1, 3));
    let transitions = lease(&run.c.admin).await.unwrap().lease_transitions;

    // The leader dies; the other waits the Lease out and takes over.
    replicas[li].sigkill().await;
    let killed = Instant::now();
    let other = replicas[fi].name.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut took_over = None;
    let mut renewals = 0;
    let mut last_renewal = None;
    loop {
        let seen = trail.look(&run.c.admin).await;
        assert_eq!(
            seen.record.as_ref(),
            Some(&before),
            "the record moved during the takeover"
        );
        assert!(seen.nb, "NB read false during the takeover");
        let spec = seen.lease.unwrap();
        if spec.holder_identity.as_deref() == Some(other.as_str()) {
            took_over.get_or_insert(killed.elapsed());
            if renewed(&spec) != last_renewal {
                last_renewal = renewed(&spec);
                renewals += 1;
            }
        }
        // Three of its rounds (three passes): long enough to re-run a
        // barrier had it wanted to, and to write its status.
        if renewals >= 3 && seen.status["leader"] == other.as_str() {
            assert_eq!(spec.lease_transitions, transitions.map(|t| t + 1));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{other} did not take over in 15 s: {spec:?}\nstatus: {}",
            seen.status
        );
        tokio::time::sleep(POLL).await;
    }
    println!(
        "{:>6.2?}  {other} took the Lease over {:.2?} after the SIGKILL (Lease 3 s)",
        trail.t0.elapsed(),
        took_over.unwrap()
    );
    let survivor = &replicas[fi];
    assert_eq!(survivor.logged("took over the coordination lease").len(), 1);
    let (to, nb_sets) = writes(std::slice::from_ref(survivor));
    assert!(to.is_empty() && nb_sets == 0, "the new leader wrote {to:?}");
    assert_eq!(record(&run.c.admin).await.unwrap(), before);
    assert_eq!(nb_sb(&run.central).await, (true, true));
    println!("1 kill; whole test {:?}", t_setup.elapsed());
    drop(replicas);
    run.stop().await;
}
