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
//!
//! The state file names directories, and `down` runs as root: it removes
//! only what the lab itself makes — a directory directly in the temporary
//! directory named with one of [`DIR_PREFIXES`], with no `..` in its path,
//! itself a directory rather than a symbolic link, and owned by the user
//! running `down` ([`lab_made`]) — and
//! reports any other entry, with the reason, instead of removing it. A
//! corrupt, edited or hostile state file then costs nothing but a line of
//! output.

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
/// The names the lab gives the directories it makes in the temporary
/// directory: its own (`up`'s `koi-lab-XXXXXX`) and the guest's work
/// directory (`testbed::guest`'s `koi-guest-XXXXXX`).
pub const DIR_PREFIXES: &[&str] = &["koi-lab-", "koi-guest-"];
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

/// What [`down`] removed, and what it left alone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DownReport {
    /// Processes stopped (the lab, its guest).
    pub stopped: Vec<u32>,
    /// Directories removed.
    pub dirs: Vec<PathBuf>,
    /// Directories the state file named that the lab does not make, left
    /// untouched, each with the reason.
    pub skipped: Vec<SkippedDir>,
    /// Why the state file was ignored, when it was unusable (the
    /// namespaces are still cleaned by their prefix).
    pub unusable_state: Option<String>,
}

/// A recorded directory [`down`] did not remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedDir {
    /// The path as the state file names it.
    pub path: PathBuf,
    /// Why it was left alone.
    pub why: NotLabMade,
}

/// Why a recorded path is not a directory the lab made ([`lab_made`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotLabMade {
    /// The path has a `..` component, so its text says nothing of where it
    /// leads.
    #[error("it has a `..` component")]
    ParentComponent,
    /// Not directly in the temporary directory with a lab prefix.
    #[error(
        "the lab only makes directories named {} directly in {}",
        DIR_PREFIXES.iter().map(|p| format!("{p}*")).collect::<Vec<_>>().join(" or "),
        .temp_dir.display()
    )]
    NotLabName {
        /// The temporary directory the lab makes its directories in.
        temp_dir: PathBuf,
    },
    /// A symbolic link (the lab records directories, never links).
    #[error("it is a symbolic link")]
    Symlink,
    /// Something other than a directory.
    #[error("it is not a directory")]
    NotADirectory,
    /// What it is could not be read.
    #[error("it could not be examined: {error}")]
    Unreadable {
        /// The error reading it.
        error: String,
    },
    /// A directory of another user.
    #[error("it is owned by uid {owner}, not by this user (uid {me})")]
    ForeignOwner {
        /// Its owner.
        owner: u32,
        /// The user running `down`.
        me: u32,
    },
}

/// Whether `path` is a directory the lab makes, which [`down`] may remove:
/// named with one of [`DIR_PREFIXES`] directly in `temp_dir` (where `up`
/// and the guest make theirs), without a `..` component, itself a
/// directory and not a symbolic link, and owned by this process's user.
/// `Ok(false)` when nothing is there any more.
pub fn lab_made(path: &Path, temp_dir: &Path) -> Result<bool, NotLabMade> {
    use std::os::unix::fs::MetadataExt as _;
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(NotLabMade::ParentComponent);
    }
    let lab_name = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        DIR_PREFIXES
            .iter()
            .any(|p| n.len() > p.len() && n.starts_with(p))
    });
    // Compared by components: `/tmp/./koi-lab-x` and `/tmp//koi-lab-x`
    // are `/tmp/koi-lab-x`.
    let in_temp = path
        .parent()
        .is_some_and(|p| p.components().eq(temp_dir.components()));
    if !lab_name || !in_temp {
        return Err(NotLabMade::NotLabName {
            temp_dir: temp_dir.to_path_buf(),
        });
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(NotLabMade::Unreadable {
                error: e.to_string(),
            });
        }
    };
    if meta.file_type().is_symlink() {
        return Err(NotLabMade::Symlink);
    }
    if !meta.is_dir() {
        return Err(NotLabMade::NotADirectory);
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(NotLabMade::ForeignOwner {
            owner: meta.uid(),
            me,
        });
    }
    Ok(true)
}

/// Removes those of `dirs` that the lab made ([`lab_made`] in the system's
/// temporary directory), leaving the others: what was removed and what was
/// skipped, why. Stops at the first removal that fails.
pub fn remove_lab_dirs(dirs: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<SkippedDir>), StateError> {
    remove_lab_dirs_in(dirs, &std::env::temp_dir())
}

fn remove_lab_dirs_in(
    dirs: &[PathBuf],
    temp_dir: &Path,
) -> Result<(Vec<PathBuf>, Vec<SkippedDir>), StateError> {
    let mut removed = Vec::new();
    let mut skipped = Vec::new();
    for d in dirs {
        match lab_made(d, temp_dir) {
            Ok(true) => {
                std::fs::remove_dir_all(d).map_err(io("removing", d))?;
                removed.push(d.clone());
            }
            Ok(false) => {}
            Err(why) => skipped.push(SkippedDir {
                path: d.clone(),
                why,
            }),
        }
    }
    Ok((removed, skipped))
}

/// Stops the lab recorded in `dir` (SIGTERM, then SIGKILL after a grace)
/// and its guest, deletes the lab's namespaces whose creator is gone,
/// removes the recorded directories the lab made ([`lab_made`]; the others
/// are reported in [`DownReport::skipped`]) and the state. Idempotent;
/// never signals the calling process.
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
        (report.dirs, report.skipped) = remove_lab_dirs(&state.dirs)?;
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
    fn only_what_the_lab_makes_is_removed() {
        let temp = tempfile::tempdir().unwrap();
        let t = temp.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), "x").unwrap();
        let made = [t.join("koi-lab-abc123"), t.join("koi-guest-def456")];
        for d in &made {
            std::fs::create_dir_all(d.join("node-0")).unwrap();
        }
        std::fs::create_dir(t.join("other")).unwrap();
        std::fs::write(t.join("koi-lab-file"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.join("koi-lab-link")).unwrap();
        let not_lab = || NotLabMade::NotLabName {
            temp_dir: t.to_path_buf(),
        };
        // A lab-named file first: a removal that vets nothing fails on it
        // (not a directory) before it reaches `/`.
        let cases = [
            (t.join("koi-lab-file"), NotLabMade::NotADirectory),
            (PathBuf::from("/"), not_lab()),
            (t.join("other"), not_lab()),
            (t.join("koi-lab-"), not_lab()),
            (made[0].join("node-0"), not_lab()),
            (outside.path().to_path_buf(), not_lab()),
            (
                t.join("koi-lab-abc123/../other"),
                NotLabMade::ParentComponent,
            ),
            (t.join("koi-lab-link"), NotLabMade::Symlink),
        ];
        let mut dirs: Vec<PathBuf> = cases.iter().map(|(p, _)| p.clone()).collect();
        dirs.extend(made.iter().cloned());
        // Gone already: neither removed nor skipped.
        dirs.push(t.join("koi-lab-gone"));
        // The same directory written otherwise is the same directory.
        let dotted = t.join(".").join("koi-lab-dotted");
        std::fs::create_dir(&dotted).unwrap();
        dirs.push(dotted.clone());

        let (removed, skipped) = remove_lab_dirs_in(&dirs, t).unwrap();
        assert_eq!(removed, [made[0].clone(), made[1].clone(), dotted.clone()]);
        let expected: Vec<SkippedDir> = cases
            .into_iter()
            .map(|(path, why)| SkippedDir { path, why })
            .collect();
        assert_eq!(skipped, expected);
        assert!(made.iter().all(|d| !d.exists()) && !dotted.exists());
        assert!(t.join("other").is_dir());
        assert!(t.join("koi-lab-file").is_file());
        assert!(t.join("koi-lab-link").is_symlink());
        assert!(outside.path().join("precious").is_file());
        assert!(
            skipped[1]
                .why
                .to_string()
                .contains("koi-lab-* or koi-guest-*"),
            "{}",
            skipped[1].why
        );
    }

    #[test]
    fn a_directory_of_another_user_is_left() {
        let temp = tempfile::tempdir().unwrap();
        let theirs = temp.path().join("koi-lab-theirs");
        std::fs::create_dir(&theirs).unwrap();
        let me = nix::unistd::geteuid();
        if !me.is_root() {
            // Only root can give a directory away; as anyone else the
            // directory is this user's own.
            assert_eq!(lab_made(&theirs, temp.path()), Ok(true));
            return;
        }
        let nobody = nix::unistd::Uid::from_raw(65534);
        nix::unistd::chown(&theirs, Some(nobody), None).unwrap();
        assert_eq!(
            lab_made(&theirs, temp.path()),
            Err(NotLabMade::ForeignOwner {
                owner: 65534,
                me: 0
            })
        );
        let (removed, skipped) =
            remove_lab_dirs_in(std::slice::from_ref(&theirs), temp.path()).unwrap();
        assert!(removed.is_empty() && skipped.len() == 1 && theirs.is_dir());
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
