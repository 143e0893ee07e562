//! Foreground child processes in their own process group (SPEC §3): start,
//! exit notification, stop = SIGTERM to the group, SIGKILL after a grace
//! period. Restart policy (1–30 s backoff) is the supervising actor's.
//!
//! A group is not the whole tree: strongSwan's starter puts charon in a
//! session of its own (`setsid`), so a SIGKILLed starter's group leaves
//! charon running — holding UDP 500/4500 and its SAs, so that every later
//! charon on the node starts without sockets and never negotiates. A stop
//! therefore signals every descendant too, found by parent links in
//! `/proc` before the parent can die, and identified by PID and start time
//! so a reused PID is never signalled.
//!
//! Every command the runtime runs goes through a [`Launcher`]: in
//! production it runs the program directly; tests and the lab give it a
//! prefix (`nsenter -t <holder> -m -n --`) that places it in a simulated
//! node's namespaces.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::Error;

/// How programs are started: an optional prefix command (which must `exec`
/// the program, keeping its PID — `nsenter` does) and extra environment.
#[derive(Debug, Clone, Default)]
pub struct Launcher {
    /// Prepended to every command line.
    pub prefix: Vec<OsString>,
    /// Extra environment variables.
    pub env: Vec<(OsString, OsString)>,
}

impl Launcher {
    /// Runs programs directly.
    pub fn direct() -> Self {
        Self::default()
    }

    /// Runs programs inside the network and mount namespaces of process
    /// `pid` (`nsenter -t <pid> -m -n --`): a simulated node of the lab.
    pub fn nsenter(pid: u32) -> Self {
        Self {
            prefix: ["nsenter", "-t", &pid.to_string(), "-m", "-n", "--"]
                .iter()
                .map(OsString::from)
                .collect(),
            env: Vec::new(),
        }
    }

    /// A command for `program args`.
    pub fn command<I, S>(&self, program: impl Into<OsString>, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let program = program.into();
        let mut argv: Vec<OsString> = self.prefix.clone();
        argv.push(program);
        argv.extend(args.into_iter().map(Into::into));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Runs `program args` to completion (with a timeout) and returns its
    /// exit status and standard output.
    pub async fn output<I, S>(
        &self,
        program: impl Into<OsString>,
        args: I,
        timeout: Duration,
    ) -> Result<(ExitStatus, String), Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let program = program.into();
        let what = program.to_string_lossy().into_owned();
        let mut cmd = self.command(program, args);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(timeout, cmd.output())
            .await
            .map_err(|_| Error::CommandTimeout {
                command: what.clone(),
                timeout,
            })?
            .map_err(|source| Error::Spawn {
                command: what,
                source,
            })?;
        Ok((
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }
}

/// What to run in the foreground.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// A short name for logs and metrics (`ike`, `monitor`).
    pub name: &'static str,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// File receiving standard output and error (`None`: inherited).
    pub log_file: Option<PathBuf>,
}

/// A running child in its own process group.
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    child: Child,
    pgid: Pid,
    status: Option<ExitStatus>,
}

impl Supervised {
    /// Starts `spec` through `launcher` in a new process group.
    pub fn start(spec: &ProcessSpec, launcher: &Launcher) -> Result<Self, Error> {
        let mut cmd = launcher.command(spec.program.clone(), spec.args.clone());
        // Its own group: the stop signal reaches the daemon and everything
        // it forked (starter's charon), and a signal to the agent's group
        // does not reach it.
        cmd.process_group(0);
        if let Some(log) = &spec.log_file {
            let f = std::fs::File::create(log).map_err(|source| Error::Io {
                path: log.clone(),
                source,
            })?;
            let f2 = f.try_clone().map_err(|source| Error::Io {
                path: log.clone(),
                source,
            })?;
            cmd.stdout(f).stderr(f2);
        }
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            command: spec.program.to_string_lossy().into_owned(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| Error::Spawn {
            command: spec.program.to_string_lossy().into_owned(),
            source: std::io::Error::other("exited before its PID was read"),
        })?;
        let pgid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        tracing::info!(process = spec.name, pid, "started");
        Ok(Self {
            name: spec.name,
            child,
            pgid,
            status: None,
        })
    }

    /// The child's PID (also its process group).
    pub fn pid(&self) -> u32 {
        self.pgid.as_raw().unsigned_abs()
    }

    /// Waits until the child exits (the exit notification an actor
    /// `select!`s on). Cancel-safe.
    pub async fn exited(&mut self) -> Result<ExitStatus, Error> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let s = self.child.wait().await.map_err(|source| Error::Spawn {
            command: self.name.to_string(),
            source,
        })?;
        tracing::warn!(process = self.name, status = %s, "exited");
        self.status = Some(s);
        Ok(s)
    }

    /// Whether it exited already (non-blocking).
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// SIGTERM to the process group and to every descendant outside it,
    /// then SIGKILL to whatever of them still runs after `grace`; returns
    /// once the child has exited and its descendants are gone (or, for a
    /// descendant that ignores even SIGKILL, after one more second).
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus, Error> {
        let mut tree = descendants(self.pid());
        if let Some(s) = self.try_exited() {
            // Exited by itself: what it left running goes now.
            signal_all(&tree, Signal::SIGKILL);
            wait_gone(&tree, Duration::from_secs(1)).await;
            return Ok(s);
        }
        let deadline = tokio::time::Instant::now() + grace;
        let _ = killpg(self.pgid, Signal::SIGTERM);
        signal_all(&tree, Signal::SIGTERM);
        let exited = tokio::time::timeout_at(deadline, self.exited()).await;
        if exited.is_err() {
            // Still running: it may have forked since.
            for p in descendants(self.pid()) {
                if !tree.contains(&p) {
                    tree.push(p);
                }
            }
        }
        let mut forced = exited.is_err();
        if !wait_gone_until(&tree, deadline).await {
            forced = true;
        }
        if forced {
            tracing::warn!(process = self.name, ?grace, "did not stop; SIGKILL");
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        signal_all(&tree, Signal::SIGKILL);
        let status = self.exited().await;
        if !wait_gone(&tree, Duration::from_secs(1)).await {
            tracing::warn!(process = self.name, "a descendant survived SIGKILL");
        }
        status
    }

    /// Sends `signal` to the process group (tests: simulate a crash).
    pub fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // A dropped handle must not leave an unsupervised daemon behind,
        // nor one its child put in a session of its own.
        let tree = descendants(self.pid());
        if self.try_exited().is_none() {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
        signal_all(&tree, Signal::SIGKILL);
    }
}

/// One process, told apart from a later one with the same PID by its start
/// time (`/proc/<pid>/stat` field 22, clock ticks since boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcId {
    /// Its PID.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
}

impl ProcId {
    /// Whether this very process still runs (not a zombie, not a PID reused
    /// by a later process).
    pub fn alive(&self) -> bool {
        read_stat(self.pid).is_some_and(|s| s.start_time == self.start_time && !s.zombie)
    }
}

/// What `/proc/<pid>/stat` says that the runtime needs.
pub(crate) struct Stat {
    /// The parent's PID.
    pub(crate) ppid: u32,
    /// Clock ticks since boot when it started.
    pub(crate) start_time: u64,
    /// A zombie (or dead): it runs no more.
    pub(crate) zombie: bool,
}

/// `/proc/<pid>/stat` of `pid`, `None` when no such process exists.
pub(crate) fn read_stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "<pid> (<comm>) <state> <ppid> ...": fields after the last ')'
    // start with the state (field 3); the start time is field 22.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Stat {
        zombie: matches!(rest.first(), Some(&"Z" | &"X")),
        ppid: rest.get(1)?.parse().ok()?,
        start_time: rest.get(19)?.parse().ok()?,
    })
}

/// Every live descendant of `root` (not `root` itself), by parent links in
/// `/proc`, whatever group or session it is in.
pub fn descendants(root: u32) -> Vec<ProcId> {
    let mut parents: Vec<(ProcId, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(s) = read_stat(pid).filter(|s| !s.zombie) {
            parents.push((
                ProcId {
                    pid,
                    start_time: s.start_time,
                },
                s.ppid,
            ));
        }
    }
    let mut out: Vec<ProcId> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            if !out.contains(child) {
                out.push(*child);
                frontier.push(child.pid);
            }
        }
    }
    out
}

fn signal_all(tree: &[ProcId], signal: Signal) {
    for p in tree.iter().filter(|p| p.alive()) {
        if let Ok(pid) = i32::try_from(p.pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Waits until none of `tree` runs, or `limit`; whether none runs.
async fn wait_gone(tree: &[ProcId], limit: Duration) -> bool {
    wait_gone_until(tree, tokio::time::Instant::now() + limit).await
}

async fn wait_gone_until(tree: &[ProcId], deadline: tokio::time::Instant) -> bool {
    loop {
        if !tree.iter().any(ProcId::alive) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(script: &str) -> ProcessSpec {
        ProcessSpec {
            name: "test",
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            log_file: None,
        }
    }

    /// The grandchild `sleep` of `child`, in its own session (as starter
    /// puts charon), once it runs.
    async fn escaped_grandchild(child: &Supervised) -> ProcId {
        for _ in 0..200 {
            let tree = descendants(child.pid());
            if let Some(p) = tree.iter().find(|p| {
                std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .is_ok_and(|c| c.trim() == "sleep")
            }) {
                let sid = nix::unistd::getsid(Some(Pid::from_raw(p.pid as i32))).unwrap();
                assert_eq!(sid.as_raw(), p.pid as i32, "not in a session of its own");
                return *p;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no grandchild");
    }

    #[tokio::test]
    async fn stop_reaches_a_descendant_in_another_session() {
        // The child ignores SIGTERM (as a slow starter does): SIGKILL after
        // the grace must still take the escaped grandchild with it.
        let mut p = Supervised::start(
            &spec("trap '' TERM; setsid sleep 300 & wait"),
            &Launcher::direct(),
        )
        .unwrap();
        let grandchild = escaped_grandchild(&p).await;
        p.stop(Duration::from_millis(300)).await.unwrap();
        assert!(!grandchild.alive(), "the escaped grandchild survived");

        // A child that stops at once on SIGTERM: its escaped grandchild,
        // which would keep running, goes too.
        let mut p =
            Supervised::start(&spec("setsid sleep 300 & wait"), &Launcher::direct()).unwrap();
        let grandchild = escaped_grandchild(&p).await;
        p.stop(Duration::from_secs(5)).await.unwrap();
        assert!(!grandchild.alive(), "the escaped grandchild survived");
    }

    #[tokio::test]
    async fn a_dropped_handle_leaves_no_escaped_descendant() {
        let p = Supervised::start(&spec("setsid sleep 300 & wait"), &Launcher::direct()).unwrap();
        let grandchild = escaped_grandchild(&p).await;
        drop(p);
        for _ in 0..40 {
            if !grandchild.alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the escaped grandchild survived the drop");
    }

    #[test]
    fn a_reused_pid_is_not_the_same_process() {
        let me = std::process::id();
        let now = ProcId {
            pid: me,
            start_time: read_stat(me).unwrap().start_time,
        };
        assert!(now.alive());
        let earlier = ProcId {
            start_time: now.start_time.wrapping_sub(1),
            ..now
        };
        assert!(!earlier.alive());
    }
}
