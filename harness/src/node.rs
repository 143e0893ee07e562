//! One simulated node: its namespaces and files (`testbed::ipsec`), its
//! own `ovsdb-server` (socket `/run/openvswitch/db.sock` inside), `br-int`,
//! and the agent — the project's `kube-ovn-ipsec run` as a process with
//! its Pod-bound token, running the real strongSwan and the patched
//! ovs-monitor-ipsec inside the node's namespaces.
//!
//! **Emulated, and named so:** the patched ovn-controller (SPEC §11) is not
//! in this image. The agent's capability gate asks it for its version, so
//! the node carries a stand-in `ovn-controller` that prints the
//! output-protection marker, and an `ovs-appctl` wrapper that answers
//! ovn-controller's `version` the same way and passes every other call to
//! the real `ovs-appctl`. Its tunnel management — intent and marks set
//! and removed together, only for a chassis whose lease is published — is
//! the lab driver's to play, in the node's OVSDB.

// A node of real processes in real time: blocking waits for sockets and
// process exits, from the lab driver, outside any executor.
#![allow(clippy::disallowed_methods)]

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apiserver::ApiServerHandle;
use apiserver::chart::{self, CONTAINER_AGENT, CONTAINER_CLEANUP};
use apiserver::kube_ovn::{CniNode, Shape};
use kube_ovn_ipsec_api::names::host::CAPABILITY_MARKER;
use kube_ovn_ipsec_api::names::ovs;
use kube_ovn_ipsec_api::status::Status;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::ipsec::{IpsecNode, SYSTEM_PYTHON};

/// The pod port every simulated node has on `br-int`.
pub const POD_PORT: &str = "pod0";

/// What the agent and the cleanup get beyond the chart's capabilities, for
/// the simulation alone: entering a node's network and mount namespaces
/// (`setns`: SYS_ADMIN, and SYS_CHROOT for a mount namespace) through
/// `/proc/<holder>/ns/*` (a ptrace-mode read of a process that has every
/// capability: SYS_PTRACE). The chart's hostNetwork Pod enters nothing.
/// Everything else — strongSwan, the monitor, XFRM, the key directory —
/// runs with the chart's set only, so a capability the chart forgot fails
/// here.
pub const SIMULATION_CAPABILITIES: [&str; 3] = ["SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"];

/// Why a node could not be set up or its agent started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// A step failed.
    #[error("{what}: {detail}")]
    Failed {
        /// What was being done.
        what: String,
        /// What went wrong.
        detail: String,
    },
}

fn failed(what: impl Into<String>) -> impl FnOnce(String) -> NodeError {
    let what = what.into();
    move |detail| NodeError::Failed { what, detail }
}

/// A node with its database and (while running) its agent. Dropped, it
/// stops the agent (SIGTERM: it stops its IKE daemon and monitor and
/// leaves its guards), the database, then the namespaces and files.
pub struct SimNode {
    // Field order is drop order.
    agent: Option<Child>,
    ovsdb: Child,
    /// The namespaces, files and strongSwan configuration.
    pub node: IpsecNode,
    /// The agent's key directory.
    pub key_dir: PathBuf,
    /// The loopback port of the agent's status server.
    pub status_port: u16,
    /// The agent's log (JSON lines, appended across restarts).
    pub log: PathBuf,
    dir: PathBuf,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode")
            .field("chassis", &self.node.chassis())
            .field("status_port", &self.status_port)
            .finish_non_exhaustive()
    }
}

fn script(path: &Path, body: &str) -> Result<(), NodeError> {
    std::fs::write(path, body)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| failed(format!("writing {}", path.display()))(e.to_string()))
}

impl SimNode {
    /// Starts `node`'s `ovsdb-server` (system-id its chassis, `br-int`) and
    /// writes its stand-ins under `dir/<chassis>`; no agent yet.
    pub fn prepare(node: IpsecNode, dir: &Path) -> Result<Self, NodeError> {
        let own = dir.join(node.chassis());
        std::fs::create_dir_all(&own)
            .map_err(|e| failed("creating the node's directory")(e.to_string()))?;
        let db = node.dir().join("conf.db");
        let out = Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg("/usr/share/openvswitch/vswitch.ovsschema")
            .output()
            .map_err(|e| failed("running ovsdb-tool")(e.to_string()))?;
        if !out.status.success() {
            return Err(failed("ovsdb-tool create")(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        let log = std::fs::File::create(own.join("ovsdb-server.out"))
            .map_err(|e| failed("the ovsdb-server log")(e.to_string()))?;
        let ovsdb = node
            .netns()
            .command("ovsdb-server")
            .arg(&db)
            .args([
                "--remote=punix:/run/openvswitch/db.sock",
                "--unixctl=/run/openvswitch/ovsdb-server.ctl",
                "--no-chdir",
            ])
            .stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| failed("the ovsdb-server log")(e.to_string()))?,
            )
            .stderr(log)
            .spawn()
            .map_err(|e| failed("starting ovsdb-server")(e.to_string()))?;
        let sock = node.run_path("openvswitch/db.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            if Instant::now() > deadline {
                return Err(failed("ovsdb-server")(format!(
                    "no socket {} in 10 s",
                    sock.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let vsctl = |args: &[&str]| {
            node.vsctl(args)
                .map_err(|e| failed("ovs-vsctl")(e.to_string()))
        };
        vsctl(&["init"])?;
        vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("external_ids:system-id={}", node.chassis()),
        ])?;
        vsctl(&["add-br", "br-int"])?;
        let marker = format!("ovn-controller (emulated by the lab)\\n{CAPABILITY_MARKER}\\n");
        script(
            &own.join("ovn-controller"),
            &format!(
                "#!/bin/sh\n# The lab's emulation of the patched ovn-controller's version.\nprintf '{marker}'\n"
            ),
        )?;
        script(
            &own.join("ovs-appctl"),
            &format!(
                "#!/bin/sh\n# ovn-controller's version from the lab's emulation, the rest from ovs-appctl.\n\
                 if [ \"$3\" = version ] && [ \"$2\" = ovn-controller ]; then printf '{marker}'; exit 0; fi\n\
                 exec ovs-appctl \"$@\"\n"
            ),
        )?;
        let status_port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| failed("choosing a status port")(e.to_string()))?;
        Ok(SimNode {
            agent: None,
            ovsdb,
            key_dir: own.join("keys"),
            log: own.join("agent.log"),
            status_port,
            node,
            dir: own,
        })
    }

    /// Starts the chart's `ipsec` container (binary `agent`) as `cni`'s
    /// Pod would (its template hash from the downward API), following the
    /// cluster's coordination, with the real runtime in the node's
    /// namespaces and the patched monitor `monitor_script`.
    /// `certificate_lifetime` is the `expirationSeconds` it asks for (the
    /// lab's short lifetime makes a renewal happen while traffic runs).
    pub fn start_agent(
        &mut self,
        agent: &Path,
        cni: &CniNode,
        api: &ApiServerHandle,
        monitor_script: &Path,
        certificate_lifetime: u32,
    ) -> Result<(), NodeError> {
        self.stop_agent();
        // What the image ships (image/Dockerfile): the `ovs.conf` the
        // patched monitor would write, so charon starts with OVS's
        // settings (`xfrm_acq_expires = 10`: a pair whose first IKE
        // attempt fails retries after 10 s, not the kernel's 165 s).
        let conf = testbed::ipsec::strongswan_conf_of(monitor_script)
            .map_err(|e| failed("reading the monitor's strongSwan settings")(e.to_string()))?;
        let ovs_conf = self.node.etc_path("strongswan.d/ovs.conf");
        std::fs::write(&ovs_conf, conf)
            .map_err(|e| failed(format!("writing {}", ovs_conf.display()))(e.to_string()))?;
        let kubeconfig = self.dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, &cni.token)
            .map_err(|e| failed("writing the agent's kubeconfig")(e.to_string()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| failed("opening the agent's log")(e.to_string()))?;
        let node = &self.node;
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        let mut process = self.container(Shape::Ipsec, CONTAINER_AGENT, cni)?;
        process
            .set(
                "status-addr",
                Some(&format!("127.0.0.1:{}", self.status_port)),
            )
            .set("kubeconfig", Some(&path(kubeconfig)))
            .set(
                "ovn-controller",
                Some(&path(self.dir.join("ovn-controller"))),
            )
            .set("ovs-appctl", Some(&path(self.dir.join("ovs-appctl"))))
            .set("ovn-controller-ctl", Some("ovn-controller"))
            .set("ipsec", Some("ipsec"))
            .set("ike-rundir", Some(&path(node.run_path(""))))
            .set(
                "ipsec-cacerts-dir",
                Some(&path(node.etc_path("ipsec.d/cacerts"))),
            )
            .set("ike-log-file", Some(&path(node.dir().join("starter.out"))))
            .set("monitor-script", Some(&monitor_script.to_string_lossy()))
            .set("monitor-python", Some(SYSTEM_PYTHON))
            .set("monitor-rundir", Some("/run/openvswitch"))
            .set("monitor-log-file", Some("/run/ovs-monitor-ipsec.log"))
            .set(
                "monitor-output-file",
                Some(&path(node.dir().join("ovs-monitor-ipsec.out"))),
            )
            .set("xfrm-netns", Some(node.netns().name()))
            .set(
                "node-netns-pid",
                Some(&node.netns().holder_pid().to_string()),
            )
            // A 5 s probe: under qemu's TCG a 1 s probe times out and
            // restarts a healthy monitor (docs/coordination.md).
            .set("probe-period", Some("5"))
            .set("stop-grace", Some("3"))
            // Status commands under TCG can take over the production 10 s;
            // a probe that gives up on a live daemon restarts it and sets
            // the node back by a whole start (docs/decisions.md).
            .set("command-timeout", Some("30"))
            .set("probe-failures", Some("3"))
            // Three nodes' charons (7 s each just to load their plugins
            // under TCG) and Python monitors start at once: 60 s for the
            // first answer, doubling from there, rather than 30 s.
            .set("process-start-timeout", Some("60"))
            .set(
                "certificate-lifetime",
                Some(&certificate_lifetime.to_string()),
            )
            // The pod port carries the Pod MTU, as ovn0 does on a node.
            .set("tunnel-mtu-interface", Some(POD_PORT))
            .set("ctl-socket", Some(&path(self.ctl_socket())));
        let child = process
            .command_with_capabilities(agent, &SIMULATION_CAPABILITIES)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| failed("starting the agent")(e.to_string()))?;
        self.agent = Some(child);
        Ok(())
    }

    /// Stops the agent as a Pod deletion does (SIGTERM; its guards stay).
    pub fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            if let Ok(pid) = i32::try_from(a.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(a.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = a.kill();
            let _ = a.wait();
        }
    }

    /// The agent's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Container `name` of the chart's DaemonSet in `shape`, as the
    /// kubelet would start it in `cni`'s Pod ([`chart::Process`]), with what a simulated node moves: its key
    /// directory and its OVSDB socket are under the lab's directory, not at
    /// the chart's host paths.
    fn container(
        &self,
        shape: Shape,
        name: &str,
        cni: &CniNode,
    ) -> Result<chart::Process, NodeError> {
        let what = format!("the chart's {name} container");
        let container = chart::Rendered::of(shape)
            .and_then(|r| r.container(name))
            .map_err(|e| failed(what.clone())(e.to_string()))?;
        let mut process = chart::Process::of(&container, &cni.pod_fields())
            .map_err(|e| failed(what)(e.to_string()))?;
        process
            .set("key-dir", Some(&self.key_dir.to_string_lossy()))
            .set(
                "ovsdb",
                Some(&format!(
                    "unix:{}",
                    self.node.run_path("openvswitch/db.sock").display()
                )),
            );
        Ok(process)
    }

    /// The agent's control socket (`ovs-appctl -t <it> ipsec/show`).
    pub fn ctl_socket(&self) -> PathBuf {
        self.dir.join("kube-ovn-ipsec.ctl")
    }

    /// The agent's PID while it runs.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// The agent's `/status` (`None`: not answering, or not a document).
    pub async fn status(&self) -> Option<Status> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let get = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.status_port))
                .await
                .ok()?;
            s.write_all(b"GET /status HTTP/1.0\r\nHost: lab\r\n\r\n")
                .await
                .ok()?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.ok()?;
            let text = String::from_utf8_lossy(&buf);
            let (head, body) = text.split_once("\r\n\r\n")?;
            // hyper answers in the request's version: `HTTP/1.0 200 OK`.
            (head.split_whitespace().nth(1) == Some("200"))
                .then(|| serde_json::from_str(body).ok())?
        };
        tokio::time::timeout(Duration::from_secs(3), get)
            .await
            .ok()
            .flatten()
    }

    /// The lease the agent published in OVSDB (mark, reqid), if any.
    pub fn lease(&self) -> Option<(u32, u32)> {
        let get = |key: &str| -> Option<u32> {
            self.node
                .vsctl(&["get", "Open_vSwitch", ".", &format!("external_ids:{key}")])
                .ok()?
                .trim()
                .trim_matches('"')
                .parse()
                .ok()
        };
        Some((
            get(ovs::EXTERNAL_ID_PROTECTION_MARK)?,
            get(ovs::EXTERNAL_ID_PROTECTION_REQID)?,
        ))
    }

    /// The PID of the agent's ovs-monitor-ipsec, if it runs.
    pub fn monitor_pid(&self) -> Option<u32> {
        kube_ovn_ipsec_runtime::process::descendants(self.agent_pid()?)
            .into_iter()
            .map(|p| p.pid)
            .find(|&pid| cmdline(pid).contains("ovs-monitor-ipsec"))
    }

    /// Runs the chart's `ipsec-cleanup` init container (binary `agent`) as
    /// `cni`'s Pod would, waiting
    /// up to `wait_secs` for its node's release to be asked; returns its
    /// exit code and the end of its output (the termination message).
    pub fn run_cleanup(
        &self,
        agent: &Path,
        cni: &CniNode,
        api: &ApiServerHandle,
        wait_secs: u64,
    ) -> Result<(i32, String), NodeError> {
        let kubeconfig = self.dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, &cni.token)
            .map_err(|e| failed("writing the cleanup's kubeconfig")(e.to_string()))?;
        let node = &self.node;
        let mut process = self.container(Shape::Cleanup, CONTAINER_CLEANUP, cni)?;
        process
            .set("kubeconfig", Some(&kubeconfig.to_string_lossy()))
            .set("ike-rundir", Some(&node.run_path("").to_string_lossy()))
            .set("xfrm-netns", Some(node.netns().name()))
            .set("wait", Some(&wait_secs.to_string()))
            .set("poll-ms", Some("200"));
        let out = process
            .command_with_capabilities(agent, &SIMULATION_CAPABILITIES)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed("running kube-ovn-ipsec cleanup")(e.to_string()))?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let _ = std::fs::write(self.dir.join("cleanup.log"), &log);
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join("\n");
        Ok((out.status.code().unwrap_or(128), tail))
    }

    /// The directory of this node's lab files (logs, kubeconfig, keys).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The resident set of process `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `pid`'s command line, its arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

impl Drop for SimNode {
    fn drop(&mut self) {
        self.stop_agent();
        let _ = self.ovsdb.kill();
        let _ = self.ovsdb.wait();
    }
}
