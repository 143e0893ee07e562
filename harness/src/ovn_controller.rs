//! The ovn-controller side of the simulated nodes: who builds each node's
//! tunnels in its OVSDB. [`OvnController`] names the player:
//!
//! - [`OvnController::Real`]: a patched `ovn-controller` binary (the
//!   project's `image/patches/ovn-controller-*.patch` applied; named by the
//!   caller, e.g. [`ENV_OVN_CONTROLLER`]) runs on every node: its chassis
//!   registered in SB with a Geneve encap, the node's pod a logical switch
//!   port bound through `iface-id`, so pod traffic crosses OVN's logical
//!   pipeline and the tunnels are the ones ovn-controller builds itself
//!   from SB. The harness only waits for what it does.
//! - [`OvnController::Emulated`] (the default: no patched binary ships with
//!   this image) plays the patch's tunnel management, and nothing more:
//!
//! - While `SB_Global.ipsec` is false: a plain Geneve tunnel to every other
//!   chassis (no `remote_name`, no marks) and OVN-like forwarding between
//!   the pod port and the tunnels ([`OvnController::plain_mesh`]).
//! - When it turns true: every tunnel gains its intent — `remote_name` and
//!   the owning node's published lease as `ipsec_mark_out`/`ipsec_reqid`
//!   (and the packet mark) — in one transaction per tunnel; a chassis whose
//!   lease is not published gets no intent (the patch never builds a tunnel
//!   with intent but without protection) ([`OvnController::give_intent`],
//!   [`OvnController::connect`] and [`OvnController::reconnect`] for a
//!   pair).
//! - When it turns false: intent and marks are removed together
//!   ([`OvnController::take_intent`]).
//!
//! The version the agent's capability gate asks ovn-controller for is
//! answered by stand-ins the node writes
//! ([`crate::cluster::write_capability_standins`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube_ovn_ipsec_api::names::host::CAPABILITY_MARKER;
use kube_ovn_ipsec_api::names::ovs;
use testbed::ipsec::{IpsecError, Tunnel};
use testbed::netns::wait_for;
use testbed::overlay;
use testbed::ovs::OvnCentral;

use crate::node::SimNode;

pub use crate::node::POD_PORT;

/// The environment variable that names a patched `ovn-controller` binary
/// for [`OvnController::from_env`].
pub const ENV_OVN_CONTROLLER: &str = "KUBE_OVN_IPSEC_OVN_CONTROLLER";

/// The logical switch every simulated node's pod is a port of.
pub const LOGICAL_SWITCH: &str = "lab-pods";

/// How long a real ovn-controller gets to do what the lab waits for (a
/// chassis registered, tunnels built or changed) under qemu's TCG.
const REAL_WAIT: Duration = Duration::from_secs(60);

/// Who plays ovn-controller on the simulated nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OvnController {
    /// The harness writes what the patched ovn-controller would, from the
    /// node list it is given (not from SB) and with hand-written forwarding
    /// (not OVN logical flows); Geneve only.
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

/// A real ovn-controller running on one node; stopped on drop.
#[derive(Debug)]
pub struct RunningOvnController {
    child: Child,
}

impl Drop for RunningOvnController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

    /// Joins `n` to OVN. Emulated: nothing to do. Real: the node's OVSDB
    /// names SB and its Geneve encap (`ovn-remote`, `ovn-encap-type`,
    /// `ovn-encap-ip`), its pod is a port of [`LOGICAL_SWITCH`] (addresses
    /// its MAC and `pod_ip`) bound through `iface-id`, and ovn-controller
    /// runs in the node's namespaces until its chassis is in SB.
    pub fn attach(
        &self,
        n: &SimNode,
        central: &OvnCentral,
        pod_ip: std::net::Ipv4Addr,
    ) -> Result<Option<RunningOvnController>, IpsecError> {
        match self {
            OvnController::Emulated => Ok(None),
            OvnController::Real { binary, .. } => start_real(binary, n, central, pod_ip).map(Some),
        }
    }

    /// Plain tunnels from every node to every other, and forwarding between
    /// each pod port and its tunnels. Real: waits until every node has
    /// built its tunnel to every other (forwarding is OVN's).
    pub fn plain_mesh(&self, nodes: &[SimNode]) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for a in nodes {
                    let mut names = Vec::new();
                    for b in peers(nodes, a) {
                        let name = emulated_tunnel_name(b);
                        a.node.add_plain_tunnel(&name, b.node.ip())?;
                        names.push(name);
                    }
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    overlay::split_horizon(&a.node, POD_PORT, &names)?;
                }
                Ok(())
            }
            OvnController::Real { .. } => {
                for a in nodes {
                    for b in peers(nodes, a) {
                        wait_real(a, b, "its tunnel", |_| true)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Gives every tunnel of `a` its intent with `a`'s published lease;
    /// `Ok(false)` (and nothing written) when `a` has no lease published.
    /// Real: ovn-controller does it on `SB_Global.ipsec`; waits until every
    /// tunnel of `a` has `remote_name` and the lease's mark.
    pub fn give_intent(&self, nodes: &[SimNode], a: &SimNode) -> Result<bool, IpsecError> {
        let Some((mark, reqid)) = a.lease() else {
            return Ok(false);
        };
        match self {
            OvnController::Emulated => {
                for b in peers(nodes, a) {
                    a.node.protect_tunnel(&Tunnel {
                        mark,
                        reqid,
                        ..Tunnel::to(&b.node, 0)
                    })?;
                }
            }
            OvnController::Real { .. } => {
                let want = mark.to_string();
                for b in peers(nodes, a) {
                    wait_real(a, b, "intent and the lease's mark", |t| {
                        option(a, t, ovs::OPTION_REMOTE_NAME).is_some()
                            && option(a, t, ovs::OPTION_EGRESS_PKT_MARK).as_deref() == Some(&want)
                    })?;
                }
            }
        }
        Ok(true)
    }

    /// Removes intent and marks from every tunnel of `a`, together. Real:
    /// ovn-controller does it when `SB_Global.ipsec` turns false; waits
    /// until every tunnel of `a` is plain again.
    pub fn take_intent(&self, nodes: &[SimNode], a: &SimNode) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for b in peers(nodes, a) {
                    a.node.unprotect_tunnel(&emulated_tunnel_name(b))?;
                }
            }
            OvnController::Real { .. } => {
                for b in peers(nodes, a) {
                    wait_real(a, b, "no intent and no mark", |t| {
                        ovs::TUNNEL_PROTECTION_OPTIONS
                            .iter()
                            .all(|o| option(a, t, o).is_none())
                    })?;
                }
            }
        }
        Ok(())
    }

    /// The name of `a`'s tunnel to `b`.
    pub fn tunnel_name(&self, a: &SimNode, b: &SimNode) -> Result<String, IpsecError> {
        match self {
            OvnController::Emulated => Ok(emulated_tunnel_name(b)),
            OvnController::Real { .. } => real_tunnel(a, b).ok_or_else(|| {
                failed(
                    format!("{}'s tunnel to {}", a.node.chassis(), b.node.chassis()),
                    "ovn-controller has built none",
                )
            }),
        }
    }

    /// The options of `a`'s tunnel to `b` as `ovs-vsctl` prints them.
    pub fn tunnel_options(&self, a: &SimNode, b: &SimNode) -> Result<String, IpsecError> {
        let name = self.tunnel_name(a, b)?;
        a.node
            .vsctl(&["get", "Interface", &name, "options"])
            .map(|s| s.trim().to_string())
    }

    /// Adds each node's tunnel to the other, with intent and its published
    /// lease; an error when either has none (a tunnel with intent but
    /// without protection is what the patch never builds).
    pub fn connect(&self, a: &SimNode, b: &SimNode) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.node.add_tunnel(tunnel))
    }

    /// Gives each node's existing tunnel to the other its intent again,
    /// with its (new) lease: what the patch does when `SB_Global.ipsec`
    /// turns true again.
    pub fn reconnect(&self, a: &SimNode, b: &SimNode) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.node.protect_tunnel(tunnel))
    }

    /// `write`s each node's leased tunnel to the other, `a`'s first. Only
    /// the emulation builds a pair's tunnels on request.
    fn each_way(
        &self,
        a: &SimNode,
        b: &SimNode,
        write: impl Fn(&SimNode, &Tunnel) -> Result<(), IpsecError>,
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
fn start_real(
    binary: &Path,
    n: &SimNode,
    central: &OvnCentral,
    pod_ip: std::net::Ipv4Addr,
) -> Result<RunningOvnController, IpsecError> {
    let node = &n.node;
    let chassis = node.chassis();
    node.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        &format!("external_ids:ovn-remote={}", central.sb.address()),
        "external_ids:ovn-encap-type=geneve",
        &format!("external_ids:ovn-encap-ip={}", node.ip()),
    ])?;
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
    // Inside the node's namespaces, where /run/openvswitch is the node's:
    // its OVSDB, ovs-vswitchd's br-int.mgmt, and (OVS_RUNDIR) the pidfile
    // and control socket the agent's capability gate probes.
    let log = n.dir().join("ovn-controller.log");
    let stderr = n.dir().join("ovn-controller.stderr");
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
    let mut running = RunningOvnController { child };
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
        let exited = match running.child.try_wait() {
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

/// The name of the tunnel a real ovn-controller on `a` built to `b`: the
/// port whose `external_ids:ovn-chassis-id` names `b`'s chassis and
/// address (`<chassis>@<ip>`, followed by `%<local ip>` on newer OVN).
fn real_tunnel(a: &SimNode, b: &SimNode) -> Option<String> {
    let id = format!("{}@{}", b.node.chassis(), b.node.ip());
    [id.clone(), format!("{id}%{}", a.node.ip())]
        .iter()
        .find_map(|id| {
            let out = a
                .node
                .vsctl(&[
                    "--bare",
                    "--columns=name",
                    "find",
                    "Port",
                    &format!("external_ids:ovn-chassis-id=\"{id}\""),
                ])
                .ok()?;
            let name = out.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
}

/// Option `key` of Interface `tunnel` on `n`, without quotes.
fn option(n: &SimNode, tunnel: &str, key: &str) -> Option<String> {
    n.node
        .vsctl(&[
            "--if-exists",
            "get",
            "Interface",
            tunnel,
            &format!("options:{key}"),
        ])
        .ok()
        .map(|v| v.trim().trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
}

/// Waits until `a`'s tunnel to `b` exists and `done` holds for its name.
fn wait_real(
    a: &SimNode,
    b: &SimNode,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<(), IpsecError> {
    wait_for(REAL_WAIT, Duration::from_millis(100), || {
        real_tunnel(a, b).filter(|t| done(t)).map(|_| ())
    })
    .ok_or_else(|| {
        failed(
            format!("{}'s tunnel to {}", a.node.chassis(), b.node.chassis()),
            format!(
                "ovn-controller did not give it {what} within {REAL_WAIT:?}: {}",
                a.node.diagnostics()
            ),
        )
    })
}

/// `n`'s tunnel to `peer` with `n`'s published lease as its marks.
fn leased_tunnel(n: &SimNode, peer: &SimNode) -> Result<Tunnel, IpsecError> {
    let (mark, reqid) = n.lease().ok_or_else(|| IpsecError::Failed {
        what: format!(
            "the tunnel from {} to {}",
            n.node.chassis(),
            peer.node.chassis()
        ),
        detail: "no lease published: a tunnel with intent needs its protection".into(),
    })?;
    Ok(Tunnel {
        mark,
        reqid,
        ..Tunnel::to(&peer.node, 0)
    })
}

/// The name the emulation gives a tunnel to `to`.
fn emulated_tunnel_name(to: &SimNode) -> String {
    Tunnel::to(&to.node, 0).name
}

fn peers<'a>(nodes: &'a [SimNode], a: &'a SimNode) -> impl Iterator<Item = &'a SimNode> {
    nodes
        .iter()
        .filter(move |b| b.node.chassis() != a.node.chassis())
}
