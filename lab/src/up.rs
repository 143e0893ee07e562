//! `kube-ovn-ipsec-lab up` on the host: one lab at a time (the lock in
//! [`RUN_DIR`]), the kernel chosen and named once, the run itself — here
//! when this kernel has ESP, GENEVE and openvswitch, otherwise in the
//! testbed's Debian guest under qemu, where the lab re-runs itself with
//! `up --in-guest` and its progress and status lines come back on the
//! console — and the live status in `RUN_DIR/status.json` for `status`.

// The lab drives real processes in real time, from its own thread.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_ovn_ipsec_api::rekeying::{Rekeying, RekeyingError};
use testbed::guest::{GuestKernel, HostFeatures, KERNEL_ENV, KernelChoice, run_in_guest_sharing};

use crate::lifecycle::{self, Options, Report};
use crate::state::{LabLock, LabState, Process, RUN_DIR};
use crate::summary::Summary;
use harness::control_plane::Binaries;

/// The live status of the running (or last) lab.
pub const STATUS_FILE: &str = "status.json";

/// How long a guest run may take before it is killed.
const GUEST_TIMEOUT: Duration = Duration::from_secs(1800);

/// The lab's IKE_SA lifetime (`--ike-lifetime`), seconds: each IKE_SA
/// rekeyed 136–158 s after it was set up, so at least once per pair between
/// `Enabled` and the disable.
pub const DEFAULT_IKE_LIFETIME: u64 = 180;

/// The lab's CHILD_SA lifetime (`--child-lifetime`), seconds: each CHILD_SA
/// rekeyed every 46–68 s.
pub const DEFAULT_CHILD_LIFETIME: u64 = 90;

/// The agents' rekeying in the lab: the given lifetimes, a margin of a
/// quarter of the shorter one and strongSwan's 100 % fuzz (strongSwan has
/// one margin for both kinds of SA): every SA is rekeyed one to two
/// margins before its lifetime ends.
pub fn lab_rekeying(ike_lifetime: u64, child_lifetime: u64) -> Result<Rekeying, RekeyingError> {
    Rekeying::new(
        Duration::from_secs(ike_lifetime),
        Duration::from_secs(child_lifetime),
        Duration::from_secs(ike_lifetime.min(child_lifetime) / 4),
        100,
    )
}

/// What `up` was asked for.
#[derive(Debug, Clone)]
pub struct UpArgs {
    /// Simulated nodes.
    pub nodes: usize,
    /// The agents' certificate lifetime, seconds (`None`: the kernel's
    /// default, [`default_lifetime`]).
    pub certificate_lifetime: Option<u32>,
    /// The probe streams' interval.
    pub probe_interval: Duration,
    /// The agents' lifetimes and rekey timing ([`lab_rekeying`]).
    pub rekeying: Rekeying,
    /// Progress lines to stderr (stdout carries JSON).
    pub json: bool,
    /// Keep the logs of a run that passed too (a failed run's always
    /// stay); `down` or the next `up` removes them.
    pub keep_logs: bool,
    /// A patched ovn-controller binary to run on every node (`None`: the
    /// emulation).
    pub ovn_controller: Option<PathBuf>,
}

/// Why `up` could not run the lifecycle at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpError {
    /// Another lab runs, or the run directory is unusable.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The guest kernel.
    #[error(transparent)]
    Guest(#[from] testbed::guest::GuestError),
    /// The project's binaries.
    #[error(transparent)]
    Cluster(#[from] harness::control_plane::ClusterError),
    /// A file of the lab.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The guest run ended without a summary.
    #[error("the lab in the guest ended without a summary (exit {0}); its output is above")]
    NoSummary(i32),
}

/// The certificate lifetime the lab asks for when not told: the
/// renewal point is 40–60 % of the validity, which starts 5 minutes
/// before the signing, so 600 s renews 60–240 s after issue — after
/// `Enabled` on a real kernel (seconds), but not always under qemu's TCG,
/// where `Enabled` comes ~100 s after issue; 780 s renews 132–348 s after.
pub fn default_lifetime(choice: KernelChoice) -> u32 {
    match choice {
        KernelChoice::Host => 600,
        KernelChoice::Vm { .. } => 780,
    }
}

/// Progress to the terminal, status to [`STATUS_FILE`].
struct HostReport {
    json: bool,
    run_dir: PathBuf,
}

impl Report for HostReport {
    fn line(&mut self, line: &str) {
        if self.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }

    fn status(&mut self, summary: &Summary) {
        write_status(&self.run_dir, summary);
    }
}

/// Progress and status as console lines (inside the guest).
struct ConsoleReport;

impl Report for ConsoleReport {
    fn line(&mut self, line: &str) {
        println!("{line}");
    }

    fn status(&mut self, summary: &Summary) {
        println!("{}", summary.status_line());
    }
}

fn write_status(run_dir: &Path, summary: &Summary) {
    let tmp = run_dir.join("status.json.tmp");
    if std::fs::write(&tmp, summary.to_json()).is_ok() {
        let _ = std::fs::rename(&tmp, run_dir.join(STATUS_FILE));
    }
}

fn seconds_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Runs the lab on the host: takes the lock, runs the lifecycle on the
/// right kernel, returns the summary (the caller prints it and chooses
/// the exit code).
pub async fn up(args: &UpArgs) -> Result<Summary, UpError> {
    let run_dir = PathBuf::from(RUN_DIR);
    let choice = KernelChoice::decide()?;
    let dir = tempfile::Builder::new()
        .prefix("koi-lab-")
        .tempdir()
        .map_err(|source| UpError::Io {
            what: "creating the lab's directory",
            source,
        })?
        .keep();
    let process = Process::current().ok_or_else(|| UpError::Io {
        what: "reading this process from /proc",
        source: std::io::Error::other("no /proc entry"),
    })?;
    let mut state = LabState {
        process,
        started: seconds_since_epoch(),
        kernel: match choice {
            KernelChoice::Host => "host".into(),
            KernelChoice::Vm { kvm } => format!("guest ({})", if kvm { "kvm" } else { "tcg" }),
        },
        guest: None,
        dirs: vec![dir.clone()],
    };
    let previous = crate::state::read_state(&run_dir).ok().flatten();
    let lock = match LabLock::acquire(&run_dir, &state) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e.into());
        }
    };
    let _ = std::fs::remove_file(run_dir.join(STATUS_FILE));
    // A previous run that failed (or crashed) left its directories named in
    // its state; it is not running (the lock is ours), so they go now —
    // those the lab made, as `down` would.
    if let Some(previous) = &previous {
        let _ = crate::state::remove_lab_dirs(&previous.dirs);
    }
    let outcome = run_on(choice, args, &dir, &run_dir, &lock, &mut state).await;
    let failed = !matches!(&outcome, Ok(s) if s.failed.is_none());
    if failed || args.keep_logs {
        // The logs of a failed run stay for the operator; the state names
        // them, so `down` (or the next `up`) removes them.
        let _ = lock.record(&state);
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(run_dir.join("state.json"));
    }
    drop(lock);
    let summary = outcome?;
    write_status(&run_dir, &summary);
    Ok(summary)
}

/// The run itself, on `choice`'s kernel.
async fn run_on(
    choice: KernelChoice,
    args: &UpArgs,
    dir: &Path,
    run_dir: &Path,
    lock: &LabLock,
    state: &mut LabState,
) -> Result<Summary, UpError> {
    let bins = Binaries::beside_current_exe()?;
    let mut report = HostReport {
        json: args.json,
        run_dir: run_dir.to_path_buf(),
    };
    report.line(&format!(
        "kube-ovn-ipsec-lab: {} nodes; logs in {}",
        args.nodes,
        dir.display()
    ));
    let summary = match choice {
        KernelChoice::Host => {
            let opts = Options {
                nodes: args.nodes,
                certificate_lifetime: args
                    .certificate_lifetime
                    .unwrap_or(default_lifetime(choice)),
                probe_interval: args.probe_interval,
                rekeying: args.rekeying,
                kernel: "this host's kernel (it has ESP, GENEVE and the OVS kernel datapath)"
                    .into(),
                dir: dir.to_path_buf(),
                logs: dir.to_path_buf(),
                ovn_controller: args.ovn_controller.clone(),
            };
            lifecycle::run(&opts, &bins, &mut report).await
        }
        KernelChoice::Vm { kvm } => {
            let features = HostFeatures::probe();
            let kernel = GuestKernel::prepare(&GuestKernel::cache_dir())?;
            let desc = format!(
                "Debian's {} under qemu ({}): this host's kernel lacks {}",
                kernel.release,
                if kvm { "kvm" } else { "tcg" },
                [
                    (!features.esp).then_some("ESP"),
                    (!features.geneve).then_some("GENEVE"),
                    (!features.openvswitch).then_some("openvswitch"),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            );
            let exe = std::env::current_exe().map_err(|source| UpError::Io {
                what: "locating this executable",
                source,
            })?;
            let command: Vec<String> = vec![
                exe.display().to_string(),
                "up".into(),
                "--in-guest".into(),
                "--kernel-description".into(),
                desc,
                "--dir".into(),
                dir.display().to_string(),
                "--nodes".into(),
                args.nodes.to_string(),
                "--certificate-lifetime".into(),
                args.certificate_lifetime
                    .unwrap_or(default_lifetime(choice))
                    .to_string(),
                "--probe-interval-ms".into(),
                args.probe_interval.as_millis().to_string(),
                "--ike-lifetime".into(),
                args.rekeying.ike_lifetime().as_secs().to_string(),
                "--child-lifetime".into(),
                args.rekeying.child_lifetime().as_secs().to_string(),
            ];
            let mut command = command;
            if let Some(binary) = &args.ovn_controller {
                command.push("--ovn-controller".into());
                command.push(binary.display().to_string());
            }
            let env = vec![
                (KERNEL_ENV.to_string(), "host".to_string()),
                ("RUST_LOG".to_string(), "warn".to_string()),
            ];
            // The guest is qemu, this process's child: recorded so `down`
            // stops it even after this process was killed.
            let me = std::process::id();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let recorder = std::thread::spawn(move || {
                for _ in 0..600 {
                    if let Some(pid) = child_named(me, "qemu") {
                        return Process::of(pid);
                    }
                    if stop_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                        return None;
                    }
                }
                None
            });
            let cwd = dir.to_path_buf();
            let json = args.json;
            let relay_dir = run_dir.to_path_buf();
            let guest = tokio::task::spawn_blocking(move || {
                let mut out = Relay {
                    json,
                    run_dir: relay_dir,
                    last: None,
                    partial: Vec::new(),
                };
                // The lab's directory is shared writable: the nodes' logs
                // written in the guest stay on the host.
                let r = run_in_guest_sharing(
                    &kernel,
                    kvm,
                    &cwd,
                    &command,
                    &env,
                    &[&cwd],
                    GUEST_TIMEOUT,
                    &mut out,
                );
                (r, out.last)
            });
            // Record qemu as soon as it is seen.
            let recorded = tokio::task::spawn_blocking(move || recorder.join().ok().flatten());
            if let Ok(Some(p)) = recorded.await {
                state.guest = Some(p);
                // qemu's work directory (its initramfs) is removed by the
                // guest run when it ends; recorded, `down` removes it after
                // a SIGKILL of this process too.
                state.dirs.extend(guest_work_dir(p.pid));
                lock.record(state)?;
            }
            let (r, last) = guest.await.map_err(|e| UpError::Io {
                what: "the guest's relay",
                source: std::io::Error::other(e.to_string()),
            })?;
            let _ = stop_tx.send(());
            let run = r?;
            match last {
                Some(s) => s,
                None => return Err(UpError::NoSummary(run.status)),
            }
        }
    };
    Ok(summary)
}

/// Runs the lifecycle here, reporting on the console: `up --in-guest`.
///
/// The run's own directory is the guest's (sockets cannot live on the 9p
/// share); its logs are copied into `share`, the host's lab directory, at
/// the end.
pub async fn in_guest(args: &UpArgs, kernel: String, share: PathBuf) -> Summary {
    let dir = std::env::temp_dir().join("koi-lab-guest");
    let _ = std::fs::create_dir_all(&dir);
    let opts = Options {
        nodes: args.nodes,
        certificate_lifetime: args
            .certificate_lifetime
            .unwrap_or(default_lifetime(KernelChoice::Host)),
        probe_interval: args.probe_interval,
        rekeying: args.rekeying,
        kernel,
        dir: dir.clone(),
        logs: share.clone(),
        ovn_controller: args.ovn_controller.clone(),
    };
    let mut report = ConsoleReport;
    let bins = match Binaries::beside_current_exe() {
        Ok(b) => b,
        Err(e) => {
            let s = Summary {
                failed: Some(crate::summary::Failure {
                    step: "binaries".into(),
                    reason: e.to_string(),
                }),
                ..Summary::default()
            };
            report.status(&s);
            return s;
        }
    };
    let summary = lifecycle::run(&opts, &bins, &mut report).await;
    copy_logs(&dir, &share);
    summary
}

/// The work directory of the guest run whose qemu is `pid`: the parent of
/// its `-initrd`, when that is one of `testbed::guest`'s `koi-guest-`
/// directories.
fn guest_work_dir(pid: u32) -> Option<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    args.find(|a| *a == b"-initrd")?;
    let initrd = PathBuf::from(String::from_utf8_lossy(args.next()?).into_owned());
    let work = initrd.parent()?;
    work.file_name()?
        .to_str()?
        .starts_with("koi-guest-")
        .then(|| work.to_path_buf())
}

/// Copies the logs under `from` (`*.log`, `*.out`, `*.txt`; never keys,
/// tokens or sockets) to the same places under `to`.
fn copy_logs(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for e in entries.flatten() {
        let (path, target) = (e.path(), to.join(e.file_name()));
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() && e.file_name() != "keys" {
            let _ = std::fs::create_dir_all(&target);
            copy_logs(&path, &target);
        } else if kind.is_file()
            && path
                .extension()
                .is_some_and(|x| x == "log" || x == "out" || x == "txt")
        {
            let _ = std::fs::copy(&path, &target);
        }
    }
}

/// The guest's console: status lines become the status file (and the
/// last summary), the rest is printed.
struct Relay {
    json: bool,
    run_dir: PathBuf,
    last: Option<Summary>,
    partial: Vec<u8>,
}

impl Write for Relay {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.partial.extend_from_slice(buf);
        while let Some(at) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=at).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end();
            match Summary::from_status_line(line) {
                Some(Ok(s)) => {
                    write_status(&self.run_dir, &s);
                    self.last = Some(s);
                }
                Some(Err(e)) => eprintln!("kube-ovn-ipsec-lab: a damaged status line: {e}"),
                // strongSwan's starter logs to the guest's console when no
                // syslog runs there; the nodes' own files have it.
                None if line.is_empty() || line.contains("ipsec_starter[") => {}
                None if self.json => eprintln!("{line}"),
                None => println!("{line}"),
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A child of `parent` whose command name starts with `prefix`.
fn child_named(parent: u32, prefix: &str) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some((head, rest))) = (stat.find('('), stat.rsplit_once(')')) else {
            continue;
        };
        let comm = &head[open + 1..];
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(parent) && comm.starts_with(prefix) {
            return Some(pid);
        }
    }
    None
}
