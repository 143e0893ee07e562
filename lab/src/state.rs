//! One lab at a time, and a `down` that leaves nothing behind — also after
//! the lab itself crashed.
//!
//! A running lab holds an exclusive `flock` on `<run dir>/lock` (the
//! kernel drops it when the process dies, so a crash never leaves a stale
//! lock) and describes itself in `<run dir>/state.json`: its PID, when it
//! started, which kernel runs the nodes, the guest's PID when it runs in
//! one, and the temporary directories it made. Every namespace it creates
//! carries [`NETNS_PREFIX`] (`testbed::netns` names them
//! `<prefix>-<pid>-<n>`). [`down`] stops the recorded processes, deletes
//! the lab's namespaces whose creator is gone, removes the recorded
//! directories and the state; run twice, the second finds nothing.

// `down` waits for real processes of a lab that may have crashed: a
// blocking wall-clock wait, from the command line, outside any executor.
#![allow(clippy::disallowed_methods)]

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// Where a running lab keeps its lock and state.
pub const RUN_DIR: &str = "/run/kube-ovn-ipsec-lab";
/// The prefix of every network namespace the lab creates.
pub const NETNS_PREFIX: &str = "koi-lab";
/// How long [`down`] waits for a SIGTERMed process before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A process as the state records it: a PID that another process reuses
/// after a crash is never signalled, because its start time differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Process {
    /// The PID.
    pub pid: u32,
    /// Its start, in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start: u64,
}

impl Process {
    /// Process `pid` as it runs now (`None`: gone, or a zombie).
    pub fn of(pid: u32) -> Option<Process> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command, which is in parentheses and may
        // contain anything but the last `)`: state is field 3, start 22.
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if *fields.first()? == "Z" {
            return None;
        }
        Some(Process {
            pid,
            start: fields.get(19)?.parse().ok()?,
        })
    }

    /// This process.
    pub fn current() -> Option<Process> {
        Process::of(std::process::id())
    }

    /// Whether this very process still runs.
    pub fn running(self) -> bool {
        Process::of(self.pid) == Some(self)
    }
}

/// What a running lab says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabState {
    /// The lab process.
    pub process: Process,
    /// When it started, seconds since the epoch.
    pub started: u64,
    /// Which kernel runs the nodes (`host`, or the guest's description).
    pub kernel: String,
    /// The guest's qemu process, when the nodes run in one.
    pub guest: Option<Process>,
    /// Temporary directories it made (removed by [`down`]).
    pub dirs: Vec<PathBuf>,
}

impl LabState {
    /// Decodes `state.json`, refusing what does not describe a lab.
    pub fn decode(text: &str) -> Result<Self, StateError> {
        let state: LabState =
            serde_json::from_str(text).map_err(|e| StateError::Invalid(e.to_string()))?;
        if state.process.pid == 0 || state.guest.is_some_and(|g| g.pid == 0) {
            return Err(StateError::Invalid("pid 0".into()));
        }
        if let Some(d) = state.dirs.iter().find(|d| !d.is_absolute()) {
            return Err(StateError::Invalid(format!(
                "directory {} is not absolute",
                d.display()
            )));
        }
        Ok(state)
    }

    /// Whether the recorded lab process still runs: a state whose lab is
    /// gone is what a killed run left, for [`down`] to clear.
    pub fn live(&self) -> bool {
        self.process.running()
    }

    /// `state.json`'s text.
    pub fn encode(&self) -> Result<String, StateError> {
        serde_json::to_string_pretty(self).map_err(|e| StateError::Invalid(e.to_string()))
    }
}

/// Why the lab's state could not be taken, read or cleaned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Another lab holds the lock.
    #[error(
        "a lab is already running{}: `kube-ovn-ipsec-lab status` shows it, \
         `kube-ovn-ipsec-lab down` removes it",
        .0.as_ref().map(|s| format!(" (PID {}, kernel {})", s.process.pid, s.kernel)).unwrap_or_default()
    )]
    AlreadyRunning(Option<LabState>),
    /// `state.json` does not describe a lab.
    #[error("the lab's state file is unusable: {0}")]
    Invalid(String),
    /// A file operation failed.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError + use<> {
    let path = path.to_path_buf();
    move |source| StateError::Io { what, path, source }
}

/// The running lab's hold on its run directory: the lock, released when
/// this is dropped (or the process dies).
#[derive(Debug)]
pub struct LabLock {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl LabLock {
    /// Takes the lock in `dir` (created if missing) and records `state`;
    /// refuses when another lab holds it, naming that lab.
    pub fn acquire(dir: &Path, state: &LabState) -> Result<Self, StateError> {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("opening", &path))?;
        let Ok(lock) = Flock::lock(lock, FlockArg::LockExclusiveNonblock) else {
            return Err(StateError::AlreadyRunning(read_state(dir).ok().flatten()));
        };
        let held = LabLock {
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        held.record(state)?;
        Ok(held)
    }

    /// Rewrites the state (a new directory, the guest's PID), atomically.
    pub fn record(&self, state: &LabState) -> Result<(), StateError> {
        let path = self.dir.join("state.json");
        let tmp = self.dir.join("state.json.tmp");
        let mut f = File::create(&tmp).map_err(io("writing", &tmp))?;
        f.write_all(state.encode()?.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))
    }
}

/// The recorded state in `dir`, if any.
pub fn read_state(dir: &Path) -> Result<Option<LabState>, StateError> {
    let path = dir.join("state.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => LabState::decode(&text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("reading", &path)(e)),
    }
}

/// What [`down`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DownReport {
    /// Processes stopped (the lab, its guest).
    pub stopped: Vec<u32>,
    /// Directories removed.
    pub dirs: Vec<PathBuf>,
    /// Why the state file was ignored, when it was unusable (the
    /// namespaces are still cleaned by their prefix).
    pub unusable_state: Option<String>,
}

/// Stops the lab recorded in `dir` (SIGTERM, then SIGKILL after a grace)
/// and its guest, deletes the lab's namespaces whose creator is gone,
/// removes its recorded directories and the state. Idempotent; never
/// signals the calling process.
pub fn down(dir: &Path) -> Result<DownReport, StateError> {
    let mut report = DownReport::default();
    let state = match read_state(dir) {
        Ok(s) => s,
        Err(StateError::Invalid(why)) => {
            report.unusable_state = Some(why);
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(state) = &state {
        let me = std::process::id();
        for p in [Some(state.process), state.guest].into_iter().flatten() {
            if p.pid != me && stop(p) {
                report.stopped.push(p.pid);
            }
        }
    }
    testbed::netns::cleanup_stale(NETNS_PREFIX);
    if let Some(state) = &state {
        for d in &state.dirs {
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(io("removing", d))?;
                report.dirs.push(d.clone());
            }
        }
    }
    for name in ["state.json", "state.json.tmp"] {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing", &path)(e)),
        }
    }
    Ok(report)
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`], if `p` still runs (a
/// zombie holds no lock, namespace or port); whether it did.
fn stop(p: Process) -> bool {
    let Ok(raw) = i32::try_from(p.pid) else {
        return false;
    };
    if !p.running() {
        return false;
    }
    let pid = Pid::from_raw(raw);
    if kill(pid, Signal::SIGTERM).is_err() {
        return false;
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if !p.running() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(pid, Signal::SIGKILL);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> LabState {
        LabState {
            process: Process {
                pid: 4242,
                start: 99,
            },
            started: 1_800_000_000,
            kernel: "host".into(),
            guest: None,
            dirs: vec!["/tmp/koi-lab-x".into()],
        }
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = Process::current().unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(me.running());
        assert!(
            !Process {
                start: me.start + 1,
                ..me
            }
            .running(),
            "a reused PID"
        );
    }

    #[test]
    fn the_state_round_trips_and_bad_ones_are_refused_with_the_reason() {
        let s = state();
        assert_eq!(LabState::decode(&s.encode().unwrap()).unwrap(), s);
        for (text, why) in [
            ("{", "EOF"),
            (
                r#"{"process":{"pid":0,"start":1},"started":1,"kernel":"host","guest":null,"dirs":[]}"#,
                "pid 0",
            ),
            (
                r#"{"process":{"pid":1,"start":1},"started":1,"kernel":"host","guest":null,"dirs":["rel"]}"#,
                "not absolute",
            ),
            (
                r#"{"process":{"pid":1,"start":1},"started":1,"kernel":"host","guest":null,"dirs":[],"x":1}"#,
                "unknown field",
            ),
        ] {
            let e = LabState::decode(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
