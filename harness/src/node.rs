//! One simulated node, the only one: its namespaces and files
//! (`testbed::ipsec`), its own `ovsdb-server` (socket
//! `/run/openvswitch/db.sock` inside), `br-int`, and the agent — the
//! project's `kube-ovn-ipsec run` as a process with its Pod-bound token,
//! started from the chart's `ipsec` container and running the real
//! strongSwan and the patched ovs-monitor-ipsec inside the node's
//! namespaces — and the chart's `ipsec-cleanup` init container run on it.
//!
//! The lab and the tests start the same node; what differs is data
//! ([`AgentOptions::lab`], [`AgentOptions::test`]): the lab's agent runs
//! with the chart's capabilities and the image's strongSwan settings and
//! follows the cluster's coordination; a test's is armed at start unless
//! the test says otherwise, and probes every second.
//!
//! The ovn-controller side of the node — the version stand-in the agent's
//! capability gate asks, and the tunnels — is the `ovn_controller` module.

// A node of real processes in real time: blocking waits for sockets and
// process exits, outside any executor.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apiserver::ApiServerHandle;
use apiserver::chart::{self, CONTAINER_AGENT, CONTAINER_CLEANUP};
use apiserver::kube_ovn::{CniNode, Shape};
use kube_ovn_ipsec_api::lease::PublishedLease;
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_api::rekeying::Rekeying;
use kube_ovn_ipsec_api::status::Status;
use kube_ovn_ipsec_runtime::ike::CA_FILE_PREFIX;
use kube_ovn_ipsec_runtime::process::{Launcher, ProcessSpec, Supervised};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::ipsec::IpsecNode;
use testbed::netns::wait_for;

use crate::cluster::write_capability_standins;
use crate::cluster::{http_get, real_runtime_flags};

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

/// How a node's agent runs beyond the chart's container: the lab's way or
/// a test's.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// `--certificate-lifetime`: the `expirationSeconds` it asks for.
    pub certificate_lifetime: u32,
    /// `--probe-period` in seconds.
    pub probe_period: u32,
    /// `--process-start-timeout` in seconds, when not the agent's default.
    pub process_start_timeout: Option<u32>,
    /// `--tunnel-mtu-interface`, when not the chart's.
    pub tunnel_mtu_interface: Option<String>,
    /// `--coordination off` (armed at start) unless `extra` names
    /// `--coordination`; otherwise the chart's (follow the cluster).
    pub coordination_off: bool,
    /// Run with the chart's capabilities plus [`SIMULATION_CAPABILITIES`]
    /// only; otherwise with the caller's.
    pub chart_capabilities: bool,
    /// Install the image's strongSwan settings (the `ovs.conf` the patched
    /// monitor would write) before the agent starts.
    pub image_strongswan_conf: bool,
    /// `--ike-lifetime`, `--child-lifetime`, `--rekey-margin` and
    /// `--rekey-fuzz`, when not the agent's defaults.
    pub rekeying: Option<Rekeying>,
    /// Every other flag (`--flag value`, `--flag=value`, `--switch`),
    /// applied last.
    pub extra: Vec<String>,
    /// Environment beyond `RUST_LOG=info`.
    pub env: Vec<(String, String)>,
}

impl AgentOptions {
    /// The lab's agent: the chart's capabilities and the image's strongSwan
    /// settings, following the cluster's coordination, asking for
    /// `certificate_lifetime` (short, so a renewal happens while traffic
    /// runs), with the patience of three nodes starting at once under
    /// qemu's TCG.
    pub fn lab(certificate_lifetime: u32) -> Self {
        AgentOptions {
            certificate_lifetime,
            // A 5 s probe: under qemu's TCG a 1 s probe times out and
            // restarts a healthy monitor (docs/coordination.md).
            probe_period: 5,
            // Three nodes' charons (7 s each just to load their plugins
            // under TCG) and Python monitors start at once: 60 s for the
            // first answer, doubling from there, rather than 30 s.
            process_start_timeout: Some(60),
            // The pod port carries the Pod MTU, as ovn0 does on a node.
            tunnel_mtu_interface: Some(POD_PORT.into()),
            coordination_off: false,
            chart_capabilities: true,
            image_strongswan_conf: true,
            rekeying: None,
            // The lab's CA rotation: the nodes renew onto the new CA within
            // 20 s (300 s by default, spreading a large cluster's CSRs).
            extra: vec!["--rotation-spread=20".into()],
            env: Vec::new(),
        }
    }

    /// A test's agent: armed at start unless `extra` names
    /// `--coordination`, a one-hour certificate, a 1 s probe, `extra` and
    /// `env` added.
    pub fn test(extra: &[&str], env: Vec<(String, String)>) -> Self {
        AgentOptions {
            certificate_lifetime: 3600,
            probe_period: 1,
            process_start_timeout: None,
            tunnel_mtu_interface: None,
            coordination_off: true,
            chart_capabilities: false,
            image_strongswan_conf: false,
            rekeying: None,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            env,
        }
    }
}

/// A node with its database and (while running) its agent. Dropped, it
/// stops the agent (SIGTERM: it stops its IKE daemon and monitor and
/// leaves its guards), the database, then the namespaces and files.
pub struct SimNode {
    // Field order is drop order.
    agent: Option<Child>,
    _ovsdb: Supervised,
    /// The namespaces, files and strongSwan configuration.
    pub node: IpsecNode,
    /// The agent's key directory.
    pub key_dir: PathBuf,
    /// The loopback port of the agent's status server.
    pub port: u16,
    /// The agent's log (JSON lines, appended across restarts).
    pub log: PathBuf,
    dir: PathBuf,
    /// How the agent was last started (a respawn starts it the same way).
    options: Option<AgentOptions>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode")
            .field("chassis", &self.node.chassis())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// The lease published in `node`'s OVSDB (mark, reqid), if there is a
/// usable one ([`PublishedLease::read`]: what ovn-controller would take).
pub fn published_lease(node: &IpsecNode) -> Option<(u32, u32)> {
    let l = PublishedLease::read(&external_ids(node)?).ok()?;
    Some((l.mark, l.reqid))
}

/// `Open_vSwitch . external_ids` of `node`'s OVSDB.
pub fn external_ids(node: &IpsecNode) -> Option<BTreeMap<String, String>> {
    let out = node
        .vsctl(&[
            "--format=json",
            "--columns=external_ids",
            "list",
            "Open_vSwitch",
        ])
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    ovsdb::Datum::from_json(&v["data"][0][0])
        .ok()?
        .as_string_map()
}

/// Starts `node`'s ovsdb-server on a fresh `conf.db` in its namespaces
/// (socket `/run/openvswitch/db.sock`, on the host at
/// `run_path("openvswitch/db.sock")`) through `launcher`, and waits for
/// the socket.
pub fn start_ovsdb(node: &IpsecNode, launcher: &Launcher) -> Result<Supervised, NodeError> {
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
    let ovsdb = Supervised::start(
        &ProcessSpec {
            name: "ovsdb-server",
            program: "ovsdb-server".into(),
            args: vec![
                db.into_os_string(),
                "--remote=punix:/run/openvswitch/db.sock".into(),
                "--unixctl=/run/openvswitch/ovsdb-server.ctl".into(),
                "--no-chdir".into(),
            ],
            log_file: Some(node.dir().join("ovsdb-server.out")),
        },
        launcher,
    )
    .map_err(|e| failed("starting ovsdb-server")(e.to_string()))?;
    let sock = node.run_path("openvswitch/db.sock");
    wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        sock.exists().then_some(())
    })
    .ok_or_else(|| failed("ovsdb-server")(format!("no socket {} in 10 s", sock.display())))?;
    Ok(ovsdb)
}

impl SimNode {
    /// Starts `node`'s `ovsdb-server` (system-id its chassis, `br-int`)
    /// with the node's files under `dir/<chassis>`; no agent yet.
    pub fn prepare(node: IpsecNode, dir: &Path) -> Result<Self, NodeError> {
        let own = dir.join(node.chassis());
        Self::prepare_in(node, own)
    }

    /// [`SimNode::prepare`], the node's files (kubeconfig, key directory,
    /// logs, stand-ins) under `own`.
    pub fn prepare_in(node: IpsecNode, own: PathBuf) -> Result<Self, NodeError> {
        std::fs::create_dir_all(&own)
            .map_err(|e| failed("creating the node's directory")(e.to_string()))?;
        let ovsdb = start_ovsdb(&node, &Launcher::nsenter(node.netns().holder_pid()))?;
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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| failed("choosing a status port")(e.to_string()))?;
        Ok(SimNode {
            agent: None,
            _ovsdb: ovsdb,
            key_dir: own.join("keys"),
            log: own.join("agent.log"),
            port,
            node,
            dir: own,
            options: None,
        })
    }

    /// Starts the chart's `ipsec` container (binary `agent`) as `cni`'s
    /// Pod would (its template hash from the downward API), with the real
    /// runtime in the node's namespaces and the patched monitor
    /// `monitor_script`, configured by `options`. A running agent is
    /// stopped first.
    pub fn start_agent(
        &mut self,
        agent: &Path,
        cni: &CniNode,
        api: &ApiServerHandle,
        monitor_script: &Path,
        options: &AgentOptions,
    ) -> Result<(), NodeError> {
        self.stop_agent();
        if options.image_strongswan_conf {
            // What the image ships (image/Dockerfile): the `ovs.conf` the
            // patched monitor would write, so charon starts with OVS's
            // settings (`xfrm_acq_expires = 10`: a pair whose first IKE
            // attempt fails retries after 10 s, not the kernel's 165 s).
            let conf = testbed::ipsec::strongswan_conf_of(monitor_script)
                .map_err(|e| failed("reading the monitor's strongSwan settings")(e.to_string()))?;
            let ovs_conf = self.node.etc_path("strongswan.d/ovs.conf");
            std::fs::write(&ovs_conf, conf)
                .map_err(|e| failed(format!("writing {}", ovs_conf.display()))(e.to_string()))?;
        }
        let kubeconfig = self.kubeconfig();
        api.write_kubeconfig(&kubeconfig, &cni.token)
            .map_err(|e| failed("writing the agent's kubeconfig")(e.to_string()))?;
        let standins = self.dir.join("standins");
        let appctl = write_capability_standins(&standins)
            .map_err(|e| failed("writing the ovn-controller stand-ins")(e.to_string()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| failed("opening the agent's log")(e.to_string()))?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut process = self.container(Shape::Ipsec, CONTAINER_AGENT, cni)?;
        process
            .set("status-addr", Some(&format!("127.0.0.1:{}", self.port)))
            .set("kubeconfig", Some(&path(&kubeconfig)))
            .set(
                "certificate-lifetime",
                Some(&options.certificate_lifetime.to_string()),
            )
            // Beside the node's files: one per agent (many run on one host).
            .set("ctl-socket", Some(&path(&self.ctl_socket())));
        if options.coordination_off {
            process.set("coordination", Some("off"));
        }
        let runtime = real_runtime_flags(&self.node, &standins, &appctl, monitor_script);
        set_flags(&mut process, &runtime)?;
        process.set("probe-period", Some(&options.probe_period.to_string()));
        if let Some(t) = options.process_start_timeout {
            process.set("process-start-timeout", Some(&t.to_string()));
        }
        if let Some(i) = &options.tunnel_mtu_interface {
            process.set("tunnel-mtu-interface", Some(i));
        }
        if let Some(r) = &options.rekeying {
            set_flags(&mut process, &r.flags())?;
        }
        set_flags(&mut process, &options.extra)?;
        let mut command = if options.chart_capabilities {
            process.command_with_capabilities(agent, &SIMULATION_CAPABILITIES)
        } else {
            process.command(agent)
        };
        let child = command
            .env("RUST_LOG", "info")
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| failed("starting the agent")(e.to_string()))?;
        self.agent = Some(child);
        self.options = Some(options.clone());
        Ok(())
    }

    /// Starts the agent again as `cni`'s (new) Pod, on the same node, key
    /// directory and status port, the way it was last started but with
    /// `extra`: what the DaemonSet rolling the node onto a template with
    /// the `ipsec` container amounts to.
    pub fn respawn(
        &mut self,
        agent: &Path,
        cni: &CniNode,
        api: &ApiServerHandle,
        monitor_script: &Path,
        extra: &[&str],
    ) -> Result<(), NodeError> {
        let mut options = self
            .options
            .clone()
            .unwrap_or_else(|| AgentOptions::test(&[], Vec::new()));
        options.extra = extra.iter().map(|s| (*s).to_owned()).collect();
        self.start_agent(agent, cni, api, monitor_script, &options)
    }

    /// Stops the agent as a Pod deletion does (SIGTERM; its guards stay),
    /// SIGKILL after 10 s.
    pub fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            // An agent that already exited (and was reaped) is not
            // signalled: its PID may be another process's by now.
            if matches!(a.try_wait(), Ok(None))
                && let Ok(pid) = i32::try_from(a.id())
            {
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

    /// The agent process while one was started (it may have exited).
    pub fn agent_mut(&mut self) -> Option<&mut Child> {
        self.agent.as_mut()
    }

    /// The agent's PID while one was started.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// The agent's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Container `name` of the chart's DaemonSet in `shape`, as the
    /// kubelet would start it in `cni`'s Pod ([`chart::Process`]), with
    /// what a simulated node moves: its key directory and its OVSDB socket.
    fn container(
        &self,
        shape: Shape,
        name: &str,
        cni: &CniNode,
    ) -> Result<chart::Process, NodeError> {
        node_container(&self.node, &self.key_dir, shape, name, &cni.pod_fields())
    }

    /// The agent's kubeconfig (its Pod's token).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The agent's control socket (`ovs-appctl -t <it> ipsec/show`).
    pub fn ctl_socket(&self) -> PathBuf {
        self.dir.join("kube-ovn-ipsec.ctl")
    }

    /// Runs `ovs-appctl <args>` in the node's namespaces the way an
    /// operator types it in the `ipsec` container: the image's link to the
    /// agent binary `agent` first on `PATH` (`kube_ovn_ipsec_runtime::appctl`),
    /// the agent's socket in `OVN_IPSEC_CTL` (this node's, which the agent
    /// got as `--ctl-socket`).
    pub fn container_appctl(
        &self,
        agent: &Path,
        args: &[&str],
    ) -> Result<std::process::Output, NodeError> {
        use kube_ovn_ipsec_runtime::appctl;
        let bin = self.dir.join("image-bin");
        let link = bin.join(appctl::PROGRAM);
        if !link.exists() {
            std::fs::create_dir_all(&bin)
                .and_then(|()| std::os::unix::fs::symlink(agent, &link))
                .map_err(|e| failed(format!("linking {}", link.display()))(e.to_string()))?;
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut path_with = bin.into_os_string();
        path_with.push(":");
        path_with.push(path);
        let mut cmd = self.node.netns().command(appctl::PROGRAM);
        cmd.args(args)
            .env("PATH", path_with)
            .env(appctl::CTL_ENV, self.ctl_socket())
            .stdin(Stdio::null());
        cmd.output()
            .map_err(|e| failed("running ovs-appctl in the node")(e.to_string()))
    }

    /// `/status` as the server sent it, once it answers 200 with JSON.
    pub async fn status(&self) -> Option<serde_json::Value> {
        let (code, body) = http_get(self.port, "/status").await?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// `/status` as the contract's document (`None`: not answering within
    /// 3 s, or not a document).
    pub async fn parsed_status(&self) -> Option<Status> {
        let get = async {
            let (code, body) = http_get(self.port, "/status").await?;
            (code == 200).then(|| serde_json::from_str(&body).ok())?
        };
        tokio::time::timeout(Duration::from_secs(3), get)
            .await
            .ok()
            .flatten()
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        http_get(self.port, "/readyz").await.map(|(c, _)| c) == Some(200)
    }

    /// Waits (bounded) until the agent is ready and `done` holds for its
    /// status; fails naming `what` with the status and the logs.
    pub async fn wait(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let ready = self.ready().await;
            let status = self.status().await;
            if ready && status.as_ref().is_some_and(&done) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not within {timeout:?}: {status:?}\nagent log:\n{}\n{}",
                self.node.chassis(),
                self.logs(),
                self.node.diagnostics()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The lease published in OVSDB (mark, reqid), if there is a usable
    /// one ([`published_lease`]).
    pub fn lease(&self) -> Option<(u32, u32)> {
        published_lease(&self.node)
    }

    /// `Open_vSwitch . external_ids` of the node's OVSDB.
    pub fn external_ids(&self) -> Option<BTreeMap<String, String>> {
        external_ids(&self.node)
    }

    /// The leaf OVSDB points the monitor at.
    ///
    /// # Panics
    /// When OVSDB names no readable certificate.
    pub fn leaf(&self) -> Certificate {
        let path = self
            .node
            .vsctl(&["get", "Open_vSwitch", ".", "other_config:certificate"])
            .unwrap();
        let path = path.trim().trim_matches('"');
        Certificate::from_pem(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The agent's own CA files in the IKE daemon's cacerts directory.
    pub fn own_ca_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.node.etc_path("ipsec.d/cacerts"))
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                name.starts_with(CA_FILE_PREFIX).then_some(name)
            })
            .collect();
        v.sort();
        v
    }

    /// The PID of the agent's ovs-monitor-ipsec, if it runs.
    pub fn monitor_pid(&self) -> Option<u32> {
        kube_ovn_ipsec_runtime::process::descendants(self.agent_pid()?)
            .into_iter()
            .map(|p| p.pid)
            .find(|&pid| cmdline(pid).contains("ovs-monitor-ipsec"))
    }

    /// Runs the chart's `ipsec-cleanup` init container (binary `agent`,
    /// the chart's capabilities) as `cni`'s Pod would, waiting up to
    /// `wait_secs` for its node's release to be asked; returns its exit
    /// code and the end of its output (the termination message).
    pub fn run_cleanup(
        &self,
        agent: &Path,
        cni: &CniNode,
        api: &ApiServerHandle,
        wait_secs: u64,
    ) -> Result<(i32, String), NodeError> {
        let kubeconfig = self.kubeconfig();
        api.write_kubeconfig(&kubeconfig, &cni.token)
            .map_err(|e| failed("writing the cleanup's kubeconfig")(e.to_string()))?;
        let process =
            cleanup_process(&self.node, cni, &self.key_dir, &kubeconfig, None, wait_secs)?;
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

    /// The directory of this node's files (logs, kubeconfig, keys).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Container `name` of the chart's DaemonSet in `shape` as the kubelet
/// would start it in `pod`, with what a simulated node moves: the
/// key directory `key_dir` and `node`'s OVSDB socket, not the chart's host
/// paths.
fn node_container(
    node: &IpsecNode,
    key_dir: &Path,
    shape: Shape,
    name: &str,
    pod: &chart::PodFields<'_>,
) -> Result<chart::Process, NodeError> {
    let what = format!("the chart's {name} container");
    let container = chart::Rendered::of(shape)
        .and_then(|r| r.container(name))
        .map_err(|e| failed(what.clone())(e.to_string()))?;
    let mut process =
        chart::Process::of(&container, pod).map_err(|e| failed(what)(e.to_string()))?;
    process
        .set("key-dir", Some(&key_dir.to_string_lossy()))
        .set(
            "ovsdb",
            Some(&format!(
                "unix:{}",
                node.run_path("openvswitch/db.sock").display()
            )),
        );
    Ok(process)
}

/// The chart's `ipsec-cleanup` init container on `node` as `cni`'s Pod
/// (of template `template_hash` when given, else the Pod's own), on key
/// directory `key_dir` with credentials `kubeconfig`, waiting at most
/// `wait_secs` for what the rollout still changes.
pub fn cleanup_process(
    node: &IpsecNode,
    cni: &CniNode,
    key_dir: &Path,
    kubeconfig: &Path,
    template_hash: Option<&str>,
    wait_secs: u64,
) -> Result<chart::Process, NodeError> {
    let mut pod = cni.pod_fields();
    if let Some(hash) = template_hash {
        pod.template_hash = hash;
    }
    let mut process = node_container(node, key_dir, Shape::Cleanup, CONTAINER_CLEANUP, &pod)?;
    process
        .set("kubeconfig", Some(&kubeconfig.to_string_lossy()))
        .set("ike-rundir", Some(&node.run_path("").to_string_lossy()))
        .set("xfrm-netns", Some(node.netns().name()))
        .set("wait", Some(&wait_secs.to_string()))
        .set("poll-ms", Some("200"));
    Ok(process)
}

/// Applies command-line `flags` (`--flag value`, `--flag=value` or a bare
/// `--switch`) to `process`, each replacing the chart's or an earlier one.
pub fn set_flags(process: &mut chart::Process, flags: &[impl AsRef<str>]) -> Result<(), NodeError> {
    let mut i = 0;
    while i < flags.len() {
        let this = flags[i].as_ref();
        let flag = this
            .strip_prefix("--")
            .ok_or_else(|| failed("the agent's flags")(format!("{this:?} is not a flag")))?;
        if let Some((name, value)) = flag.split_once('=') {
            process.set(name, Some(value));
            i += 1;
        } else if let Some(value) = flags
            .get(i + 1)
            .map(AsRef::as_ref)
            .filter(|v| !v.starts_with("--"))
        {
            process.set(flag, Some(value));
            i += 2;
        } else {
            process.set(flag, None);
            i += 1;
        }
    }
    Ok(())
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
    }
}
