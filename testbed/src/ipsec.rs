//! Simulated IPsec nodes: strongSwan starter + charon and ovs-monitor-ipsec
//! over an ovsdb-server, each node in its own network and mount namespace.
//!
//! This is the production-shaped chain of `TESTBED.md` ("ovs-monitor-ipsec
//! with strongSwan starter, two nodes"): per node a [`Netns`] whose holder
//! binds the node's own `/run`, `/etc/ipsec.conf`, `/etc/ipsec.secrets`,
//! `/etc/ipsec.d` and `/etc/strongswan.d`; inside it `ovsdb-server` on
//! `punix:/run/openvswitch/db.sock`, `ipsec start --nofork` and
//! `<python> <monitor script> ... --no-restart-ike-daemon` in the foreground
//! (the interpreter of the script's `#!` line, as running it directly would).
//! No ovs-vswitchd: the monitor only reads the database.
//!
//! Typical use:
//! ```no_run
//! # use testbed::ipsec::*;
//! # fn main() -> Result<(), IpsecError> {
//! let ca = CaFiles::create("kube-ovn-ipsec test CA")?;
//! let (mut a, mut b) = IpsecNode::pair("koi-doc", "chass-a", "chass-b")?;
//! let script = std::path::Path::new(DEBIAN_MONITOR_SCRIPT);
//! a.start(&StartOptions::new(&ca, script))?;
//! b.start(&StartOptions::new(&ca, script))?;
//! a.add_tunnel(&Tunnel::to(&b, 0))?;
//! b.add_tunnel(&Tunnel::to(&a, 0))?;
//! # Ok(()) }
//! ```
//!
//! Every process and the namespace go away when the node is dropped.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::lease::PublishedLease;
use kube_ovn_ipsec_api::names::ovs;
use kube_ovn_ipsec_api::strongswan::{IkeSa, parse_status};
use kube_ovn_ipsec_api::test_util::{TestCa, TestKeyAlg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::netns::{self, Bind, Mounts, Netns, NetnsError, VethEnd};

/// Where Debian's openvswitch-ipsec installs the monitor.
pub const DEBIAN_MONITOR_SCRIPT: &str = "/usr/share/openvswitch/scripts/ovs-monitor-ipsec";

/// Default `ipsec_mark_out` of test tunnels (the lease's output mark).
pub const DEFAULT_MARK: u32 = 0x1000_0001;

/// Why an IPsec node operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IpsecError {
    /// A namespace or command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// Reading or writing a node file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A daemon did not come up in time.
    #[error("{what} not ready after {waited:?}; node logs:\n{diagnostics}")]
    NotReady {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// Log tails of the node, to see why.
        diagnostics: String,
    },
    /// A tool or daemon of the node failed.
    #[error("{what}: {detail}")]
    Failed {
        /// What failed.
        what: String,
        /// Its output or reason.
        detail: String,
    },
    /// The node was used before [`IpsecNode::start`].
    #[error("node {0} is not started")]
    NotStarted(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IpsecError + '_ {
    move |source| IpsecError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The workspace's one test CA (`api`'s, RSA-2048; Debian's
/// ovs-monitor-ipsec loads only RSA node keys into strongSwan, the patched
/// one any PKCS#8 key) written out as the PEM files strongSwan and the
/// monitor read.
#[derive(Debug)]
pub struct CaFiles {
    dir: tempfile::TempDir,
    /// The CA certificate (PEM), the trust bundle given to the nodes.
    pub cert: PathBuf,
    ca: TestCa,
}

/// A node certificate and key issued by a [`CaFiles`].
#[derive(Debug, Clone)]
pub struct NodeCert {
    /// Certificate (PEM), subject `/O=kube-ovn/CN=<chassis>`, SAN `DNS:<chassis>`.
    pub cert: PathBuf,
    /// Private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl CaFiles {
    /// Creates a self-signed CA with subject `/O=kube-ovn/CN=<cn>` and
    /// writes its certificate.
    pub fn create(cn: &str) -> Result<Self, IpsecError> {
        let dir = tempfile::Builder::new()
            .prefix("koi-ca-")
            .tempdir()
            .map_err(io_err(Path::new("/tmp")))?;
        let ca = TestCa::rsa(cn);
        let cert = dir.path().join("ca.pem");
        std::fs::write(&cert, ca.cert_pem()).map_err(io_err(&cert))?;
        Ok(Self { dir, cert, ca })
    }

    /// The CA itself (to verify or sign in-process).
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// Issues an RSA-2048 certificate for `chassis` with subject
    /// `/O=kube-ovn/CN=<chassis>` and SAN `DNS:<chassis>` — O before CN, so RFC 2253 renders
    /// `CN=<chassis>,O=kube-ovn` and the monitor's `CN=(.+?),` finds it
    /// (`TESTBED.md` defect 4) — and writes certificate and key.
    ///
    /// The SAN matters: the monitor sets `leftid=<CN>`, and strongSwan only
    /// uses an ID the certificate contains as subjectAltName — otherwise it
    /// falls back to the subject DN, which the peer's `rightid=<chassis>`
    /// does not match ("no matching peer config found").
    pub fn issue(&self, chassis: &str) -> Result<NodeCert, IpsecError> {
        self.issue_as(chassis, chassis)
    }

    /// [`CaFiles::issue`], written to `<stem>.pem` and `<stem>.key`: a
    /// renewed identity gets files of its own, as a new key-directory
    /// generation does.
    pub fn issue_as(&self, chassis: &str, stem: &str) -> Result<NodeCert, IpsecError> {
        self.issue_with(chassis, stem, TestKeyAlg::Rsa2048)
    }

    /// [`CaFiles::issue_as`] with a key of type `alg`.
    pub fn issue_with(
        &self,
        chassis: &str,
        stem: &str,
        alg: TestKeyAlg,
    ) -> Result<NodeCert, IpsecError> {
        let leaf = self.ca.issue(chassis, alg);
        let base = self.dir.path().join(stem);
        let key = base.with_extension("key");
        let cert = base.with_extension("pem");
        std::fs::write(&key, leaf.key_pem()).map_err(io_err(&key))?;
        std::fs::write(&cert, leaf.cert_pem()).map_err(io_err(&cert))?;
        Ok(NodeCert { cert, key })
    }
}

/// Writes the trust bundle of `cas`, in this order, as ONE PEM file at
/// `path` — what the key directory's `ca.pem` holds during a CA rotation
/// (`[old, new]`) and what the monitor's `other_config:ca_cert` names.
/// strongSwan loads only the first certificate of such a file.
pub fn write_trust_bundle(path: &Path, cas: &[&CaFiles]) -> Result<(), IpsecError> {
    let pem: String = cas.iter().map(|c| c.ca.cert_pem()).collect();
    std::fs::write(path, pem).map_err(io_err(path))
}

/// How [`IpsecNode::start`] runs the node.
#[derive(Debug, Clone)]
pub struct StartOptions<'a> {
    /// CA that issues this node's certificate; its certificate becomes the
    /// monitor's `other_config:ca_cert`.
    pub ca: &'a CaFiles,
    /// The ovs-monitor-ipsec script to run with `python3` (Debian's original
    /// or a patched copy).
    pub monitor_script: &'a Path,
    /// Write the `ovs.conf` that this script's `restart_ike_daemon()` would
    /// write into the node's `/etc/strongswan.d` before charon starts. The
    /// monitor runs with `--no-restart-ike-daemon`, so it never writes it
    /// itself; this shows what charon does with the script's settings.
    pub write_ovs_conf: bool,
    /// The node key's type.
    pub key_alg: TestKeyAlg,
    /// Arguments the monitor gets after the agent's own (a patched
    /// monitor's `--ike-lifetime` and the like); kept for its restarts.
    pub monitor_args: Vec<String>,
}

impl<'a> StartOptions<'a> {
    /// Runs `monitor_script` with an RSA certificate from `ca`; no
    /// `ovs.conf`, no extra monitor arguments.
    pub fn new(ca: &'a CaFiles, monitor_script: &'a Path) -> Self {
        Self {
            ca,
            monitor_script,
            write_ovs_conf: false,
            key_alg: TestKeyAlg::Rsa2048,
            monitor_args: Vec::new(),
        }
    }
}

/// A geneve tunnel Interface as ovn-controller (with the output-protection
/// options of the lease) would create it.
#[derive(Debug, Clone)]
pub struct Tunnel {
    /// Interface name, e.g. `ovn-chassb-0`.
    pub name: String,
    /// `options:remote_ip`.
    pub remote_ip: Ipv4Addr,
    /// `options:remote_name`: the peer's chassis (its certificate CN).
    pub remote_name: String,
    /// `options:ipsec_mark_out` (as `<mark>/0xffffffff`).
    pub mark: u32,
    /// `options:ipsec_reqid`.
    pub reqid: u32,
}

/// The name OVN gives its `n`th tunnel to `chassis`: `ovn-<chassis
/// without dashes>-<n>`.
pub fn tunnel_name(chassis: &str, n: u32) -> String {
    format!("ovn-{}-{n}", chassis.replace('-', ""))
}

impl Tunnel {
    /// `remote_name` plus the output-protection options, as `ovs-vsctl`
    /// `options:key=value` arguments: the lease's
    /// [`PublishedLease::intent_options`].
    pub fn protection_options(&self) -> [String; 4] {
        let lease = PublishedLease {
            mark: self.mark,
            reqid: self.reqid,
        };
        lease
            .intent_options(&self.remote_name)
            .map(|(key, value)| format!("options:{key}={value}"))
    }

    /// The tunnel to `peer` named like OVN names them (`ovn-<chassis
    /// without dashes>-<n>`), with [`DEFAULT_MARK`] and reqid 1.
    pub fn to(peer: &IpsecNode, n: u32) -> Self {
        Self {
            name: tunnel_name(&peer.chassis, n),
            remote_ip: peer.ip,
            remote_name: peer.chassis.clone(),
            mark: DEFAULT_MARK,
            reqid: 1,
        }
    }

    /// A tunnel to an address nobody answers on; adding and removing it
    /// makes the monitor refresh without touching real peers.
    pub fn unrelated(name: &str, remote_ip: Ipv4Addr) -> Self {
        Self {
            name: name.to_string(),
            remote_ip,
            remote_name: format!("{name}-peer"),
            mark: DEFAULT_MARK,
            reqid: 1,
        }
    }
}

/// A node's switch as whoever plays ovn-controller writes it: its OVSDB
/// through `ovs-vsctl` inside the node, and the underlay address its
/// tunnels start from. Copyable, so a thread can hold it while the node
/// stays owned elsewhere ([`IpsecNode::switch`]).
#[derive(Debug, Clone, Copy)]
pub struct Switch {
    entry: netns::Entry,
    local_ip: Ipv4Addr,
}

impl Switch {
    /// `ovs-vsctl --db=unix:/run/openvswitch/db.sock --no-wait <args>` in the
    /// node (ovs-vswitchd may not run, so never wait for it); returns stdout.
    pub fn vsctl(&self, args: &[&str]) -> Result<String, IpsecError> {
        let out = self.entry.run(
            "ovs-vsctl",
            ["--db=unix:/run/openvswitch/db.sock", "--no-wait"]
                .iter()
                .chain(args),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Adds `tunnel` as a geneve Interface on `br-int` with IPsec intent:
    /// `remote_name` and the output-protection options the patched
    /// ovn-controller sets (see [`Tunnel::protection_options`]).
    pub fn add_tunnel(&self, tunnel: &Tunnel) -> Result<(), IpsecError> {
        self.add_geneve(&tunnel.name, tunnel.remote_ip, &tunnel.protection_options())
    }

    /// Adds a geneve Interface `name` to `remote_ip` without IPsec intent
    /// (no `remote_name`, no marks): what ovn-controller creates while
    /// `SB_Global.ipsec` is false. Its traffic is plaintext and unmarked.
    pub fn add_plain_tunnel(&self, name: &str, remote_ip: Ipv4Addr) -> Result<(), IpsecError> {
        self.add_geneve(name, remote_ip, &[])
    }

    /// `ovs-vsctl add-port br-int <name>` as a geneve Interface to
    /// `remote_ip`, with `options` (`options:key=value`) in the same
    /// transaction.
    fn add_geneve(
        &self,
        name: &str,
        remote_ip: Ipv4Addr,
        options: &[String],
    ) -> Result<(), IpsecError> {
        let mut args = vec![
            "add-port".to_string(),
            "br-int".into(),
            name.into(),
            "--".into(),
            "set".into(),
            "Interface".into(),
            name.into(),
            "type=geneve".into(),
            format!("options:local_ip={}", self.local_ip),
            format!("options:remote_ip={remote_ip}"),
            "options:key=flow".into(),
        ];
        args.extend_from_slice(options);
        self.vsctl(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(())
    }

    /// Gives each of `tunnels` its intent and output-protection options,
    /// all in one transaction: as ovn-controller writes one engine run's
    /// changes, so the monitor sees them in one refresh.
    pub fn protect_tunnels(&self, tunnels: &[Tunnel]) -> Result<(), IpsecError> {
        let mut args: Vec<String> = Vec::new();
        for tunnel in tunnels {
            if !args.is_empty() {
                args.push("--".into());
            }
            args.extend(["set".to_string(), "Interface".into(), tunnel.name.clone()]);
            args.extend(tunnel.protection_options());
        }
        if args.is_empty() {
            return Ok(());
        }
        self.vsctl(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(())
    }

    /// Takes IPsec intent away from the Interfaces `names`: removes
    /// `remote_name` and the output-protection options, all in one
    /// transaction.
    pub fn unprotect_tunnels(&self, names: &[&str]) -> Result<(), IpsecError> {
        let mut args: Vec<&str> = Vec::new();
        for name in names {
            if !args.is_empty() {
                args.push("--");
            }
            args.extend(["remove", "Interface", name, "options"]);
            args.extend(ovs::TUNNEL_PROTECTION_OPTIONS);
        }
        if args.is_empty() {
            return Ok(());
        }
        self.vsctl(&args)?;
        Ok(())
    }

    /// Removes the tunnel Interface `name`.
    pub fn remove_tunnel(&self, name: &str) -> Result<(), IpsecError> {
        self.vsctl(&["del-port", "br-int", name])?;
        Ok(())
    }
}

/// The daemons of a started node.
#[derive(Debug)]
struct Daemons {
    ovsdb: Child,
    starter: Child,
    monitor: Child,
}

/// The foreign state [`IpsecNode::install_foreign_xfrm`] installs, as
/// `ip` arguments.
const FOREIGN_XFRM: [&str; 5] = [
    "xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 0x10000 mask 0xffff0000",
    "xfrm policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0x20 mask 0xf0",
    "xfrm policy add dir out src 10.97.0.1/32 dst 10.97.0.2/32 proto udp dport 6081 priority 100 mark 0x5 mask 0xff tmpl src 10.97.0.1 dst 10.97.0.2 proto esp reqid 3 mode transport",
    "xfrm state add src 10.97.0.1 dst 10.97.0.2 proto esp spi 0x5eed0001 reqid 3 mode transport mark 0x5 mask 0xff aead rfc4106(gcm(aes)) 0x0102030405060708091011121314151617181920 128",
    "xfrm state add src 10.97.0.2 dst 10.97.0.1 proto esp spi 0x5eed0002 reqid 4 mode transport aead rfc4106(gcm(aes)) 0x0102030405060708091011121314151617181920 128",
];

/// Nodes on one underlay segment ([`IpsecNode::mesh`]).
#[derive(Debug)]
pub struct Mesh {
    /// The nodes, in the order their chassis were given.
    pub nodes: Vec<IpsecNode>,
    // After the nodes (field order): the segment outlives their links.
    _switch: Netns,
}

/// One simulated node: its namespaces, files and (once started) daemons.
#[derive(Debug)]
pub struct IpsecNode {
    chassis: String,
    ip: Ipv4Addr,
    cert: Option<NodeCert>,
    daemons: Option<Daemons>,
    monitor_args: Vec<String>,
    // Dropped after the daemons (field order): processes first, then the
    // namespace, then the files.
    netns: Netns,
    dir: tempfile::TempDir,
}

/// `image/strongswan.d/zz-kube-ovn-ipsec.conf`: the plugins charon loads in
/// the image, so in every node here.
pub const CHARON_PLUGINS_CONF: &str =
    include_str!("../../image/strongswan.d/zz-kube-ovn-ipsec.conf");

impl IpsecNode {
    /// Creates the node's directory (`run/`, `etc/ipsec.conf`,
    /// `etc/ipsec.secrets`, `etc/ipsec.d/*`, a copy of `/etc/strongswan.d`
    /// with the image's plugin list, plus a charon file log at
    /// `/run/charon.log`, each line stamped with Unix seconds and
    /// milliseconds so it lines up with the probes' times) and its
    /// namespace.
    /// `ip` is the underlay address the node gets once linked.
    pub fn new(prefix: &str, chassis: &str, ip: Ipv4Addr) -> Result<Self, IpsecError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("koi-node-{chassis}-"))
            .tempdir()
            .map_err(io_err(Path::new("/tmp")))?;
        let root = dir.path();
        let mkdir = |p: PathBuf| std::fs::create_dir_all(&p).map_err(io_err(&p));
        mkdir(root.join("run/openvswitch"))?;
        for sub in [
            "aacerts",
            "acerts",
            "cacerts",
            "certs",
            "crls",
            "ocspcerts",
            "private",
            "reqs",
        ] {
            mkdir(root.join("etc/ipsec.d").join(sub))?;
        }
        let write = |p: PathBuf, text: &str| std::fs::write(&p, text).map_err(io_err(&p));
        write(root.join("etc/ipsec.conf"), "config setup\n")?;
        write(root.join("etc/ipsec.secrets"), "")?;
        netns::run(
            Command::new("cp")
                .args(["-a", "/etc/strongswan.d/."])
                .arg(root.join("etc/strongswan.d")),
        )?;
        // The image's plugin list (image/Dockerfile installs the same file).
        write(
            root.join("etc/strongswan.d/zz-kube-ovn-ipsec.conf"),
            CHARON_PLUGINS_CONF,
        )?;
        write(
            root.join("etc/strongswan.d/zz-testbed-log.conf"),
            "charon {\n  filelog {\n    testbed {\n      path = /run/charon.log\n      \
             time_format = %s\n      time_add_ms = yes\n      default = 1\n      ike = 2\n      \
             cfg = 2\n      flush_line = yes\n      append = no\n    }\n  }\n}\n",
        )?;
        let etc = root.join("etc");
        let mounts = Mounts {
            run: Some(root.join("run")),
            binds: ["ipsec.conf", "ipsec.secrets", "ipsec.d", "strongswan.d"]
                .iter()
                .map(|f| Bind::new(etc.join(f), Path::new("/etc").join(f)))
                .collect(),
        };
        let netns = Netns::create_with_mounts(prefix, &mounts)?;
        Ok(Self {
            chassis: chassis.to_string(),
            ip,
            cert: None,
            daemons: None,
            monitor_args: Vec::new(),
            netns,
            dir,
        })
    }

    /// Two nodes on a veth pair `eth0`, `10.77.0.1/24` and `10.77.0.2/24`
    /// (every pair lives in namespaces of its own, so pairs of parallel tests
    /// can reuse the addresses).
    pub fn pair(
        prefix: &str,
        chassis_a: &str,
        chassis_b: &str,
    ) -> Result<(Self, Self), IpsecError> {
        let a = Self::new(prefix, chassis_a, Ipv4Addr::new(10, 77, 0, 1))?;
        let b = Self::new(prefix, chassis_b, Ipv4Addr::new(10, 77, 0, 2))?;
        netns::veth_pair(
            VethEnd {
                netns: &a.netns,
                ifname: "eth0",
                cidr: &format!("{}/24", a.ip),
            },
            VethEnd {
                netns: &b.netns,
                ifname: "eth0",
                cidr: &format!("{}/24", b.ip),
            },
        )?;
        Ok((a, b))
    }

    /// Nodes on one underlay segment: a Linux bridge in a namespace of its
    /// own, node `i` on it as `eth0` with `10.77.0.<i+1>/24`. For more than
    /// two nodes (a pair needs no switch: [`IpsecNode::pair`]).
    pub fn mesh(prefix: &str, chassis: &[&str]) -> Result<Mesh, IpsecError> {
        if chassis.is_empty() || chassis.len() > 200 {
            return Err(IpsecError::Failed {
                what: "a mesh".into(),
                detail: format!("has 1..=200 nodes, not {}", chassis.len()),
            });
        }
        let switch = Netns::create(&format!("{prefix}-sw"))?;
        switch.ip(["link", "add", "br0", "type", "bridge"])?;
        switch.ip(["link", "set", "br0", "up"])?;
        let mut nodes = Vec::new();
        for (i, c) in chassis.iter().enumerate() {
            let ip = Ipv4Addr::new(10, 77, 0, u8::try_from(i + 1).unwrap_or(u8::MAX));
            let node = Self::new(prefix, c, ip)?;
            let port = format!("p{i}");
            netns::run(Command::new("ip").args([
                "link",
                "add",
                "eth0",
                "netns",
                node.netns.name(),
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                switch.name(),
            ]))?;
            node.netns
                .ip(["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            node.netns.ip(["link", "set", "eth0", "up"])?;
            node.netns.ip(["link", "set", "lo", "up"])?;
            switch.ip(["link", "set", &port, "master", "br0"])?;
            switch.ip(["link", "set", &port, "up"])?;
            nodes.push(node);
        }
        Ok(Mesh {
            nodes,
            _switch: switch,
        })
    }

    /// The chassis name (certificate CN, peers' `remote_name`).
    pub fn chassis(&self) -> &str {
        &self.chassis
    }

    /// The underlay address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The node's namespaces.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The host directory holding the node's `run/` and `etc/`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The host path of the node's `/run/<rel>`.
    pub fn run_path(&self, rel: &str) -> PathBuf {
        self.dir.path().join("run").join(rel)
    }

    /// The host path of the node's `/etc/<rel>` (only the bound files).
    pub fn etc_path(&self, rel: &str) -> PathBuf {
        self.dir.path().join("etc").join(rel)
    }

    /// Starts ovsdb-server, initialises the database (bridge `br-int`, PKI
    /// paths in `other_config`), starts `ipsec start --nofork` and waits for
    /// charon, then starts the monitor and waits for its control socket.
    pub fn start(&mut self, opts: &StartOptions<'_>) -> Result<(), IpsecError> {
        let cert = opts
            .ca
            .issue_with(&self.chassis, &self.chassis, opts.key_alg)?;
        self.monitor_args.clone_from(&opts.monitor_args);
        let db = self.dir.path().join("conf.db");
        netns::run(
            Command::new("ovsdb-tool")
                .arg("create")
                .arg(&db)
                .arg("/usr/share/openvswitch/vswitch.ovsschema"),
        )?;
        let ovsdb = self.spawn(
            "ovsdb-server",
            &[
                db.to_string_lossy().as_ref(),
                "--remote=punix:/run/openvswitch/db.sock",
                "--unixctl=/run/openvswitch/ovsdb-server.ctl",
                "--pidfile=/run/openvswitch/ovsdb-server.pid",
                "--log-file=/run/ovsdb-server.log",
                "--no-chdir",
            ],
            "ovsdb-server.out",
        )?;
        // Held in a partial Daemons-like guard: kill what started if a later
        // step fails, so nothing outlives the error.
        let mut started = vec![ovsdb];
        let result = self.start_rest(opts, &cert, &mut started);
        match result {
            Ok((starter, monitor)) => {
                let ovsdb = started.remove(0);
                self.daemons = Some(Daemons {
                    ovsdb,
                    starter,
                    monitor,
                });
                self.cert = Some(cert);
                Ok(())
            }
            Err(e) => {
                for mut child in started {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Err(e)
            }
        }
    }

    fn start_rest(
        &self,
        opts: &StartOptions<'_>,
        cert: &NodeCert,
        started: &mut Vec<Child>,
    ) -> Result<(Child, Child), IpsecError> {
        let sock = self.run_path("openvswitch/db.sock");
        self.wait_ready("ovsdb-server socket", Duration::from_secs(10), || {
            sock.exists()
        })?;
        self.vsctl(&["init"])?;
        self.vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("other_config:certificate={}", cert.cert.display()),
            &format!("other_config:private_key={}", cert.key.display()),
            &format!("other_config:ca_cert={}", opts.ca.cert.display()),
        ])?;
        self.vsctl(&["add-br", "br-int"])?;

        if opts.write_ovs_conf {
            let conf = strongswan_conf_of(opts.monitor_script)?;
            let path = self.etc_path("strongswan.d/ovs.conf");
            std::fs::write(&path, conf).map_err(io_err(&path))?;
        }
        let starter = self.spawn("ipsec", &["start", "--nofork"], "starter.out")?;
        started.push(starter);
        let (pid, ctl) = (self.run_path("charon.pid"), self.run_path("charon.ctl"));
        self.wait_ready(
            "charon (charon.pid, charon.ctl)",
            Duration::from_secs(15),
            || pid.exists() && ctl.exists(),
        )?;

        let monitor = self.spawn_monitor(opts.monitor_script)?;
        started.push(monitor);
        let monitor = started
            .pop()
            .ok_or_else(|| IpsecError::NotStarted(self.chassis.clone()))?;
        let starter = started
            .pop()
            .ok_or_else(|| IpsecError::NotStarted(self.chassis.clone()))?;
        Ok((starter, monitor))
    }

    /// Starts ovs-monitor-ipsec (`script`) in the node the way the agent
    /// does and waits for its control socket. On a failed wait the monitor
    /// is killed, so nothing outlives the error.
    fn spawn_monitor(&self, script: &Path) -> Result<Child, IpsecError> {
        let python = interpreter_of(script)?;
        let script = script.to_string_lossy();
        let mut args = vec![
            script.as_ref(),
            "unix:/run/openvswitch/db.sock",
            "--ike-daemon=strongswan",
            "--no-restart-ike-daemon",
            "--pidfile=/run/openvswitch/ovs-monitor-ipsec.pid",
            "--log-file=/run/ovs-monitor-ipsec.log",
        ];
        args.extend(self.monitor_args.iter().map(String::as_str));
        let mut monitor = self.spawn(&python, &args, "ovs-monitor-ipsec.out")?;
        let ctl = self.run_path(&format!(
            "openvswitch/ovs-monitor-ipsec.{}.ctl",
            monitor.id()
        ));
        if let Err(e) = self.wait_ready(
            "ovs-monitor-ipsec control socket",
            Duration::from_secs(15),
            || ctl.exists(),
        ) {
            let _ = monitor.kill();
            let _ = monitor.wait();
            return Err(e);
        }
        Ok(monitor)
    }

    /// Kills the node's ovs-monitor-ipsec (SIGKILL, as a crash would),
    /// points OVSDB at `cert` if given (a renewal the monitor did not see
    /// happen), and starts a new monitor from `script`. charon and its SAs
    /// stay.
    pub fn restart_monitor(
        &mut self,
        script: &Path,
        cert: Option<NodeCert>,
    ) -> Result<(), IpsecError> {
        let Some(d) = self.daemons.as_mut() else {
            return Err(IpsecError::NotStarted(self.chassis.clone()));
        };
        let _ = d.monitor.kill();
        let _ = d.monitor.wait();
        if let Some(cert) = cert {
            self.renew(cert)?;
        }
        let monitor = self.spawn_monitor(script)?;
        if let Some(d) = self.daemons.as_mut() {
            d.monitor = monitor;
        }
        Ok(())
    }

    /// Spawns `program args` inside the node, stdout and stderr to
    /// `<dir>/<log>` (files, not pipes: nobody reads them while it runs).
    fn spawn(&self, program: &str, args: &[&str], log: &str) -> Result<Child, IpsecError> {
        let path = self.dir.path().join(log);
        let out = std::fs::File::create(&path).map_err(io_err(&path))?;
        let err = out.try_clone().map_err(io_err(&path))?;
        let mut cmd = self.netns.command(program);
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        cmd.spawn().map_err(|source| {
            IpsecError::Netns(NetnsError::Spawn {
                command: netns::describe(&cmd),
                source,
            })
        })
    }

    fn wait_ready(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), IpsecError> {
        netns::wait_for(timeout, Duration::from_millis(20), || ready().then_some(())).ok_or_else(
            || IpsecError::NotReady {
                what: format!("{}: {what}", self.chassis),
                waited: timeout,
                diagnostics: self.diagnostics(),
            },
        )
    }

    /// The node's switch, for writing its tunnels ([`Switch`]).
    pub fn switch(&self) -> Switch {
        Switch {
            entry: self.netns.entry(),
            local_ip: self.ip,
        }
    }

    /// `ovs-vsctl --db=unix:/run/openvswitch/db.sock --no-wait <args>` in the
    /// node ([`Switch::vsctl`]).
    pub fn vsctl(&self, args: &[&str]) -> Result<String, IpsecError> {
        self.switch().vsctl(args)
    }

    /// Adds `tunnel` with IPsec intent ([`Switch::add_tunnel`]).
    pub fn add_tunnel(&self, tunnel: &Tunnel) -> Result<(), IpsecError> {
        self.switch().add_tunnel(tunnel)
    }

    /// Adds a tunnel without IPsec intent ([`Switch::add_plain_tunnel`]).
    pub fn add_plain_tunnel(&self, name: &str, remote_ip: Ipv4Addr) -> Result<(), IpsecError> {
        self.switch().add_plain_tunnel(name, remote_ip)
    }

    /// Gives a tunnel IPsec intent ([`Switch::protect_tunnels`]).
    pub fn protect_tunnel(&self, tunnel: &Tunnel) -> Result<(), IpsecError> {
        self.switch().protect_tunnels(std::slice::from_ref(tunnel))
    }

    /// Takes IPsec intent away from a tunnel ([`Switch::unprotect_tunnels`]).
    pub fn unprotect_tunnel(&self, name: &str) -> Result<(), IpsecError> {
        self.switch().unprotect_tunnels(&[name])
    }

    /// Removes a tunnel ([`Switch::remove_tunnel`]).
    pub fn remove_tunnel(&self, name: &str) -> Result<(), IpsecError> {
        self.switch().remove_tunnel(name)
    }

    /// Runs `ipsec <args>` in the node and returns stdout. The exit code of
    /// `ipsec up` is 0 even when it fails: check state, not this.
    pub fn ipsec(&self, args: &[&str]) -> Result<String, IpsecError> {
        let out = self.netns.run("ipsec", args)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The node's IKE_SAs (`ipsec statusall`).
    pub fn ike_sas(&self) -> Result<Vec<IkeSa>, IpsecError> {
        Ok(parse_status(&self.ipsec(&["statusall"])?).ike_sas)
    }

    /// Connections starter has routed (trap policies installed), from the
    /// `<conn>{<n>}:  ROUTED` lines of `ipsec status`.
    pub fn routed_conns(&self) -> Result<Vec<String>, IpsecError> {
        Ok(self
            .ipsec(&["status"])?
            .lines()
            .filter_map(|l| {
                let (head, rest) = l.trim().split_once(": ")?;
                rest.trim_start().starts_with("ROUTED").then_some(head)?;
                Some(head.rsplit_once('{').map_or(head, |(c, _)| c).to_string())
            })
            .collect())
    }

    /// Waits until an IKE_SA whose connection starts with `conn_prefix` is
    /// `ESTABLISHED`; returns it, or `None` after `timeout`.
    pub fn wait_established(&self, conn_prefix: &str, timeout: Duration) -> Option<IkeSa> {
        netns::wait_for(timeout, Duration::from_millis(20), || {
            self.ike_sas()
                .ok()?
                .into_iter()
                .find(|sa| sa.conn.starts_with(conn_prefix) && sa.state == "ESTABLISHED")
        })
    }

    /// Sends one UDP datagram to `dst:port` from a socket with `SO_MARK =
    /// mark`, inside the node — what a geneve packet of a protected tunnel
    /// looks like to the `dir out` trap policy, so the kernel ACQUIREs.
    pub fn send_marked_udp(&self, dst: Ipv4Addr, port: u16, mark: u32) -> Result<(), IpsecError> {
        // SO_MARK is 36 on Linux; Python's socket module may not name it.
        let code = format!(
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.SOL_SOCKET, 36, {mark})\n\
             try:\n    s.sendto(b'koi', ('{dst}', {port}))\nexcept OSError:\n    pass\n"
        );
        self.netns.run(SYSTEM_PYTHON, ["-c", &code])?;
        Ok(())
    }

    /// Flushes the XFRM states of this node's namespace only — clears the
    /// larval ACQUIRE state a failed CHILD_SA leaves, which would suppress
    /// new ACQUIREs (`TESTBED.md` defect 3).
    pub fn flush_xfrm_states(&self) -> Result<(), IpsecError> {
        self.netns.ip(["xfrm", "state", "flush"])?;
        Ok(())
    }

    /// `ip xfrm policy list` and `ip xfrm state list` of this node's
    /// namespace, verbatim: what "left as it was" is compared with.
    pub fn xfrm_dump(&self) -> Result<String, IpsecError> {
        let p = self.netns.ip(["xfrm", "policy", "list"])?;
        let s = self.netns.ip(["xfrm", "state", "list"])?;
        Ok(format!("{p}\n--- states ---\n{s}"))
    }

    /// The SPIs (`0x…`, as `ip xfrm state` prints them) of the ESP states
    /// in the node's kernel, only those with `reqid` when given (a lease's
    /// SAs, not the foreign state beside them).
    pub fn esp_spis(&self, reqid: Option<u32>) -> Result<BTreeSet<String>, IpsecError> {
        Ok(esp_spis_of(
            &self.netns.ip(["xfrm", "state", "list"])?,
            reqid,
        ))
    }

    /// Installs XFRM state this project never made, as another IPsec user
    /// of the host would: policies at the guards' priority and selector
    /// whose marks differ from a lease's only under their masks, an ESP
    /// policy, and ESP states with a reqid neighbour, on addresses nothing
    /// routes (`10.97.0.0/24`). Allocation must avoid aliasing them and
    /// nothing may touch them.
    pub fn install_foreign_xfrm(&self) -> Result<(), IpsecError> {
        for args in FOREIGN_XFRM {
            let args: Vec<&str> = args.split_whitespace().collect();
            self.netns.ip(&args)?;
        }
        Ok(())
    }

    /// Installs the CA workaround an unpatched monitor needs: the trust
    /// bundle into `/etc/ipsec.d/cacerts/` and `ipsec rereadcacerts`.
    pub fn install_ca_workaround(&self, ca_cert: &Path) -> Result<(), IpsecError> {
        let dst = self.etc_path("ipsec.d/cacerts/kube-ovn-ipsec-ca.pem");
        std::fs::copy(ca_cert, &dst).map_err(io_err(&dst))?;
        self.ipsec(&["rereadcacerts"])?;
        Ok(())
    }

    /// The file names in the node's `/etc/ipsec.d/cacerts`, sorted.
    pub fn cacerts_files(&self) -> Result<Vec<String>, IpsecError> {
        let dir = self.etc_path("ipsec.d/cacerts");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// `ovs-appctl -t ovs-monitor-ipsec tunnels/show`. The monitor answers
    /// control requests only between main-loop iterations, so a reply also
    /// means its last refresh (including any `ipsec stroke down-nb`) is done.
    pub fn monitor_show(&self) -> Result<String, IpsecError> {
        self.monitor_command("tunnels/show")
    }

    /// Runs `command` on the node's ovs-monitor-ipsec (`ovs-appctl`), its
    /// reply.
    pub fn monitor_command(&self, command: &str) -> Result<String, IpsecError> {
        let out = self
            .netns
            .run("ovs-appctl", ["-t", "ovs-monitor-ipsec", command])?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Points OVSDB at `cert` (certificate and key in one transaction), as
    /// the agent's activation of a renewed identity does; a running
    /// monitor sees it at once.
    pub fn renew(&mut self, cert: NodeCert) -> Result<(), IpsecError> {
        self.vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("other_config:certificate={}", cert.cert.display()),
            &format!("other_config:private_key={}", cert.key.display()),
        ])?;
        self.cert = Some(cert);
        Ok(())
    }

    /// The monitor's log so far.
    pub fn monitor_log(&self) -> String {
        std::fs::read_to_string(self.run_path("ovs-monitor-ipsec.log")).unwrap_or_default()
    }

    /// charon's log so far (`/run/charon.log`, levels ike/cfg 2).
    pub fn charon_log(&self) -> String {
        std::fs::read_to_string(self.run_path("charon.log")).unwrap_or_default()
    }

    /// `/proc/sys/net/core/xfrm_acq_expires` of the node's network
    /// namespace: charon's kernel-netlink plugin writes its
    /// `xfrm_acq_expires` setting there at start-up.
    pub fn xfrm_acq_expires(&self) -> Result<u32, IpsecError> {
        let out = self
            .netns
            .run("cat", ["/proc/sys/net/core/xfrm_acq_expires"])?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().map_err(|_| IpsecError::Io {
            path: PathBuf::from("/proc/sys/net/core/xfrm_acq_expires"),
            source: std::io::Error::other(format!("not a number: {text:?}")),
        })
    }

    /// The last lines of the node's logs, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut s = String::new();
        for log in [
            "run/ovs-monitor-ipsec.log",
            "ovs-monitor-ipsec.out",
            "run/charon.log",
            "starter.out",
            "ovsdb-server.out",
        ] {
            let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(25)..];
            s += &format!(
                "--- {} {log} (last {} lines)\n{}\n",
                self.chassis,
                tail.len(),
                tail.join("\n")
            );
        }
        s
    }
}

impl Drop for IpsecNode {
    fn drop(&mut self) {
        let Some(mut d) = self.daemons.take() else {
            return;
        };
        // SIGTERM: starter stops charon gracefully (it removes its policies);
        // the netns drop SIGKILLs whatever is left after the grace period.
        for child in [&mut d.monitor, &mut d.starter, &mut d.ovsdb] {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for child in [&mut d.monitor, &mut d.starter, &mut d.ovsdb] {
            while Instant::now() < deadline {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The image's patch of Debian's ovs-monitor-ipsec (`image/patches/`).
pub fn monitor_patch_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../image/patches/ovs-monitor-ipsec-3.1.patch")
}

/// Runs `patch --fuzz=0` with [`monitor_patch_file`] on a copy of Debian's
/// script in `dir` (`--dry-run` when asked); returns patch's output, which
/// the caller judges, and the copy's path.
pub fn apply_monitor_patch(
    dir: &Path,
    dry_run: bool,
) -> Result<(std::process::Output, PathBuf), IpsecError> {
    let target = dir.join("ovs-monitor-ipsec");
    std::fs::copy(DEBIAN_MONITOR_SCRIPT, &target).map_err(io_err(&target))?;
    let patch = monitor_patch_file();
    let input = std::fs::File::open(&patch).map_err(io_err(&patch))?;
    let program = crate::require_program("patch").map_err(|e| IpsecError::Failed {
        what: "patching ovs-monitor-ipsec".into(),
        detail: e.to_string(),
    })?;
    let mut cmd = Command::new(program);
    cmd.args(["--fuzz=0", "--no-backup-if-mismatch"]);
    if dry_run {
        cmd.arg("--dry-run");
    }
    let out = cmd
        .arg(&target)
        .stdin(input)
        .output()
        .map_err(io_err(&target))?;
    Ok((out, target))
}

/// The patched copy of Debian's script, made once per process in
/// `scratch/monitor-patch-<pid>` (copies of processes that are gone are
/// removed first; a static never drops, so a temporary directory would
/// leak into /tmp on every run).
pub fn patched_monitor_script(scratch: &Path) -> Result<&'static Path, IpsecError> {
    static PATH: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let made = PATH.get_or_init(|| {
        for entry in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("monitor-patch-")
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = scratch.join(format!("monitor-patch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (out, path) = apply_monitor_patch(&dir, false).map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(path)
        } else {
            Err(format!(
                "patch failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    match made {
        Ok(p) => Ok(p.as_path()),
        Err(detail) => Err(IpsecError::Failed {
            what: "patching ovs-monitor-ipsec".into(),
            detail: detail.clone(),
        }),
    }
}

/// The Python that has Debian's `python3-openvswitch` (`import ovs`); a
/// `python3` earlier on `PATH` (pyenv, venv) usually does not.
pub const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// The interpreter of `script`'s `#!` line (what running the script
/// directly would use), or [`SYSTEM_PYTHON`] when it has none.
pub fn interpreter_of(script: &Path) -> Result<String, IpsecError> {
    let text = std::fs::read_to_string(script).map_err(io_err(script))?;
    Ok(text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!"))
        .and_then(|l| l.split_whitespace().next())
        .map_or_else(|| SYSTEM_PYTHON.to_string(), str::to_string))
}

/// The `ovs.conf` text `script`'s `StrongSwanHelper.restart_ike_daemon()`
/// writes, read by importing the script with `python3`.
pub fn strongswan_conf_of(script: &Path) -> Result<String, IpsecError> {
    const CODE: &str = "import importlib.machinery, importlib.util, sys\n\
        loader = importlib.machinery.SourceFileLoader('ovs_monitor_ipsec', sys.argv[1])\n\
        spec = importlib.util.spec_from_loader('ovs_monitor_ipsec', loader)\n\
        m = importlib.util.module_from_spec(spec)\n\
        loader.exec_module(m)\n\
        sys.stdout.write(m.StrongSwanHelper.STRONGSWAN_CONF)\n";
    let python = interpreter_of(script)?;
    let out = netns::run(Command::new(python).arg("-c").arg(CODE).arg(script))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The ESP SPIs in an `ip xfrm state list` text, only those of `reqid`
/// when given: each state's `proto esp spi 0x… reqid N` line.
pub fn esp_spis_of(states: &str, reqid: Option<u32>) -> BTreeSet<String> {
    states
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let after = |key: &str| t.iter().position(|w| *w == key).and_then(|i| t.get(i + 1));
            if after("proto") != Some(&"esp") {
                return None;
            }
            let spi = after("spi")?;
            let r = after("reqid").and_then(|r| r.parse::<u32>().ok());
            (reqid.is_none() || r == reqid).then(|| (*spi).to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::esp_spis_of;

    const STATES: &str = "\
src 10.77.0.1 dst 10.77.0.2
\tproto esp spi 0xc1a2b3c4 reqid 4096 mode transport
\treplay-window 0
src 10.97.0.1 dst 10.97.0.2
\tproto esp spi 0x00001000 reqid 4097 mode transport
src 10.77.0.2 dst 10.77.0.1
\tproto esp spi 0xcafe0001 reqid 4096 mode transport
";

    #[test]
    fn esp_spis_by_reqid() {
        let all = esp_spis_of(STATES, None);
        assert_eq!(all.len(), 3);
        let lease: Vec<String> = esp_spis_of(STATES, Some(4096)).into_iter().collect();
        assert_eq!(lease, ["0xc1a2b3c4", "0xcafe0001"]);
        assert!(esp_spis_of(STATES, Some(1)).is_empty());
    }
}
