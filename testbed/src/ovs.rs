//! Real `ovsdb-server` (Open_vSwitch, OVN NB, OVN SB schemas) and
//! `ovn-northd` processes for tests, benches and the lab.
//!
//! Each daemon is started with `--detach --pidfile --log-file --unixctl` in a
//! directory the caller owns (usually a `tempfile::TempDir`), the way
//! `TESTBED.md` shows. The handle remembers the daemon's PID (read from its
//! pidfile once it is up) and stops it on drop, so a failing test never
//! leaves a daemon behind, even if the directory was removed first.
//!
//! ```no_run
//! # fn main() -> Result<(), testbed::ovs::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let vswitch = testbed::ovs::OvsdbServer::start_vswitch(dir.path())?;
//! let central = testbed::ovs::OvnCentral::start(dir.path())?;
//! println!("{} {} {}", vswitch.address(), central.nb.address(), central.sb.address());
//! # Ok(()) }
//! ```
//!
//! The API is synchronous: starting a daemon takes a few milliseconds and
//! tests call it before their async part begins.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{MissingProgram, require_program};

/// What can go wrong starting or stopping a daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A program the harness runs is not installed.
    #[error(transparent)]
    Missing(#[from] MissingProgram),
    /// A command ran but failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was attempted.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A daemon did not come up or go away in time.
    #[error("timed out: {what}")]
    Timeout {
        /// What was awaited.
        what: String,
    },
}

/// Which schema an [`OvsdbServer`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// `Open_vSwitch` (`/usr/share/openvswitch/vswitch.ovsschema`).
    Vswitch,
    /// `OVN_Northbound` (`/usr/share/ovn/ovn-nb.ovsschema`).
    Northbound,
    /// `OVN_Southbound` (`/usr/share/ovn/ovn-sb.ovsschema`).
    Southbound,
}

impl DbKind {
    /// The schema file shipped by the Debian packages.
    pub fn schema(self) -> &'static str {
        match self {
            DbKind::Vswitch => "/usr/share/openvswitch/vswitch.ovsschema",
            DbKind::Northbound => "/usr/share/ovn/ovn-nb.ovsschema",
            DbKind::Southbound => "/usr/share/ovn/ovn-sb.ovsschema",
        }
    }

    /// The database name inside the schema.
    pub fn db_name(self) -> &'static str {
        match self {
            DbKind::Vswitch => "Open_vSwitch",
            DbKind::Northbound => "OVN_Northbound",
            DbKind::Southbound => "OVN_Southbound",
        }
    }

    /// File stem used in the directory: `conf`, `nb`, `sb` (so one directory
    /// can hold all three).
    pub fn stem(self) -> &'static str {
        match self {
            DbKind::Vswitch => "conf",
            DbKind::Northbound => "nb",
            DbKind::Southbound => "sb",
        }
    }
}

/// Runs `program args`, returning its stdout, or [`Error::Command`].
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let path = require_program(program)?;
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(&path)
        .args(args)
        .output()
        .map_err(|source| Error::Io {
            what: format!("spawn `{command}`"),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Command {
            command,
            status: out.status.to_string(),
            // Some tools (ovs-pki) say why on stdout.
            stderr: if out.stderr.is_empty() {
                String::from_utf8_lossy(&out.stdout).into_owned()
            } else {
                String::from_utf8_lossy(&out.stderr).into_owned()
            },
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The options every detached OVS/OVN daemon here starts with: its
/// control socket, pidfile and log, detached, and `ssl`'s files if any.
fn daemon_options(ctl: &Path, daemon: &Daemon, log: &Path, ssl: Option<&SslFiles>) -> Vec<String> {
    let mut args = vec![
        format!("--unixctl={}", ctl.display()),
        format!("--pidfile={}", daemon.pidfile.display()),
        format!("--log-file={}", log.display()),
        "--detach".into(),
        "--no-chdir".into(),
    ];
    if let Some(ssl) = ssl {
        args.extend(ssl.options());
    }
    args
}

/// A detached daemon known by its pidfile.
#[derive(Debug)]
struct Daemon {
    name: String,
    pidfile: PathBuf,
    pid: Option<Pid>,
}

impl Daemon {
    fn new(name: &str, pidfile: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            pidfile,
            pid: None,
        }
    }

    /// Reads the pidfile the daemon wrote before `--detach` returned.
    fn record_pid(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(s) = std::fs::read_to_string(&self.pidfile)
                && let Ok(pid) = s.trim().parse::<i32>()
            {
                self.pid = Some(Pid::from_raw(pid));
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("{} pidfile {}", self.name, self.pidfile.display()),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn is_running(&self) -> bool {
        self.pid.is_some_and(alive)
    }

    /// Sends `signal` and waits until the process is gone.
    fn signal(&mut self, signal: Signal) -> Result<(), Error> {
        let Some(pid) = self.pid else { return Ok(()) };
        if alive(pid) {
            // ESRCH (already gone) is success here.
            let _ = kill(pid, signal);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            if Instant::now() > deadline {
                if signal == Signal::SIGKILL {
                    return Err(Error::Timeout {
                        what: format!("{} (pid {pid}) to exit", self.name),
                    });
                }
                return self.signal(Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.pid = None;
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(e) = self.signal(Signal::SIGTERM) {
            tracing::error!(error = %e, "could not stop {}", self.name);
        }
    }
}

/// Alive and not a zombie: a detached daemon is reparented away from us, and
/// the container's init may be slow (or absent) to reap it.
fn alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn remove_if_exists(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io {
            what: format!("remove {}", path.display()),
            source,
        }),
    }
}

/// A running `ovsdb-server` with one database, listening on a unix socket.
#[derive(Debug)]
pub struct OvsdbServer {
    kind: DbKind,
    db: PathBuf,
    socket: PathBuf,
    ctl: PathBuf,
    log: PathBuf,
    daemon: Daemon,
    /// The key, certificate and CA files it serves `ssl:` with, once set.
    ssl: Option<SslFiles>,
}

/// A PEM key, certificate and CA certificate, as OVS's `--private-key`,
/// `--certificate` and `--ca-cert` take them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslFiles {
    /// The private key.
    pub private_key: PathBuf,
    /// The certificate.
    pub certificate: PathBuf,
    /// The CA certificate peers must chain to.
    pub ca_cert: PathBuf,
}

impl SslFiles {
    /// `--private-key=…`, `--certificate=…`, `--ca-cert=…`: how every OVS
    /// and OVN daemon takes them.
    pub fn options(&self) -> [String; 3] {
        [
            format!("--private-key={}", self.private_key.display()),
            format!("--certificate={}", self.certificate.display()),
            format!("--ca-cert={}", self.ca_cert.display()),
        ]
    }
}

/// A PKI made by OVS's own `ovs-pki` (what Kube-OVN's `ENABLE_SSL` uses):
/// its `switchca` signs every certificate asked for.
#[derive(Debug)]
pub struct OvsPki {
    dir: PathBuf,
}

impl OvsPki {
    /// `ovs-pki init` in `<dir>/pki`.
    pub fn create(dir: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let pki = Self {
            dir: dir.to_path_buf(),
        };
        pki.ovs_pki(&["init"])?;
        Ok(pki)
    }

    /// The CA certificate every certificate of this PKI chains to.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("pki/switchca/cacert.pem")
    }

    /// A key and certificate `name`, signed by the CA (`ovs-pki
    /// req+sign`), with this PKI's CA as the peers' CA.
    pub fn issue(&self, name: &str) -> Result<SslFiles, Error> {
        // Run in the PKI's directory with a bare, short name: ovs-pki puts
        // the name and a UUID into the subject's CN, which holds 64
        // characters.
        self.ovs_pki(&["--force", "req+sign", name, "switch"])?;
        Ok(SslFiles {
            private_key: self.dir.join(format!("{name}-privkey.pem")),
            certificate: self.dir.join(format!("{name}-cert.pem")),
            ca_cert: self.ca_cert(),
        })
    }

    /// `ovs-pki <args>` in the PKI's directory, its openssl output logged
    /// there (and quoted in the error: ovs-pki itself says nothing).
    fn ovs_pki(&self, args: &[&str]) -> Result<(), Error> {
        let path = require_program("ovs-pki")?;
        let log = self.dir.join("ovs-pki.log");
        let command = format!("ovs-pki {}", args.join(" "));
        let out = Command::new(&path)
            .arg(format!("--dir={}", self.dir.join("pki").display()))
            .arg(format!("--log={}", log.display()))
            .args(args)
            .current_dir(&self.dir)
            .output()
            .map_err(|source| Error::Io {
                what: format!("spawn `{command}`"),
                source,
            })?;
        if out.status.success() {
            return Ok(());
        }
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = logged.lines().rev().take(5).collect();
        Err(Error::Command {
            command,
            status: out.status.to_string(),
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ),
        })
    }
}

impl OvsdbServer {
    /// Creates `<dir>/<stem>.db` from the schema and starts a server on
    /// `<dir>/<stem>.sock`; no rows are created.
    pub fn start(kind: DbKind, dir: &Path) -> Result<Self, Error> {
        let stem = kind.stem();
        let db = dir.join(format!("{stem}.db"));
        let mut server = Self {
            kind,
            socket: dir.join(format!("{stem}.sock")),
            ctl: dir.join(format!("{stem}.ctl")),
            log: dir.join(format!("{stem}.log")),
            daemon: Daemon::new(
                &format!("ovsdb-server ({})", kind.db_name()),
                dir.join(format!("{stem}.pid")),
            ),
            db,
            ssl: None,
        };
        run(
            "ovsdb-tool",
            &["create", &path_str(&server.db), kind.schema()],
        )?;
        server.launch()?;
        Ok(server)
    }

    /// `Open_vSwitch` database with its root row (`ovs-vsctl --no-wait
    /// init`), as on a node before ovs-vswitchd starts.
    pub fn start_vswitch(dir: &Path) -> Result<Self, Error> {
        let s = Self::start(DbKind::Vswitch, dir)?;
        s.vsctl(&["init"])?;
        Ok(s)
    }

    /// `OVN_Northbound` database with its `NB_Global` row (`ovn-nbctl init`).
    pub fn start_nb(dir: &Path) -> Result<Self, Error> {
        let s = Self::start(DbKind::Northbound, dir)?;
        s.nbctl(&["init"])?;
        Ok(s)
    }

    /// `OVN_Southbound` database, empty: `ovn-northd` creates `SB_Global`
    /// (call [`OvsdbServer::sbctl`] with `init` to create it without northd).
    pub fn start_sb(dir: &Path) -> Result<Self, Error> {
        Self::start(DbKind::Southbound, dir)
    }

    fn launch(&mut self) -> Result<(), Error> {
        // A killed server leaves its socket file behind.
        remove_if_exists(&self.socket)?;
        let mut args = vec![
            path_str(&self.db),
            format!("--remote=punix:{}", self.socket.display()),
        ];
        args.extend(daemon_options(
            &self.ctl,
            &self.daemon,
            &self.log,
            self.ssl.as_ref(),
        ));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("ovsdb-server", &args)?;
        self.daemon.record_pid()
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// The unix socket clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// `unix:<socket>`, for `--db=` options and OVSDB clients.
    pub fn address(&self) -> String {
        format!("unix:{}", self.socket.display())
    }

    /// The database file (survives [`OvsdbServer::kill`]).
    pub fn db_path(&self) -> &Path {
        &self.db
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The `ovs-appctl -t` target.
    pub fn ctl_path(&self) -> &Path {
        &self.ctl
    }

    /// The server's PID while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.daemon.pid.filter(|p| alive(*p)).map(Pid::as_raw)
    }

    /// Whether the process is alive.
    pub fn is_running(&self) -> bool {
        self.daemon.is_running()
    }

    /// SIGKILL, as a crash: clients see the connection drop; the database
    /// file keeps committed data.
    pub fn kill(&mut self) -> Result<(), Error> {
        self.daemon.signal(Signal::SIGKILL)
    }

    /// SIGTERM (SIGKILL after 5 s).
    pub fn stop(&mut self) -> Result<(), Error> {
        self.daemon.signal(Signal::SIGTERM)
    }

    /// Stops the server if it runs, and starts it again on the same database
    /// file and socket path.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop()?;
        self.launch()
    }

    /// Restarts the server with `ssl`'s key, certificate and CA, and makes
    /// it listen for SSL at 127.0.0.1 on a free port; returns
    /// `ssl:127.0.0.1:<port>`. Not persisted across a later restart's
    /// remotes (the files are).
    pub fn serve_ssl(&mut self, ssl: SslFiles) -> Result<String, Error> {
        self.ssl = Some(ssl);
        self.restart()?;
        let address = self.add_remote("pssl")?;
        Ok(format!("ssl:{address}"))
    }

    /// Makes the running server also listen on TCP at 127.0.0.1 on a free
    /// port (`ovsdb-server/add-remote`); returns `tcp:127.0.0.1:<port>`.
    /// Not persisted across [`OvsdbServer::restart`].
    pub fn listen_tcp(&self) -> Result<String, Error> {
        Ok(format!("tcp:{}", self.add_remote("ptcp")?))
    }

    /// `ovsdb-server/add-remote <kind>:<free port>:127.0.0.1`, waited for
    /// until the port accepts; returns `127.0.0.1:<port>`.
    fn add_remote(&self, kind: &str) -> Result<String, Error> {
        // Ask the kernel for a free port, then hand it to the server. The
        // tiny window in between is acceptable for a test harness.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|source| Error::Io {
                what: "pick a free TCP port".into(),
                source,
            })?
            .port();
        run(
            "ovs-appctl",
            &[
                "-t",
                &path_str(&self.ctl),
                "ovsdb-server/add-remote",
                &format!("{kind}:{port}:127.0.0.1"),
            ],
        )?;
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(&address).is_err() {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("ovsdb-server listening on {address}"),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(address)
    }

    /// Runs `ovs-vsctl --db=<this> --no-wait args` (`--no-wait` because no
    /// ovs-vswitchd runs here to acknowledge changes).
    pub fn vsctl(&self, args: &[&str]) -> Result<String, Error> {
        let mut all = vec!["--no-wait"];
        all.extend_from_slice(args);
        self.ctl_tool("ovs-vsctl", &all)
    }

    /// Runs `ovn-nbctl --db=<this> args`.
    pub fn nbctl(&self, args: &[&str]) -> Result<String, Error> {
        self.ctl_tool("ovn-nbctl", args)
    }

    /// Runs `ovn-sbctl --db=<this> args`.
    pub fn sbctl(&self, args: &[&str]) -> Result<String, Error> {
        self.ctl_tool("ovn-sbctl", args)
    }

    fn ctl_tool(&self, program: &str, args: &[&str]) -> Result<String, Error> {
        let db = format!("--db={}", self.address());
        let mut all = vec![db.as_str(), "--timeout=10"];
        all.extend_from_slice(args);
        run(program, &all)
    }
}

/// A running `ovn-northd` between an NB and an SB server.
#[derive(Debug)]
pub struct Northd {
    nb: String,
    sb: String,
    ssl: Option<SslFiles>,
    ctl: PathBuf,
    log: PathBuf,
    daemon: Daemon,
}

impl Northd {
    /// Starts northd against `nb` and `sb`, with its files in `nb`'s
    /// directory. It creates `SB_Global` and mirrors `NB_Global.ipsec` into
    /// `SB_Global.ipsec` (~10 ms).
    pub fn start(nb: &OvsdbServer, sb: &OvsdbServer) -> Result<Self, Error> {
        Self::start_at(nb, (nb.address(), sb.address()), None)
    }

    /// [`Northd::start`] connected to the `remotes` (NB, SB) given, with
    /// `ssl`'s key, certificate and CA for `ssl:` ones.
    fn start_at(
        nb: &OvsdbServer,
        remotes: (String, String),
        ssl: Option<SslFiles>,
    ) -> Result<Self, Error> {
        let dir = nb.socket_path().parent().unwrap_or(Path::new("/tmp"));
        let mut n = Self {
            nb: remotes.0,
            sb: remotes.1,
            ssl,
            ctl: dir.join("northd.ctl"),
            log: dir.join("northd.log"),
            daemon: Daemon::new("ovn-northd", dir.join("northd.pid")),
        };
        n.launch()?;
        Ok(n)
    }

    fn launch(&mut self) -> Result<(), Error> {
        let mut args = vec![
            format!("--ovnnb-db={}", self.nb),
            format!("--ovnsb-db={}", self.sb),
        ];
        args.extend(daemon_options(
            &self.ctl,
            &self.daemon,
            &self.log,
            self.ssl.as_ref(),
        ));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("ovn-northd", &args)?;
        self.daemon.record_pid()
    }

    /// The daemon's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The daemon's PID while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.daemon.pid.filter(|p| alive(*p)).map(Pid::as_raw)
    }

    /// SIGKILL.
    pub fn kill(&mut self) -> Result<(), Error> {
        self.daemon.signal(Signal::SIGKILL)
    }

    /// SIGTERM (SIGKILL after 5 s).
    pub fn stop(&mut self) -> Result<(), Error> {
        self.daemon.signal(Signal::SIGTERM)
    }

    /// Stops (if running) and starts again with the same databases.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop()?;
        self.launch()
    }
}

/// NB and SB servers with `ovn-northd` between them, in one directory.
///
/// Dropped northd first, then the servers.
#[derive(Debug)]
pub struct OvnCentral {
    /// `ovn-northd`.
    pub northd: Northd,
    /// The northbound server (with `NB_Global`).
    pub nb: OvsdbServer,
    /// The southbound server.
    pub sb: OvsdbServer,
}

/// Where [`OvnCentral::start_ssl`] serves NB and SB over SSL, and a
/// client's files for them.
#[derive(Debug, Clone)]
pub struct SslRemotes {
    /// `ssl:127.0.0.1:<port>` of NB.
    pub nb: String,
    /// `ssl:127.0.0.1:<port>` of SB.
    pub sb: String,
    /// A client key and certificate of the same PKI, with its CA.
    pub client: SslFiles,
}

impl OvnCentral {
    /// Starts NB, SB and northd in `dir`.
    pub fn start(dir: &Path) -> Result<Self, Error> {
        let nb = OvsdbServer::start_nb(dir)?;
        let sb = OvsdbServer::start_sb(dir)?;
        let northd = Northd::start(&nb, &sb)?;
        Ok(Self { northd, nb, sb })
    }

    /// [`OvnCentral::start`] as Kube-OVN's `ENABLE_SSL` runs it: a PKI
    /// made by ovs-pki in `<dir>/tls`, NB and SB served over SSL with
    /// certificates of their own (their unix sockets stay, for the
    /// `*ctl` helpers), and ovn-northd connected to both over SSL.
    pub fn start_ssl(dir: &Path) -> Result<(Self, SslRemotes), Error> {
        let pki = OvsPki::create(&dir.join("tls"))?;
        let mut nb = OvsdbServer::start_nb(dir)?;
        let mut sb = OvsdbServer::start_sb(dir)?;
        let nb_remote = nb.serve_ssl(pki.issue("ovn-nb")?)?;
        let sb_remote = sb.serve_ssl(pki.issue("ovn-sb")?)?;
        let northd = Northd::start_at(
            &nb,
            (nb_remote.clone(), sb_remote.clone()),
            Some(pki.issue("ovn-northd")?),
        )?;
        let remotes = SslRemotes {
            nb: nb_remote,
            sb: sb_remote,
            client: pki.issue("controller")?,
        };
        Ok((Self { northd, nb, sb }, remotes))
    }

    /// Turns IPsec on or off the way the controller does — `NB_Global.ipsec`
    /// — and waits until ovn-northd has copied it to `SB_Global.ipsec`,
    /// which is what ovn-controller acts on.
    pub fn set_ipsec(&self, on: bool) -> Result<(), Error> {
        self.nb
            .nbctl(&["set", "NB_Global", ".", &format!("ipsec={on}")])?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self
                .sb
                .sbctl(&["--if-exists", "get", "SB_Global", ".", "ipsec"])
                .unwrap_or_default();
            if v.trim() == on.to_string() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("SB_Global.ipsec to follow NB_Global.ipsec={on} (ovn-northd)"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vswitch_starts_serves_and_stops_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let pid;
        {
            let mut s = OvsdbServer::start_vswitch(dir.path()).unwrap();
            pid = s.pid().unwrap();
            s.vsctl(&["set", "Open_vSwitch", ".", "other_config:x=1"])
                .unwrap();
            s.kill().unwrap();
            assert!(!s.is_running());
            s.restart().unwrap();
            assert_ne!(s.pid().unwrap(), pid);
            let v = s
                .vsctl(&["get", "Open_vSwitch", ".", "other_config:x"])
                .unwrap();
            assert_eq!(v.trim(), "\"1\"");
        }
        assert!(!alive(Pid::from_raw(pid)));
    }

    #[test]
    fn central_mirrors_ipsec() {
        let dir = tempfile::tempdir().unwrap();
        let c = OvnCentral::start(dir.path()).unwrap();
        c.set_ipsec(true).unwrap();
        c.set_ipsec(false).unwrap();
    }
}
