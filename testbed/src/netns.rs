//! Network (and mount) namespaces for simulated nodes, and veth pairs between
//! them.
//!
//! A [`Netns`] is a named network namespace (`ip netns add`) plus a *holder*
//! process: `ip netns exec <ns> sh -c '...; exec sleep infinity'`. `ip netns
//! exec` already gives the holder a mount namespace of its own; the holder
//! makes it private and bind-mounts the node's own `/run` and any files or
//! directories asked for (strongSwan's `/etc/ipsec.conf`, ...). Everything for
//! the node then runs with `nsenter -t <holder pid> -m -n -- CMD`
//! ([`Netns::command`]), so several nodes can run daemons that insist on fixed
//! paths (`/run/charon.pid`, `/etc/ipsec.conf`) side by side. This is the
//! recipe measured in `TESTBED.md`.
//!
//! Names are `<prefix>-<pid>-<n>`: unique per test process, so tests run in
//! parallel, and recognisable afterwards, so [`cleanup_stale`] removes what a
//! crashed earlier run with the same prefix left behind.
//!
//! Dropping a [`Netns`] kills every process still inside it (they can only be
//! ours: the name is unique) and deletes the namespace.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Counter that makes namespace names unique within this process.
static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Why a namespace operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// A program could not be started at all (not installed, not executable).
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command line that was attempted.
        command: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line that failed.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it wrote to standard error.
        stderr: String,
    },
    /// The holder process died before reporting its mounts done.
    #[error("namespace holder for {netns} exited during setup: {stderr}")]
    Holder {
        /// The namespace the holder was for.
        netns: String,
        /// What the holder's shell wrote to standard error.
        stderr: String,
    },
    /// A path cannot be put into the holder's shell script safely.
    #[error("path {0:?} contains a single quote or is not UTF-8")]
    UnsafePath(PathBuf),
}

/// Runs `cmd` to completion and returns its output, or an error carrying the
/// command line and its standard error when it cannot start or exits non-zero.
pub fn run(cmd: &mut Command) -> Result<Output, NetnsError> {
    let command = describe(cmd);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::Spawn {
            command: command.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(NetnsError::Failed {
            command,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// The command line of `cmd`, for error messages.
pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A bind mount the holder sets up inside the node's mount namespace.
#[derive(Debug, Clone)]
pub struct Bind {
    /// The host path (file or directory) that appears at `target`.
    pub source: PathBuf,
    /// The path inside the node; it must already exist on the host and be of
    /// the same kind (file over file, directory over directory).
    pub target: PathBuf,
}

impl Bind {
    /// A bind of host path `source` over `target`.
    pub fn new(source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        Self {
            source: source.into(),
            target: target.into(),
        }
    }
}

/// What the node sees instead of the host's files.
#[derive(Debug, Clone, Default)]
pub struct Mounts {
    /// Host directory mounted over `/run` (bound first: libmount would
    /// otherwise create `/run/mount` on the host). `/run/openvswitch` is
    /// created in it.
    pub run: Option<PathBuf>,
    /// Further binds, in order, after `/run`.
    pub binds: Vec<Bind>,
}

/// A named network namespace with a private mount namespace, kept alive by a
/// holder process; deleted (with everything in it) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    holder: Child,
}

/// The way into a [`Netns`] (its holder's PID): copyable, so a thread can
/// run commands in a namespace that stays owned elsewhere. Commands through
/// it fail once the namespace is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    holder: u32,
}

impl Entry {
    /// A command that runs `program` inside the network and mount
    /// namespaces. `nsenter` execs the program without forking (no PID
    /// namespace is entered), so a spawned child's PID is the program's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.holder.to_string())
            .args(["-m", "-n", "--"])
            .arg(program);
        cmd
    }

    /// Runs `program args...` inside the namespaces and returns its output;
    /// a non-zero exit is an error.
    pub fn run<I, S>(&self, program: &str, args: I) -> Result<Output, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(self.command(program).args(args))
    }
}

impl Netns {
    /// Creates `<prefix>-<pid>-<n>` with no mounts besides those `ip netns
    /// exec` makes. Removes stale namespaces of the same prefix first.
    pub fn create(prefix: &str) -> Result<Self, NetnsError> {
        Self::create_with_mounts(prefix, &Mounts::default())
    }

    /// Creates `<prefix>-<pid>-<n>` whose holder applies `mounts`. Removes
    /// stale namespaces of the same prefix first.
    pub fn create_with_mounts(prefix: &str, mounts: &Mounts) -> Result<Self, NetnsError> {
        cleanup_stale(prefix);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        run(Command::new("ip").args(["netns", "add", &name]))?;
        match Self::spawn_holder(&name, mounts) {
            Ok(holder) => Ok(Self { name, holder }),
            Err(e) => {
                delete_netns(&name);
                Err(e)
            }
        }
    }

    fn spawn_holder(name: &str, mounts: &Mounts) -> Result<Child, NetnsError> {
        let mut script = String::from("set -e\nmount --make-rprivate /\n");
        if let Some(run) = &mounts.run {
            script += &format!(
                "mount --bind {} /run\nmkdir -p /run/openvswitch\n",
                quote(run)?
            );
        }
        for bind in &mounts.binds {
            script += &format!(
                "mount --bind {} {}\n",
                quote(&bind.source)?,
                quote(&bind.target)?
            );
        }
        // The line tells the parent the mounts are in place; `sleep` never
        // writes, so the parent may drop its end of the pipe.
        script += "echo ready\nexec sleep infinity\n";
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", name, "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut holder = cmd.spawn().map_err(|source| NetnsError::Spawn {
            command: describe(&cmd),
            source,
        })?;
        let mut line = String::new();
        if let Some(out) = holder.stdout.take() {
            // Blocks until the script prints or dies (EOF).
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "ready" {
            let _ = holder.kill();
            let mut stderr = String::new();
            if let Some(mut err) = holder.stderr.take() {
                let _ = err.read_to_string(&mut stderr);
            }
            let _ = holder.wait();
            return Err(NetnsError::Holder {
                netns: name.to_string(),
                stderr,
            });
        }
        Ok(holder)
    }

    /// The namespace's name (for `ip -n <name>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The holder's PID (for `nsenter -t <pid>`).
    pub fn holder_pid(&self) -> u32 {
        self.holder.id()
    }

    /// The way into this namespace, for a thread that runs commands in it
    /// while the namespace stays owned here; valid while `self` lives.
    pub fn entry(&self) -> Entry {
        Entry {
            holder: self.holder_pid(),
        }
    }

    /// A command that runs `program` inside the node's network and mount
    /// namespaces ([`Entry::command`]).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        self.entry().command(program)
    }

    /// Runs `program args...` inside the node and returns its output; a
    /// non-zero exit is an error.
    pub fn run<I, S>(&self, program: &str, args: I) -> Result<Output, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.entry().run(program, args)
    }

    /// Runs `ip -n <ns> args...` (network namespace only) and returns stdout.
    pub fn ip<I, S>(&self, args: I) -> Result<String, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = run(Command::new("ip").args(["-n", &self.name]).args(args))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Everything inside is ours (the name is unique to this process);
        // the holder is among the listed PIDs.
        kill_all_in(&self.name);
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        delete_netns(&self.name);
    }
}

/// Single-quotes `path` for the holder's shell script.
fn quote(path: &Path) -> Result<String, NetnsError> {
    match path.to_str() {
        Some(s) if !s.contains('\'') => Ok(format!("'{s}'")),
        _ => Err(NetnsError::UnsafePath(path.to_path_buf())),
    }
}

/// SIGKILLs every process whose network namespace is `name`.
fn kill_all_in(name: &str) {
    let Ok(out) = Command::new("ip")
        .args(["netns", "pids", name])
        .stderr(Stdio::null())
        .output()
    else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn delete_netns(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// Deletes namespaces named `<prefix>-<pid>-<n>` whose creating process is
/// gone (a crashed or killed earlier run), killing what still runs in them.
/// Namespaces of live processes (parallel test binaries) are left alone.
pub fn cleanup_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let own = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
            continue;
        };
        if pid != own && !Path::new(&format!("/proc/{pid}")).exists() {
            kill_all_in(&name);
            delete_netns(&name);
        }
    }
}

/// One end of a veth pair.
#[derive(Debug, Clone, Copy)]
pub struct VethEnd<'a> {
    /// The namespace the end lives in.
    pub netns: &'a Netns,
    /// Interface name inside that namespace.
    pub ifname: &'a str,
    /// Address with prefix length, e.g. `10.77.0.1/24`.
    pub cidr: &'a str,
}

/// Creates a veth pair directly inside the two namespaces (never in the host
/// namespace, so parallel tests cannot collide on interface names), assigns
/// the addresses and brings both ends and loopback up.
pub fn veth_pair(a: VethEnd<'_>, b: VethEnd<'_>) -> Result<(), NetnsError> {
    run(Command::new("ip").args([
        "link",
        "add",
        a.ifname,
        "netns",
        a.netns.name(),
        "type",
        "veth",
        "peer",
        "name",
        b.ifname,
        "netns",
        b.netns.name(),
    ]))?;
    for end in [a, b] {
        end.netns.ip(["addr", "add", end.cidr, "dev", end.ifname])?;
        end.netns.ip(["link", "set", end.ifname, "up"])?;
        end.netns.ip(["link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// Whether this kernel can hold ESP states: tries `ip xfrm state add ...
/// proto esp` (AES-GCM, transport mode) in a scratch namespace.
///
/// `TESTBED.md`: the project's machines lack ESP, so tests prove everything
/// up to the IKE SA and must say loudly that the ESP datapath was not checked.
pub fn esp_available() -> Result<bool, NetnsError> {
    let ns = Netns::create("koi-esp-probe")?;
    let added = ns
        .ip([
            "xfrm",
            "state",
            "add",
            "src",
            "192.0.2.1",
            "dst",
            "192.0.2.2",
            "proto",
            "esp",
            "spi",
            "0x100",
            "mode",
            "transport",
            "aead",
            "rfc4106(gcm(aes))",
            "0x0102030405060708091011121314151617181920",
            "128",
        ])
        .is_ok();
    Ok(added)
}

/// Polls `probe` every `interval` until it returns `Some` or `timeout`
/// passes; returns the value or `None` on timeout.
pub fn wait_for<T>(
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn require() {
        for p in ["ip", "nsenter", "sh", "mount", "sleep"] {
            crate::require_program(p).unwrap();
        }
    }

    #[test]
    fn holder_binds_run_and_nsenter_sees_it() {
        require();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), "node-run").unwrap();
        let ns = Netns::create_with_mounts(
            "koi-unit",
            &Mounts {
                run: Some(dir.path().to_path_buf()),
                binds: vec![],
            },
        )
        .unwrap();
        let out = ns.run("cat", ["/run/marker"]).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "node-run");
        // The holder created /run/openvswitch inside the node's /run.
        assert!(dir.path().join("openvswitch").is_dir());
        // The host's /run is untouched.
        assert!(!Path::new("/run/marker").exists());
        let name = ns.name().to_string();
        drop(ns);
        assert!(
            !Path::new("/run/netns").join(&name).exists(),
            "{name} not deleted"
        );
    }

    #[test]
    fn veth_pair_connects_two_namespaces() {
        require();
        let (a, b) = (
            Netns::create("koi-unit").unwrap(),
            Netns::create("koi-unit").unwrap(),
        );
        veth_pair(
            VethEnd {
                netns: &a,
                ifname: "v0",
                cidr: "10.99.0.1/24",
            },
            VethEnd {
                netns: &b,
                ifname: "v0",
                cidr: "10.99.0.2/24",
            },
        )
        .unwrap();
        let route = a.ip(["route", "get", "10.99.0.2"]).unwrap();
        assert!(route.contains("dev v0"), "{route}");
    }

    #[test]
    fn stale_namespace_of_dead_process_is_removed() {
        require();
        // PID 0x7fff_fff0 is above pid_max: no live process has it.
        let stale = "koi-stale-2147483632-0";
        run(Command::new("ip").args(["netns", "add", stale])).unwrap();
        let live = Netns::create("koi-stale").unwrap();
        // create() cleaned up first: the stale one is gone, ours is there.
        assert!(!Path::new("/run/netns").join(stale).exists());
        assert!(Path::new("/run/netns").join(live.name()).exists());
    }
}
