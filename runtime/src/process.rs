//! Foreground child processes in their own process group (SPEC §3): start,
//! exit notification, stop = SIGTERM to the group, SIGKILL after a grace
//! period. Restart policy (1–30 s backoff) is the supervising actor's.
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

    /// SIGTERM to the process group, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus, Error> {
        if let Some(s) = self.try_exited() {
            return Ok(s);
        }
        let _ = killpg(self.pgid, Signal::SIGTERM);
        if let Ok(r) = tokio::time::timeout(grace, self.exited()).await {
            let s = r?;
            // Stragglers of the group (a daemon's children) go too.
            let _ = killpg(self.pgid, Signal::SIGKILL);
            return Ok(s);
        }
        tracing::warn!(process = self.name, ?grace, "did not stop; SIGKILL");
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.exited().await
    }

    /// Sends `signal` to the process group (tests: simulate a crash).
    pub fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // A dropped handle must not leave an unsupervised daemon behind.
        if self.try_exited().is_none() {
            let _ = killpg(self.pgid, Signal::SIGKILL);
        }
    }
}
