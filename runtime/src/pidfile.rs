//! The IKE daemon's pidfiles (`charon.pid`, `starter.charon.pid`), which
//! strongSwan's starter refuses to start over. A killed daemon leaves them
//! behind; a live daemon's must never be deleted.
//!
//! The agent holds the key directory's owner lock before it gets here, so a
//! live IKE daemon named by one of these files is an orphan of an earlier
//! owner of this node (an agent that was SIGKILLed while its daemon kept
//! running): it is stopped, not raced. A PID that is dead, or that now
//! belongs to some other program (PID reuse), makes the file stale.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Process names of the IKE daemon and its starter, as `/proc/<pid>/comm`
/// shows them.
pub const IKE_PROCESS_NAMES: [&str; 3] = ["charon", "starter", "charon-systemd"];

/// What a pidfile's content means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No pidfile.
    Absent,
    /// Remove it: `why` says why it is safe.
    Stale {
        /// Why nobody needs the file.
        why: String,
    },
    /// A live IKE daemon owns it.
    Live {
        /// Its PID.
        pid: i32,
        /// Its process name.
        comm: String,
    },
}

/// Judges a pidfile's `content` (`None`: no file); `comm_of` answers a
/// PID's process name, `None` when no such process exists.
pub fn judge(content: Option<&str>, comm_of: impl Fn(i32) -> Option<String>) -> Verdict {
    let Some(content) = content else {
        return Verdict::Absent;
    };
    let Some(pid) = content.trim().parse::<i32>().ok().filter(|p| *p > 0) else {
        return Verdict::Stale {
            why: format!("no PID in it ({:?})", content.trim()),
        };
    };
    match comm_of(pid) {
        None => Verdict::Stale {
            why: format!("PID {pid} is not running"),
        },
        Some(comm) if !IKE_PROCESS_NAMES.contains(&comm.as_str()) => Verdict::Stale {
            why: format!("PID {pid} is now {comm:?}, not an IKE daemon"),
        },
        Some(comm) => Verdict::Live { pid, comm },
    }
}

/// The process name of a live `pid` (`/proc/<pid>/comm`); `None` when no
/// such process runs — a zombie counts as gone: it holds no pidfile's
/// promise of a running daemon.
pub fn proc_comm(pid: i32) -> Option<String> {
    if crate::process::read_stat(u32::try_from(pid).ok()?)?.zombie {
        return None;
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Makes `path` safe to start over: removes a stale pidfile; stops the
/// orphaned daemon a live one names (SIGTERM, then SIGKILL after `grace`)
/// and then removes the file. Errors are reported to the caller, who will
/// see starter refuse and retry on its backoff.
pub async fn clear(path: &Path, grace: Duration) -> std::io::Result<()> {
    let content = match std::fs::read_to_string(path) {
        Ok(c) => Some(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    match judge(content.as_deref(), proc_comm) {
        Verdict::Absent => return Ok(()),
        Verdict::Stale { why } => {
            tracing::info!(path = %path.display(), %why, "removing a stale IKE pidfile");
        }
        Verdict::Live { pid, comm } => {
            tracing::warn!(
                path = %path.display(), pid, %comm,
                "an IKE daemon left by an earlier owner of this node is still running; stopping it before starting ours"
            );
            let target = Pid::from_raw(pid);
            let _ = kill(target, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + grace;
            while proc_comm(pid).is_some() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if proc_comm(pid).is_some() {
                let _ = kill(target, Signal::SIGKILL);
            }
        }
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn procs(pid: i32) -> Option<String> {
        match pid {
            100 => Some("charon".into()),
            101 => Some("starter".into()),
            200 => Some("bash".into()),
            _ => None,
        }
    }

    #[test]
    fn live_daemons_are_never_stale() {
        assert_eq!(
            judge(Some("100\n"), procs),
            Verdict::Live {
                pid: 100,
                comm: "charon".into()
            }
        );
        assert!(matches!(
            judge(Some("101"), procs),
            Verdict::Live { pid: 101, .. }
        ));
    }

    #[test]
    fn dead_reused_or_garbled_pids_are_stale() {
        let stale = |c| matches!(judge(Some(c), procs), Verdict::Stale { .. });
        assert!(stale("300\n"), "dead");
        assert!(stale("200\n"), "reused by another program");
        assert!(stale("garbage"));
        assert!(stale(""));
        assert!(stale("-1"));
        assert_eq!(judge(None, procs), Verdict::Absent);
        let Verdict::Stale { why } = judge(Some("200"), procs) else {
            unreachable!()
        };
        assert!(why.contains("bash"), "{why}");
    }

    #[tokio::test]
    async fn clear_keeps_nothing_stale_and_stops_a_live_orphan() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("charon.pid");
        clear(&p, Duration::from_secs(1)).await.unwrap();
        std::fs::write(&p, "999999999\n").unwrap();
        clear(&p, Duration::from_secs(1)).await.unwrap();
        assert!(!p.exists());
        // A live process that is not an IKE daemon: the file goes, the
        // process is untouched.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(&p, format!("{}\n", other.id())).unwrap();
        clear(&p, Duration::from_secs(1)).await.unwrap();
        assert!(!p.exists());
        assert!(
            other.try_wait().unwrap().is_none(),
            "an unrelated process was signalled"
        );
        other.kill().unwrap();
        other.wait().unwrap();
        // A live IKE daemon (a process named charon) left by an earlier
        // owner: stopped, then the file removed.
        let fake = dir.path().join("charon");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let mut orphan = std::process::Command::new(&fake).arg("30").spawn().unwrap();
        std::fs::write(&p, format!("{}\n", orphan.id())).unwrap();
        clear(&p, Duration::from_secs(2)).await.unwrap();
        assert!(!p.exists());
        let status = orphan.wait().unwrap();
        assert!(!status.success(), "the orphan was not stopped: {status}");
    }
}
