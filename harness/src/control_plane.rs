//! The lab's control plane: the embedded API server with RBAC on and the
//! Kube-OVN-shaped cluster on it ([`apiserver::kube_ovn`]), OVN NB and SB
//! with `ovn-northd`, and the real controller — the project's own binary,
//! as a process authenticating with its ServiceAccount's token, exactly as
//! a Deployment's Pod would.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use apiserver::chart;
use apiserver::kube_ovn::{self, CONTROLLER_SA, CniNode, NS, Shape};
use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerHandle, Identity};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use kube_ovn_ipsec_api::coordination::CoordinationRecord;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::TrustBundle;
use testbed::ovs::OvnCentral;

/// The token the controller authenticates with (its ServiceAccount's).
const CONTROLLER_TOKEN: &str = "lab-controller";

/// Why the control plane could not start or be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A binary of this project is not where the lab looks for it.
    #[error(
        "{name} not found beside {} (build it: cargo build --bins)",
        .looked_in.display()
    )]
    MissingBinary {
        /// The binary.
        name: &'static str,
        /// Where it was looked for.
        looked_in: PathBuf,
    },
    /// The embedded API server.
    #[error("the API server: {0}")]
    ApiServer(#[from] apiserver::Error),
    /// The cluster's objects.
    #[error("the cluster's objects: {0}")]
    Objects(#[from] kube_ovn::ClusterError),
    /// The rendered chart (helm/rendered/).
    #[error("the rendered chart: {0}")]
    Chart(String),
    /// OVN's databases or northd.
    #[error("OVN: {0}")]
    Ovn(#[from] testbed::ovs::Error),
    /// A request to the API server.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A process or file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The coordination record does not decode.
    #[error("the coordination record: {0}")]
    Record(String),
    /// The published trust bundle does not parse.
    #[error("the trust bundle: {0}")]
    Trust(String),
    /// An operator's command of the controller binary failed.
    #[error("`kube-ovn-ipsec-controller {command}` failed: {stderr}")]
    Command {
        /// The command line after the binary.
        command: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// The project's binaries the lab runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kube-ovn-ipsec` (the agent, and its `cleanup` mode).
    pub agent: PathBuf,
    /// `kube-ovn-ipsec-controller`.
    pub controller: PathBuf,
}

impl Binaries {
    /// The binaries built beside this one: in its directory, or its
    /// parent's (a test binary lives in `target/<profile>/deps`).
    pub fn beside_current_exe() -> Result<Self, ClusterError> {
        let exe = std::env::current_exe().map_err(|source| ClusterError::Io {
            what: "locating this executable",
            source,
        })?;
        let dir = exe.parent().unwrap_or(Path::new("/"));
        let find = |name: &'static str| {
            [Some(dir), dir.parent()]
                .into_iter()
                .flatten()
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| ClusterError::MissingBinary {
                    name,
                    looked_in: dir.to_path_buf(),
                })
        };
        Ok(Binaries {
            agent: find("kube-ovn-ipsec")?,
            controller: find("kube-ovn-ipsec-controller")?,
        })
    }
}

/// The running control plane. Dropped, it stops the controller, OVN and
/// the API server.
pub struct ControlPlane {
    // Field order is drop order: the controller before what it talks to.
    controller: Option<Child>,
    /// OVN NB, SB and ovn-northd.
    pub central: OvnCentral,
    /// The embedded API server.
    pub api: ApiServerHandle,
    /// A client with the admin token.
    pub admin: Client,
    /// The nodes: Node, CNI Pod, Pod-bound token.
    pub nodes: Vec<CniNode>,
    /// The `kube-ovn-cni` DaemonSet's UID.
    pub ds_uid: String,
    dir: PathBuf,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("api", &self.api.addr())
            .field("nodes", &self.nodes)
            .field("ds_uid", &self.ds_uid)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts the API server (RBAC on), creates the cluster with `nodes`
    /// nodes, and starts OVN with its files in `dir`.
    pub async fn start(dir: &Path, nodes: usize) -> Result<Self, ClusterError> {
        let api = ApiServer::builder()
            .rbac(true)
            .token(
                CONTROLLER_TOKEN,
                Identity::service_account(NS, CONTROLLER_SA),
            )
            .start()
            .await?;
        let admin = api.client(ADMIN_TOKEN).await?;
        let (nodes, ds_uid) = kube_ovn::populate(&api, &admin, nodes).await?;
        let ovn_dir = dir.join("ovn");
        std::fs::create_dir_all(&ovn_dir).map_err(|source| ClusterError::Io {
            what: "creating OVN's directory",
            source,
        })?;
        let central = OvnCentral::start(&ovn_dir)?;
        Ok(ControlPlane {
            controller: None,
            central,
            api,
            admin,
            nodes,
            ds_uid,
            dir: dir.to_path_buf(),
        })
    }

    /// Starts the controller binary with the operator's intent `enable`
    /// (replacing a running one, as a chart upgrade restarts its Pod): the
    /// coordinator against this OVN, a 1 s period and a 3 s Lease (a lab
    /// shows several passes a step), certificates from 10 minutes, its log
    /// in `controller.log`.
    pub fn start_controller(&mut self, bin: &Path, enable: bool) -> Result<(), ClusterError> {
        self.stop_controller();
        let io = |what| move |source| ClusterError::Io { what, source };
        let kubeconfig = self.dir.join("controller.kubeconfig");
        self.api.write_kubeconfig(&kubeconfig, CONTROLLER_TOKEN)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("controller.log"))
            .map_err(io("opening the controller's log"))?;
        // The chart's controller container as its Deployment would start
        // it, pointed at this API server and this OVN.
        let container = chart::Rendered::of(Shape::Ipsec)
            .and_then(|r| r.container(chart::CONTAINER_CONTROLLER))
            .map_err(|e| ClusterError::Chart(e.to_string()))?;
        let pod = chart::PodFields {
            node_name: "control-plane",
            pod_name: "kube-ovn-ipsec-controller-0",
            namespace: NS,
            pod_uid: "",
            template_hash: "",
        };
        let mut process =
            chart::Process::of(&container, &pod).map_err(|e| ClusterError::Chart(e.to_string()))?;
        process
            .set("metrics-addr", Some("127.0.0.1:0"))
            .set("enable-ipsec", Some(if enable { "true" } else { "false" }))
            .set("ovn-nb", Some(&self.central.nb.address()))
            .set("ovn-sb", Some(&self.central.sb.address()))
            .set("coordination-period", Some("1s"))
            .set("lease-duration", Some("3s"))
            // A CA rotation is picked up, and the new CA announced, within
            // a second of the operator's `ca rotate` (30 s in the chart).
            .set("ca-reload", Some("1s"))
            // Kubernetes' floor: the lab's agents ask for short lifetimes
            // so that a renewal happens while it watches.
            .set("min-cert-lifetime", Some("10m"));
        let child = process
            .command(bin)
            .env("RUST_LOG", "info")
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("the controller's log"))?)
            .stderr(log)
            .spawn()
            .map_err(io("starting the controller"))?;
        self.controller = Some(child);
        Ok(())
    }

    /// Runs the controller binary `bin` as the operator runs its `ca`
    /// commands (`ca rotate`, `ca retire --acknowledged-digest D`), with
    /// an administrator's kubeconfig; its stdout on success.
    pub fn ca_command(&self, bin: &Path, args: &[&str]) -> Result<String, ClusterError> {
        let io = |what| move |source| ClusterError::Io { what, source };
        let kubeconfig = self.dir.join("admin.kubeconfig");
        self.api.write_kubeconfig(&kubeconfig, ADMIN_TOKEN)?;
        let out = std::process::Command::new(bin)
            .args(["--namespace", NS, "ca"])
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .output()
            .map_err(io("running the controller's ca command"))?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                command: format!("ca {}", args.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops the controller (SIGKILL: the coordinator is restart-safe, and
    /// a container restart gives no more notice).
    pub fn stop_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The trust bundle as the controller publishes it (ConfigMap
    /// `ovn-ipsec-trust`, key `ca.crt`).
    pub async fn trust(&self) -> Result<TrustBundle, ClusterError> {
        let pem = self
            .configmap_key(
                k8s::TRUST_CONFIGMAP,
                k8s::TRUST_CONFIGMAP_KEY,
                "reading the trust bundle",
            )
            .await?
            .unwrap_or_default();
        TrustBundle::from_pem(pem.as_bytes()).map_err(|e| ClusterError::Trust(e.to_string()))
    }

    /// The coordination record as stored (`None`: none yet).
    pub async fn record(&self) -> Result<Option<CoordinationRecord>, ClusterError> {
        let Some(state) = self
            .configmap_key(
                k8s::COORDINATION_CONFIGMAP,
                k8s::COORDINATION_CONFIGMAP_KEY,
                "reading the coordination record",
            )
            .await?
        else {
            return Ok(None);
        };
        CoordinationRecord::decode(state.as_bytes())
            .map(Some)
            .map_err(|e| ClusterError::Record(e.to_string()))
    }

    /// Key `key` of ConfigMap `name` in the controller's namespace (`None`:
    /// no such ConfigMap or key); `what` names it in an error.
    async fn configmap_key(
        &self,
        name: &str,
        key: &str,
        what: &'static str,
    ) -> Result<Option<String>, ClusterError> {
        let maps: Api<ConfigMap> = Api::namespaced(self.admin.clone(), NS);
        let cm = maps
            .get_opt(name)
            .await
            .map_err(|source| ClusterError::Api { what, source })?;
        Ok(cm.and_then(|c| c.data?.remove(key)))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_controller();
    }
}
