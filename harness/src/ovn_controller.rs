//! The ovn-controller side of the simulated nodes (any [`OvnNode`]): who
//! builds each node's tunnels in its OVSDB. [`OvnController`] names the player; either way it
//! runs on every node ([`OvnController::attach`]) and builds the tunnels
//! from SB — the other chassis' Geneve encaps and `SB_Global.ipsec` — and
//! the lease the node's agent publishes:
//!
//! - [`OvnController::Real`]: a patched `ovn-controller` binary (the
//!   project's `image/patches/ovn-controller-*.patch` applied; named by the
//!   caller, e.g. [`ENV_OVN_CONTROLLER`]): its chassis registered in SB by
//!   itself, the node's pod a logical switch port bound through `iface-id`,
//!   so pod traffic crosses OVN's logical pipeline.
//! - [`OvnController::Emulated`] (the default: no patched binary ships with
//!   this image): [`emulation`] registers the chassis and plays the
//!   patch's tunnel management from the same inputs, with a hand-written
//!   split horizon for forwarding instead of logical flows.
//!
//! The contract both fulfil: while `SB_Global.ipsec` is false, a plain
//! Geneve tunnel to every other chassis (no `remote_name`, no marks); while
//! it is true, every tunnel carries `remote_name` and the lease's marks,
//! set in one transaction, and without a usable lease no tunnel is built at
//! all; a lease change updates the marks; turning it false removes intent
//! and marks together. The harness only waits for what the player does
//! ([`OvnController::plain_mesh`], [`OvnController::give_intent`],
//! [`OvnController::take_intent`]).
//!
//! The tests whose subject is the lifecycle of a pair's IKE rather than
//! OVN (rotation, the coordination's barriers on the host) tie two nodes
//! together on request instead ([`OvnController::connect`],
//! [`OvnController::reconnect`]), writing what the emulation would; every
//! overlay test, the chaos suite's overlay and the lab run ovn-controller.
//!
//! With the emulation, the version the agent's capability gate asks
//! ovn-controller for is answered by stand-ins the node writes
//! ([`crate::cluster::write_capability_standins`]).

pub mod emulation;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube_ovn_ipsec_api::names::host::CAPABILITY_MARKER;
use kube_ovn_ipsec_api::names::ovs;
use testbed::ipsec::{IpsecError, IpsecNode, Tunnel};
use testbed::netns::wait_for;
use testbed::ovs::OvnCentral;

use emulation::{Emulation, EmulationConfig};

use crate::node::{SimNode, published_lease};

pub use crate::node::POD_PORT;

/// A node ovn-controller runs on: the harness's simulated node with its
/// agent, or a node of the runtime's own pieces (`ike_node`).
pub trait OvnNode {
    /// Its namespaces, switch and underlay address.
    fn ipsec_node(&self) -> &IpsecNode;
    /// Where ovn-controller's log goes (kept with the node's other logs).
    fn log_dir(&self) -> &Path;
}

impl<T: OvnNode> OvnNode for &T {
    fn ipsec_node(&self) -> &IpsecNode {
        (**self).ipsec_node()
    }
    fn log_dir(&self) -> &Path {
        (**self).log_dir()
    }
}

impl OvnNode for SimNode {
    fn ipsec_node(&self) -> &IpsecNode {
        &self.node
    }
    fn log_dir(&self) -> &Path {
        self.dir()
    }
}

/// The environment variable that names a patched `ovn-controller` binary
/// for [`OvnController::from_env`].
pub const ENV_OVN_CONTROLLER: &str = "KUBE_OVN_IPSEC_OVN_CONTROLLER";

/// The logical switch every simulated node's pod is a port of.
pub const LOGICAL_SWITCH: &str = "lab-pods";

/// How long ovn-controller gets to do what the harness waits for (a
/// chassis registered, tunnels built or changed) under qemu's TCG.
const REAL_WAIT: Duration = Duration::from_secs(60);

/// Who plays ovn-controller on the simulated nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OvnController {
    /// [`emulation`] plays the patched ovn-controller's tunnel management
    /// from SB and the node's OVSDB, with hand-written forwarding (not OVN
    /// logical flows); Geneve only.
    #[default]
    Emulated,
    /// The patched ovn-controller binary at this path runs on every node.
    Real {
        /// The binary (`ovn-controller` with the output-protection patch).
        binary: PathBuf,
        /// The first line of its `--version`, read once when it was
        /// checked.
        version: String,
    },
}

/// ovn-controller running on one node (the real process or the
/// emulation); stopped on drop.
#[derive(Debug)]
pub struct RunningOvnController {
    player: Player,
    log: PathBuf,
}

impl RunningOvnController {
    /// Its log: where it says what it built and why it built nothing.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

#[derive(Debug)]
enum Player {
    Process(Child),
    // Dropping it stops and joins its thread.
    Emulation(#[allow(dead_code)] Emulation),
}

impl Drop for RunningOvnController {
    fn drop(&mut self) {
        if let Player::Process(child) = &mut self.player {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn failed(what: impl Into<String>, detail: impl Into<String>) -> IpsecError {
    IpsecError::Failed {
        what: what.into(),
        detail: detail.into(),
    }
}

impl OvnController {
    /// [`OvnController::Real`] with the binary [`ENV_OVN_CONTROLLER`]
    /// names, [`OvnController::Emulated`] when it is unset or empty.
    pub fn from_env() -> Result<Self, IpsecError> {
        match std::env::var_os(ENV_OVN_CONTROLLER) {
            Some(path) if !path.is_empty() => Self::real(PathBuf::from(path)),
            _ => Ok(OvnController::Emulated),
        }
    }

    /// [`OvnController::Real`] with `binary`, once it advertises the output
    /// protection (`--version` has the marker line): a stock ovn-controller
    /// is refused here, by name, rather than by every agent.
    pub fn real(binary: PathBuf) -> Result<Self, IpsecError> {
        let version = version_of(&binary)?;
        if !version.lines().any(|l| l.trim() == CAPABILITY_MARKER) {
            return Err(failed(
                format!("{} as the real ovn-controller", binary.display()),
                format!(
                    "its --version has no line {CAPABILITY_MARKER:?} (not patched?): {version}"
                ),
            ));
        }
        let version = version.lines().next().unwrap_or_default().to_owned();
        Ok(OvnController::Real { binary, version })
    }

    /// Which ovn-controller this is, for the lab's report.
    pub fn describe(&self) -> String {
        match self {
            OvnController::Emulated => {
                "emulated (the harness plays the patched ovn-controller's tunnel management)".into()
            }
            OvnController::Real { binary, version } => {
                format!("real: {} ({version}, patched)", binary.display())
            }
        }
    }

    /// How a line of the lab's report names the player.
    pub fn name(&self) -> &'static str {
        match self {
            OvnController::Emulated => "emulated ovn-controller",
            OvnController::Real { .. } => "ovn-controller",
        }
    }

    /// What the agent on a node needs beyond its stand-ins: with a real
    /// ovn-controller, its capability gate probes the real binary and the
    /// running daemon's control socket ([`attach`](Self::attach) starts it
    /// there).
    pub fn agent_flags(&self) -> Vec<String> {
        match self {
            OvnController::Emulated => Vec::new(),
            OvnController::Real { binary, .. } => vec![
                "--ovn-controller".into(),
                binary.display().to_string(),
                "--ovs-appctl".into(),
                "ovs-appctl".into(),
                "--ovn-controller-ctl".into(),
                REAL_CTL.into(),
            ],
        }
    }

    /// Joins `n` to OVN and starts ovn-controller there, until its chassis
    /// is in SB. With `pod` (the address of the node's pod), traffic is
    /// forwarded between the pod port and the tunnels: real, the pod is a
    /// port of [`LOGICAL_SWITCH`] (addresses its MAC and `pod`) bound
    /// through `iface-id`; emulated, a split horizon (ovs-vswitchd must
    /// run). Real, the node's OVSDB names SB and its Geneve encap
    /// (`ovn-remote`, `ovn-encap-type`, `ovn-encap-ip`).
    pub fn attach<N: OvnNode>(
        &self,
        n: &N,
        central: &OvnCentral,
        pod: Option<std::net::Ipv4Addr>,
    ) -> Result<RunningOvnController, IpsecError> {
        let log = n.log_dir().join("ovn-controller-emulated.log");
        let player = match self {
            OvnController::Real { binary, .. } => return start_real(binary, n, central, pod),
            OvnController::Emulated => Player::Emulation(Emulation::start(EmulationConfig {
                chassis: n.ipsec_node().chassis().to_owned(),
                ip: n.ipsec_node().ip(),
                switch: n.ipsec_node().switch(),
                ovsdb: format!(
                    "unix:{}",
                    n.ipsec_node().run_path("openvswitch/db.sock").display()
                ),
                sb: central.sb.address(),
                forward: pod.map(|_| (n.ipsec_node().netns().entry(), POD_PORT.to_owned())),
                log: log.clone(),
            })?),
        };
        Ok(RunningOvnController { player, log })
    }

    /// Waits until every node has its plain tunnel (no intent, no marks)
    /// to every other, as ovn-controller builds them while
    /// `SB_Global.ipsec` is false.
    pub fn plain_mesh<N: OvnNode>(&self, nodes: &[N]) -> Result<(), IpsecError> {
        for a in nodes {
            self.wait_tunnels(a, peers(nodes, a), "a plain tunnel", no_intent)?;
        }
        Ok(())
    }

    /// Waits until every tunnel of `a` has its intent and the mark of
    /// `a`'s published lease, as ovn-controller gives them on
    /// `SB_Global.ipsec`; `Ok(false)` (and no wait) when `a` has no lease
    /// published.
    pub fn give_intent<N: OvnNode>(&self, nodes: &[N], a: &N) -> Result<bool, IpsecError> {
        let Some((mark, _)) = published_lease(a.ipsec_node()) else {
            return Ok(false);
        };
        let want = mark.to_string();
        self.wait_tunnels(a, peers(nodes, a), "intent and the lease's mark", |o| {
            o.contains_key(ovs::OPTION_REMOTE_NAME)
                && o.get(ovs::OPTION_EGRESS_PKT_MARK) == Some(&want)
        })?;
        Ok(true)
    }

    /// Waits until every tunnel of `a` is plain again, as ovn-controller
    /// leaves them when `SB_Global.ipsec` turns false.
    pub fn take_intent<N: OvnNode>(&self, nodes: &[N], a: &N) -> Result<(), IpsecError> {
        self.wait_tunnels(a, peers(nodes, a), "no intent and no mark", no_intent)
    }

    /// The name of `a`'s tunnel to `b`, once there is one.
    pub fn tunnel_name<N: OvnNode>(&self, a: &N, b: &N) -> Result<String, IpsecError> {
        read_tunnels(a)
            .and_then(|t| self.find_tunnel(&t, a, b).map(|t| t.name.clone()))
            .ok_or_else(|| {
                failed(
                    format!(
                        "{}'s tunnel to {}",
                        a.ipsec_node().chassis(),
                        b.ipsec_node().chassis()
                    ),
                    format!("{} has built none", self.name()),
                )
            })
    }

    /// `a`'s tunnel to `b` in `tunnels` (a read of `a`'s switch), if
    /// ovn-controller has built it: real, the port whose
    /// `external_ids:ovn-chassis-id` names `b`'s chassis and address
    /// (`<chassis>@<ip>`, followed by `%<local ip>` on newer OVN);
    /// emulated, the Interface named as OVN names them.
    fn find_tunnel<'t, N: OvnNode>(
        &self,
        tunnels: &'t [TunnelRow],
        a: &N,
        b: &N,
    ) -> Option<&'t TunnelRow> {
        match self {
            OvnController::Emulated => {
                let name = emulated_tunnel_name(b);
                tunnels.iter().find(|t| t.name == name)
            }
            OvnController::Real { .. } => {
                let id = format!("{}@{}", b.ipsec_node().chassis(), b.ipsec_node().ip());
                let newer = format!("{id}%{}", a.ipsec_node().ip());
                tunnels.iter().find(|t| {
                    t.chassis_id
                        .as_ref()
                        .is_some_and(|c| *c == id || *c == newer)
                })
            }
        }
    }

    /// Waits until `a` has its tunnel to every node of `to` and `done`
    /// holds for each one's options: one read of `a`'s switch per poll,
    /// since under qemu's TCG every spawned `ovs-vsctl` costs about half a
    /// second.
    fn wait_tunnels<'n, N: OvnNode + 'n>(
        &self,
        a: &N,
        to: impl Iterator<Item = &'n N> + Clone,
        what: &str,
        done: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> Result<(), IpsecError> {
        let mut missing = String::new();
        wait_for(REAL_WAIT, Duration::from_millis(100), || {
            let tunnels = read_tunnels(a)?;
            let not_yet: Vec<&str> = to
                .clone()
                .filter(|b| {
                    !self
                        .find_tunnel(&tunnels, a, b)
                        .is_some_and(|t| done(&t.options))
                })
                .map(|b| b.ipsec_node().chassis())
                .collect();
            missing = not_yet.join(", ");
            not_yet.is_empty().then_some(())
        })
        .ok_or_else(|| {
            failed(
                format!("{}'s tunnels to {missing}", a.ipsec_node().chassis()),
                format!(
                    "{} did not give them {what} within {REAL_WAIT:?}: {}",
                    self.name(),
                    a.ipsec_node().diagnostics()
                ),
            )
        })
    }

    /// The options of `a`'s tunnel to `b` as `ovs-vsctl` prints them.
    pub fn tunnel_options<N: OvnNode>(&self, a: &N, b: &N) -> Result<String, IpsecError> {
        let name = self.tunnel_name(a, b)?;
        a.ipsec_node()
            .vsctl(&["get", "Interface", &name, "options"])
            .map(|s| s.trim().to_string())
    }

    /// Adds each node's tunnel to the other, with intent and its published
    /// lease; an error when either has none (a tunnel with intent but
    /// without protection is what the patch never builds).
    pub fn connect<N: OvnNode>(&self, a: &N, b: &N) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.ipsec_node().add_tunnel(tunnel))
    }

    /// Gives each node's existing tunnel to the other its intent again,
    /// with its (new) lease: what the patch does when `SB_Global.ipsec`
    /// turns true again.
    pub fn reconnect<N: OvnNode>(&self, a: &N, b: &N) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.ipsec_node().protect_tunnel(tunnel))
    }

    /// `write`s each node's leased tunnel to the other, `a`'s first. Only
    /// the emulation builds a pair's tunnels on request.
    fn each_way<N: OvnNode>(
        &self,
        a: &N,
        b: &N,
        write: impl Fn(&N, &Tunnel) -> Result<(), IpsecError>,
    ) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for (n, peer) in [(a, b), (b, a)] {
                    write(n, &leased_tunnel(n, peer)?)?;
                }
                Ok(())
            }
            OvnController::Real { .. } => Err(failed(
                "a pair's tunnels on request",
                "a real ovn-controller builds its tunnels from SB",
            )),
        }
    }
}

/// How the agent names a real ovn-controller's control socket inside its
/// node: by program name, which `ovs-appctl -t` resolves through the
/// pidfile in `/run/openvswitch` (ovn-controller has no `--unixctl`; its
/// socket is `<OVS_RUNDIR>/ovn-controller.<pid>.ctl`).
const REAL_CTL: &str = "ovn-controller";

/// `binary --version`.
fn version_of(binary: &Path) -> Result<String, IpsecError> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| {
            failed(
                format!("running {} --version", binary.display()),
                e.to_string(),
            )
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ovn-<nbctl|sbctl> --db=<db> <args>`; its stdout.
fn ovn_ctl(tool: &str, db: &str, args: &[&str]) -> Result<String, IpsecError> {
    let out = Command::new(tool)
        .arg(format!("--db={db}"))
        .args(args)
        .output()
        .map_err(|e| failed(format!("running {tool}"), e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            format!("{tool} {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`OvnController::attach`] for a real ovn-controller.
fn start_real<N: OvnNode>(
    binary: &Path,
    n: &N,
    central: &OvnCentral,
    pod: Option<std::net::Ipv4Addr>,
) -> Result<RunningOvnController, IpsecError> {
    let node = n.ipsec_node();
    let chassis = node.chassis();
    node.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        &format!("external_ids:ovn-remote={}", central.sb.address()),
        "external_ids:ovn-encap-type=geneve",
        &format!("external_ids:ovn-encap-ip={}", node.ip()),
    ])?;
    if let Some(pod_ip) = pod {
        let lsp = format!("pod-{chassis}");
        let mac = node.vsctl(&["get", "Interface", POD_PORT, "mac_in_use"])?;
        let mac = mac.trim().trim_matches('"');
        let nb = central.nb.address();
        ovn_ctl("ovn-nbctl", &nb, &["--may-exist", "ls-add", LOGICAL_SWITCH])?;
        ovn_ctl(
            "ovn-nbctl",
            &nb,
            &["--may-exist", "lsp-add", LOGICAL_SWITCH, &lsp],
        )?;
        ovn_ctl(
            "ovn-nbctl",
            &nb,
            &["lsp-set-addresses", &lsp, &format!("{mac} {pod_ip}")],
        )?;
        node.vsctl(&[
            "set",
            "Interface",
            POD_PORT,
            &format!("external_ids:iface-id={lsp}"),
        ])?;
    }
    // Inside the node's namespaces, where /run/openvswitch is the node's:
    // its OVSDB, ovs-vswitchd's br-int.mgmt, and (OVS_RUNDIR) the pidfile
    // and control socket the agent's capability gate probes.
    let log = n.log_dir().join("ovn-controller.log");
    let stderr = n.log_dir().join("ovn-controller.stderr");
    let child = node
        .netns()
        .command(binary)
        .env("OVS_RUNDIR", "/run/openvswitch")
        .env("OVN_RUNDIR", "/run/openvswitch")
        .arg("unix:/run/openvswitch/db.sock")
        .arg("--pidfile=/run/openvswitch/ovn-controller.pid")
        .arg(format!("--log-file={}", log.display()))
        .arg("-vconsole:off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(&stderr)
                .map_err(|e| failed(format!("creating {}", stderr.display()), e.to_string()))?,
        )
        .spawn()
        .map_err(|e| {
            failed(
                format!("starting {} on {chassis}", binary.display()),
                e.to_string(),
            )
        })?;
    // Owned (killed on drop) before anything below can fail.
    let mut running = RunningOvnController {
        player: Player::Process(child),
        log: log.clone(),
    };
    let sb = central.sb.address();
    wait_for(REAL_WAIT, Duration::from_millis(200), || {
        let out = ovn_ctl(
            "ovn-sbctl",
            &sb,
            &[
                "--bare",
                "--columns=name",
                "find",
                "Chassis",
                &format!("name={chassis}"),
            ],
        )
        .ok()?;
        (out.trim() == chassis).then_some(())
    })
    .ok_or_else(|| {
        // One line: the report prints a reason on a line of its own.
        let tail = |p: &Path| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(8)..].join(" | ")
        };
        let exited = match &mut running.player {
            Player::Process(child) => child.try_wait(),
            Player::Emulation(_) => Ok(None),
        };
        let exited = match exited {
            Ok(Some(status)) => format!("it exited ({status})"),
            _ => "it runs".into(),
        };
        failed(
            format!("ovn-controller on {chassis}"),
            format!(
                "its chassis is not in SB after {REAL_WAIT:?}; {exited}; {}: {}; stderr: {}",
                log.display(),
                tail(&log),
                tail(&stderr)
            ),
        )
    })?;
    Ok(running)
}

/// A geneve tunnel as a node's switch has it.
struct TunnelRow {
    name: String,
    options: BTreeMap<String, String>,
    /// Its Port's `external_ids:ovn-chassis-id` (set by ovn-controller).
    chassis_id: Option<String>,
}

/// Every geneve tunnel of `n`'s switch, in one `ovs-vsctl` (Interfaces
/// and Ports); `None` when the read fails.
fn read_tunnels<N: OvnNode>(n: &N) -> Option<Vec<TunnelRow>> {
    let out = n
        .ipsec_node()
        .vsctl(&[
            "--format=json",
            "--columns=name,type,options",
            "list",
            "Interface",
            "--",
            "--columns=name,external_ids",
            "list",
            "Port",
        ])
        .ok()?;
    let mut tables = serde_json::Deserializer::from_str(&out).into_iter::<serde_json::Value>();
    let (interfaces, ports) = (tables.next()?.ok()?, tables.next()?.ok()?);
    let rows = |t: &serde_json::Value| t["data"].as_array().cloned().unwrap_or_default();
    let map = |v: &serde_json::Value| {
        ovsdb::Datum::from_json(v)
            .ok()
            .and_then(|d| d.as_string_map())
            .unwrap_or_default()
    };
    let chassis_ids: BTreeMap<String, String> = rows(&ports)
        .iter()
        .filter_map(|r| {
            let id = map(&r[1]).get("ovn-chassis-id").cloned()?;
            Some((r[0].as_str()?.to_owned(), id))
        })
        .collect();
    Some(
        rows(&interfaces)
            .iter()
            .filter(|r| r[1].as_str() == Some("geneve"))
            .filter_map(|r| {
                let name = r[0].as_str()?.to_owned();
                Some(TunnelRow {
                    chassis_id: chassis_ids.get(&name).cloned(),
                    options: map(&r[2]),
                    name,
                })
            })
            .collect(),
    )
}

/// Whether tunnel options carry none of the intent options.
fn no_intent(options: &BTreeMap<String, String>) -> bool {
    ovs::TUNNEL_PROTECTION_OPTIONS
        .iter()
        .all(|o| !options.contains_key(*o))
}

/// `n`'s tunnel to `peer` with `n`'s published lease as its marks.
fn leased_tunnel<N: OvnNode>(n: &N, peer: &N) -> Result<Tunnel, IpsecError> {
    let (mark, reqid) = published_lease(n.ipsec_node()).ok_or_else(|| IpsecError::Failed {
        what: format!(
            "the tunnel from {} to {}",
            n.ipsec_node().chassis(),
            peer.ipsec_node().chassis()
        ),
        detail: "no lease published: a tunnel with intent needs its protection".into(),
    })?;
    Ok(Tunnel {
        mark,
        reqid,
        ..Tunnel::to(peer.ipsec_node(), 0)
    })
}

/// The name the emulation gives a tunnel to `to`.
fn emulated_tunnel_name<N: OvnNode>(to: &N) -> String {
    Tunnel::to(to.ipsec_node(), 0).name
}

fn peers<'a, N: OvnNode>(nodes: &'a [N], a: &'a N) -> impl Iterator<Item = &'a N> + Clone {
    nodes
        .iter()
        .filter(move |b| b.ipsec_node().chassis() != a.ipsec_node().chassis())
}
