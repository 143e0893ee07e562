//! A one-node "cluster" for the agent's integration tests: the embedded
//! Kubernetes API server (lab), a real Open_vSwitch ovsdb-server (testbed),
//! a Node, the trust ConfigMap and a minimal in-test signer that approves and
//! signs every `kubeovn.io/signer` CSR with a test CA — without backdating,
//! so that a short requested lifetime gives a renewal within seconds.
//!
//! The agent always runs its runtime actors (capability gate, lease and
//! XFRM guards, IKE daemon, monitor). [`Cluster::spawn_agent`] gives it
//! clearly named stand-ins for the programs (an ovn-controller that
//! advertises the output-protection marker, an `ipsec` and an
//! ovs-monitor-ipsec that idle and answer the probes and listings) and a
//! private network namespace for its guards, so identity-focused tests run
//! the real agent without strongSwan. [`Cluster::spawn_agent_with`] takes
//! the runtime flags from the caller (real strongSwan and monitor in a
//! simulated node's namespaces).
//!
//! [`Cluster::start_with_controller`] replaces the in-test signer with the
//! real controller (built-in CA) on the controller tests' cluster: RBAC on,
//! the kube-ovn-cni DaemonSet, its Pod, and the agent authenticating with
//! that Pod's ServiceAccount token minted through `TokenRequest`.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::sync::Arc;

use apiserver::faults::Faults;
use apiserver::{ADMIN_TOKEN, ApiServer, ApiServerHandle};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube_ovn_ipsec_api::clock::{Clock, SystemClock, unix_seconds};
use kube_ovn_ipsec_api::names::k8s as names;
use kube_ovn_ipsec_api::test_util::{JumpClock, TestCa};
use kube_ovn_ipsec_api::time::Timestamp;
use testbed::ovs::OvsdbServer;
use tokio::task::JoinHandle;

/// Node name used by the tests.
pub const NODE: &str = "node-a";
/// Chassis (OVS system-id) used by the tests.
pub const CHASSIS: &str = "chassis-a";

/// The Pod the agent runs as (`--pod-name`, `--pod-uid`) on `--node-name`.
#[derive(Clone, Debug)]
pub struct AgentPod {
    /// The Node the Pod runs on.
    pub node: String,
    /// The Pod's name.
    pub name: String,
    /// The Pod's UID.
    pub uid: String,
}

/// Runs the real controller (built-in CA) in-process against `api` as its
/// own ServiceAccount, with a token minted through `TokenRequest`, and
/// `flags` beyond the namespace; returns its task (aborting it stops the
/// controller) and the trust bundle it published at start.
pub async fn start_controller(
    api: &ApiServerHandle,
    admin: &kube::Client,
    flags: &[&str],
) -> (JoinHandle<()>, String) {
    use crate::controller_cluster as cc;
    let controller_token = cc::mint_token(admin, cc::CONTROLLER_SA, None).await;
    let controller_client = api.client(&controller_token).await.unwrap();
    let config = {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            c: controller::config::Config,
        }
        let mut args = vec![
            "test",
            "--namespace",
            cc::NS,
            "--metrics-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(flags);
        P::parse_from(args).c
    };
    let task = tokio::spawn(async move {
        let run = controller::run(
            controller_client,
            &config,
            std::sync::Arc::new(controller::metrics::Metrics::new()),
            std::sync::Arc::new(SystemClock),
            std::future::pending::<()>(),
        )
        .await;
        if let Err(e) = run {
            eprintln!("the controller stopped: {e}");
        }
    });
    // The controller generates its CA at start and publishes it.
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), cc::NS);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ca_pem = loop {
        if let Some(pem) = maps
            .get_opt(names::TRUST_CONFIGMAP)
            .await
            .unwrap()
            .and_then(|cm| cm.data?.remove(names::TRUST_CONFIGMAP_KEY))
        {
            break pem;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller published no trust bundle in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    (task, ca_pem)
}

/// The runtime flags of an agent that runs real strongSwan and the
/// monitor `script` inside `node`'s namespaces, with the capability
/// stand-ins in `standins` (from [`write_capability_standins`], whose
/// `ovs-appctl` wrapper is `appctl`).
pub fn real_runtime_flags(
    node: &testbed::ipsec::IpsecNode,
    standins: &Path,
    appctl: &Path,
    script: &Path,
) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    vec![
        "--ovn-controller".into(),
        s(&standins.join("ovn-controller")),
        "--ovs-appctl".into(),
        s(appctl),
        "--ovn-controller-ctl".into(),
        "ovn-controller".into(),
        "--ipsec".into(),
        "ipsec".into(),
        "--ike-rundir".into(),
        s(&node.run_path("")),
        "--ipsec-cacerts-dir".into(),
        s(&node.etc_path("ipsec.d/cacerts")),
        "--ike-log-file".into(),
        s(&node.dir().join("starter.out")),
        "--monitor-script".into(),
        s(script),
        "--monitor-python".into(),
        testbed::ipsec::SYSTEM_PYTHON.into(),
        "--monitor-rundir".into(),
        "/run/openvswitch".into(),
        "--monitor-log-file".into(),
        "/run/ovs-monitor-ipsec.log".into(),
        "--monitor-output-file".into(),
        s(&node.dir().join("ovs-monitor-ipsec.out")),
        "--xfrm-netns".into(),
        node.netns().name().into(),
        "--node-netns-pid".into(),
        node.netns().holder_pid().to_string(),
        "--probe-period".into(),
        "1".into(),
        "--stop-grace".into(),
        "3".into(),
        // The kernel tests run these agents in an emulated guest, where
        // `ipsec status` and `ovs-appctl` can answer after 10 s: the
        // production deadline there restarts live daemons (a monitor found
        // missing at a steady-state kill). The flags exist for such nodes.
        "--command-timeout".into(),
        "30".into(),
        "--probe-failures".into(),
        "3".into(),
    ]
}

/// What one `kube-ovn-ipsec run` process gets.
pub struct AgentProcess<'a> {
    /// The Pod it runs as.
    pub pod: &'a AgentPod,
    /// `--ovsdb`.
    pub ovsdb: &'a str,
    /// `--kubeconfig` (its credentials).
    pub kubeconfig: &'a Path,
    /// `--key-dir`.
    pub key_dir: &'a Path,
    /// The loopback port of `--status-addr`.
    pub status_port: u16,
    /// `--certificate-lifetime`.
    pub lifetime_secs: u32,
    /// Where its stderr (JSON logs) is appended.
    pub log: &'a Path,
    /// Every other flag.
    pub extra: &'a [&'a str],
    /// Environment variables beyond the test's own.
    pub env: &'a [(&'a str, &'a str)],
}

/// Starts `kube-ovn-ipsec run` as described by `a`: with
/// `--coordination off` (armed at start, as these single-node tests need)
/// unless `extra` names `--coordination` itself.
pub fn spawn_agent_process(a: &AgentProcess<'_>) -> Child {
    let mut cmd = Command::new(crate::binaries::agent());
    cmd.args(["run", "--node-name", &a.pod.node]);
    if !a.extra.contains(&"--coordination") {
        cmd.args(["--coordination", "off"]);
    }
    cmd.args(["--pod-name", &a.pod.name, "--pod-namespace", "kube-system"])
        .args(["--pod-uid", &a.pod.uid])
        .arg("--key-dir")
        .arg(a.key_dir)
        .args(["--ovsdb", a.ovsdb])
        .args(["--status-addr", &format!("127.0.0.1:{}", a.status_port)])
        .args(["--certificate-lifetime", &a.lifetime_secs.to_string()])
        .arg("--kubeconfig")
        .arg(a.kubeconfig);
    if !a.extra.contains(&"--ctl-socket") {
        // Beside the key directory: one per agent (many run on one host).
        cmd.arg("--ctl-socket").arg(a.key_dir.with_extension("ctl"));
    }
    cmd.args(a.extra)
        .envs(a.env.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(a.log)
                .unwrap(),
        )
        .spawn()
        .unwrap()
}

/// A node's Open_vSwitch database: system-id `chassis`, and one unrelated
/// key the agent must keep.
fn node_ovsdb(dir: &Path, chassis: &str) -> OvsdbServer {
    let ovs = OvsdbServer::start_vswitch(dir).unwrap();
    ovs.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        &format!("external_ids:system-id={chassis}"),
        "other_config:unrelated=keep-me",
    ])
    .unwrap();
    ovs
}

/// Everything one agent needs, running.
pub struct Cluster {
    /// The cluster's files (key directory, logs, kubeconfig).
    pub dir: tempfile::TempDir,
    /// The embedded API server.
    pub api: ApiServerHandle,
    /// The node's Open_vSwitch ovsdb-server.
    pub ovs: OvsdbServer,
    /// The agent's credentials: the admin's, or (with the real controller)
    /// its Pod-bound ServiceAccount token.
    pub kubeconfig: PathBuf,
    /// The Node's UID.
    pub node_uid: String,
    /// The Pod the agent runs as.
    pub pod: AgentPod,
    /// The signer's CA certificate (the trust bundle).
    pub ca_pem: String,
    /// The agent's network namespace (its guards live there).
    pub netns: testbed::netns::Netns,
    /// Directory of the stand-in programs.
    pub standins: PathBuf,
    /// Errors and dropped watches the API server answers with, on demand.
    pub faults: Arc<Faults>,
    /// The cluster's wall clock: the API server's (token expiry) and, but
    /// with the real controller, the signer's (issuance). Jumping it moves
    /// the cluster's time, as a suspended and resumed machine sees it.
    pub clock: Arc<JumpClock>,
    signer: JoinHandle<()>,
}

/// `raw_serial` as colon hex, the way strongSwan lists it.
fn serial_of(pem: &str) -> String {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&p.contents).unwrap();
    cert.raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn script(dir: &Path, name: &str, body: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, body)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    Ok(p)
}

/// Writes the stand-ins for the patched ovn-controller into `dir`: the
/// program (`ovn-controller --version`) and an `ovs-appctl` that answers
/// its `version` with the output-protection marker and passes every other
/// call to the real `ovs-appctl` (the monitor's control socket), which it
/// returns. The version the agent's capability gate asks for is the
/// ovn-controller side's (the `ovn_controller` module); its stand-in lives
/// here, with the other stand-in programs, so the node can write it.
pub fn write_capability_standins(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let marker = kube_ovn_ipsec_runtime::capability::CAPABILITY_MARKER;
    script(
        dir,
        "ovn-controller",
        &format!(
            "#!/bin/sh\n# Stand-in for the patched ovn-controller (tests).\nprintf 'ovn-controller 24.03.90 (stand-in)\\n{marker}\\n'\n"
        ),
    )?;
    script(
        dir,
        "ovs-appctl-real",
        &format!(
            "#!/bin/sh\n# ovn-controller's version from the stand-in, the rest from ovs-appctl.\n\
             if [ \"$3\" = version ] && [ \"$2\" = ovn-controller ]; then\n\
             printf 'ovn-controller 24.03.90 (stand-in)\\n{marker}\\n'; exit 0; fi\nexec ovs-appctl \"$@\"\n"
        ),
    )
}

/// Writes the stand-in programs into `dir`.
fn write_standins(dir: &Path, ca_pem: &str) {
    write_capability_standins(dir).unwrap();
    let marker = kube_ovn_ipsec_runtime::capability::CAPABILITY_MARKER;
    // Idle until the agent (our parent) is gone, so a SIGKILLed agent
    // leaves nothing behind.
    let idle = "parent=$PPID\nwhile kill -0 \"$parent\" 2>/dev/null; do sleep 0.2; done\n";
    script(
        dir,
        "ovs-appctl",
        &format!(
            "#!/bin/sh\n# Stand-in ovs-appctl (tests): -t <target> <command>.\ncase \"$3\" in\n\
             version) printf 'ovn-controller 24.03.90 (stand-in)\\n{marker}\\n' ;;\n\
             tunnels/show) ;;\n*) echo \"stand-in: $3 unsupported\" >&2; exit 2 ;;\nesac\n"
        ),
    )
    .unwrap();
    script(
        dir,
        "ipsec",
        &format!(
            "#!/bin/sh\n# Stand-in for strongSwan's ipsec (tests): idles, answers the probe\n\
             # and lists the test CA as loaded.\ncase \"$1\" in\nstart) {idle} ;;\n\
             statusall) printf 'Security Associations (0 up, 0 connecting):\\n  none\\n' ;;\n\
             listcerts|rereadcacerts) ;;\n\
             listcacerts) printf '  subject:  \"CN=agent test CA, O=kube-ovn\"\\n  serial:    {}\\n' ;;\n\
             *) exit 1 ;;\nesac\n",
            serial_of(ca_pem)
        ),
    )
    .unwrap();
    script(
        dir,
        "ovs-monitor-ipsec",
        &format!(
            "#!/bin/sh\n# Stand-in, not the real class IPsecMonitor (tests).\n\
             # kube-ovn-ipsec: ovs-monitor-ipsec-patch v6\n{idle}"
        ),
    )
    .unwrap();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.signer.abort();
    }
}

/// Signs `csr` with the test CA for its requested lifetime, at most `cap`,
/// valid from now (no backdate: renewal tests time the 40–60 % point).
fn sign(
    ca: &TestCa,
    csr: &CertificateSigningRequest,
    cap: Duration,
    clock: &dyn Clock,
) -> Option<Vec<u8>> {
    let pem = String::from_utf8(csr.spec.request.0.clone()).ok()?;
    // A signer may issue a shorter lifetime than requested (the API server
    // refuses requests under 600 s, so this is how a test sees a renewal
    // within seconds).
    let lifetime =
        Duration::from_secs(csr.spec.expiration_seconds.unwrap_or(3600).max(1) as u64).min(cap);
    let now = unix_seconds(clock.now());
    let not_before = Timestamp::from_unix(now).ok()?;
    let not_after = Timestamp::from_unix(now + i64::try_from(lifetime.as_secs()).ok()?).ok()?;
    Some(
        ca.sign_request(&pem)
            .valid(not_before, not_after)
            .pem()
            .into_bytes(),
    )
}

/// Approves and signs every pending CSR of our signer, once.
async fn signer_loop(
    api: Api<CertificateSigningRequest>,
    ca: TestCa,
    cap: Duration,
    clock: Arc<JumpClock>,
) {
    let stream = watcher::watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("spec.signerName={}", names::SIGNER_NAME)),
    );
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) = ev else {
            continue;
        };
        let done = csr.status.as_ref().is_some_and(|s| s.certificate.is_some());
        let Some(name) = csr.metadata.name.clone() else {
            continue;
        };
        if done {
            continue;
        }
        let Some(cert) = sign(&ca, &csr, cap, clock.as_ref()) else {
            continue;
        };
        let approved = CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("TestSigner".into()),
                message: Some("approved by the agent test signer".into()),
                ..Default::default()
            }]),
            certificate: None,
        };
        let body = serde_json::json!({"status": approved});
        if api
            .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .is_err()
        {
            continue;
        }
        let body = serde_json::json!({"status": {"certificate": ByteString(cert)}});
        let _ = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await;
    }
}

impl Cluster {
    /// Starts the API server, ovsdb-server, the Node, the trust ConfigMap
    /// and the signer, which issues at most `issue_lifetime`.
    pub async fn start(issue_lifetime: Duration) -> Cluster {
        Self::start_with(issue_lifetime, false).await
    }

    /// [`Cluster::start`], with the API server's RBAC on or off (the
    /// cluster's own clients are `system:masters` either way).
    pub async fn start_with(issue_lifetime: Duration, rbac: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let (api, faults, clock) = Self::api_server(rbac).await;
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, ADMIN_TOKEN).unwrap();
        let client = api.client(ADMIN_TOKEN).await.unwrap();

        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "annotations": {names::ANNOTATION_OVN_CHASSIS: CHASSIS}}
        }))
        .unwrap();
        let node = Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let node_uid = node.metadata.uid.unwrap();

        let ca = TestCa::p256("agent test CA");
        let ca_pem = ca.cert_pem();
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(names::TRUST_CONFIGMAP.into()),
                ..Default::default()
            },
            data: Some([(names::TRUST_CONFIGMAP_KEY.to_string(), ca_pem.clone())].into()),
            ..Default::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();

        let ovs = node_ovsdb(dir.path(), CHASSIS);
        let signer = tokio::spawn(signer_loop(
            Api::all(client),
            ca,
            issue_lifetime,
            clock.clone(),
        ));
        let pod = AgentPod {
            node: NODE.into(),
            name: "kube-ovn-cni-abcde".into(),
            uid: "0b0e6a3c-1111-4222-8333-444455556666".into(),
        };
        Self::assemble(
            dir,
            api,
            ovs,
            kubeconfig,
            node_uid,
            pod,
            ca_pem,
            signer,
            (faults, clock),
        )
    }

    /// The cluster with the real controller as the signer: the controller
    /// tests' cluster (one Node `node-0`, chassis `chassis-0`, its CNI Pod
    /// of the DaemonSet's current template, RBAC on), the controller run
    /// in-process with its own ServiceAccount's token minted through
    /// `TokenRequest`, and the agent's kubeconfig holding the CNI Pod's
    /// Pod-bound token, minted the same way. No admin credential reaches
    /// the agent or the controller.
    pub async fn start_with_controller() -> Cluster {
        use crate::controller_cluster as cc;
        let dir = tempfile::tempdir().unwrap();
        // The controller signs on the system clock: this clock moves the
        // API server's tokens only.
        let (api, faults, clock) = Self::api_server(true).await;
        let admin = api.client(ADMIN_TOKEN).await.unwrap();
        let (nodes, _) = cc::populate(&api, &admin, 1).await;
        let node = nodes.into_iter().next().unwrap();

        let (signer, ca_pem) = start_controller(&api, &admin, &[]).await;

        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, &node.token).unwrap();
        let ovs = node_ovsdb(dir.path(), &node.chassis);
        let pod = AgentPod {
            node: node.name.clone(),
            name: node.pod_name.clone(),
            uid: node.pod_uid.clone(),
        };
        Self::assemble(
            dir,
            api,
            ovs,
            kubeconfig,
            node.uid,
            pod,
            ca_pem,
            signer,
            (faults, clock),
        )
    }

    /// The embedded API server, RBAC on or off, with its fault switch and
    /// its clock in the test's hands.
    async fn api_server(rbac: bool) -> (ApiServerHandle, Arc<Faults>, Arc<JumpClock>) {
        let faults = Arc::new(Faults::default());
        let clock = Arc::new(JumpClock::default());
        let api = ApiServer::builder()
            .rbac(rbac)
            .faults(faults.clone())
            .clock(clock.clone())
            .start()
            .await
            .unwrap();
        (api, faults, clock)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dir: tempfile::TempDir,
        api: ApiServerHandle,
        ovs: OvsdbServer,
        kubeconfig: PathBuf,
        node_uid: String,
        pod: AgentPod,
        ca_pem: String,
        signer: JoinHandle<()>,
        (faults, clock): (Arc<Faults>, Arc<JumpClock>),
    ) -> Cluster {
        let standins = dir.path().join("standins");
        write_standins(&standins, &ca_pem);
        let netns = testbed::netns::Netns::create("koi-agent").unwrap();
        Cluster {
            dir,
            api,
            ovs,
            kubeconfig,
            node_uid,
            pod,
            ca_pem,
            netns,
            standins,
            faults,
            clock,
            signer,
        }
    }

    /// An unused loopback port for the agent's status server.
    pub fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Starts `kube-ovn-ipsec run` as a process against this cluster, with
    /// the stand-in runtime programs and the cluster's network namespace
    /// for the guards (a flag given in `extra` replaces the stand-in's).
    pub fn spawn_agent(
        &self,
        key_dir: &Path,
        status_port: u16,
        lifetime_secs: u32,
        extra: &[&str],
    ) -> Child {
        self.spawn_agent_env(key_dir, status_port, lifetime_secs, extra, &[])
    }

    /// [`Cluster::spawn_agent`] with environment variables `env` added.
    pub fn spawn_agent_env(
        &self,
        key_dir: &Path,
        status_port: u16,
        lifetime_secs: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        let mut args: Vec<String> = Vec::new();
        for (flag, value) in self.standin_flags() {
            if !extra.contains(&flag.as_str()) {
                args.push(flag);
                args.push(value);
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        spawn_agent_process(&AgentProcess {
            pod: &self.pod,
            ovsdb: &self.ovs.address(),
            kubeconfig: &self.kubeconfig,
            key_dir,
            status_port,
            lifetime_secs,
            log: &self.agent_log(),
            extra: &args,
            env,
        })
    }

    /// The runtime flags `spawn_agent` passes: stand-in programs, private
    /// run directories, the cluster's network namespace.
    pub fn standin_flags(&self) -> Vec<(String, String)> {
        let s = |p: &str| self.standins.join(p).display().to_string();
        let run = self.dir.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        vec![
            ("--ovn-controller".into(), s("ovn-controller")),
            ("--ovs-appctl".into(), s("ovs-appctl")),
            ("--ovn-controller-ctl".into(), "ovn-controller".into()),
            ("--ipsec".into(), s("ipsec")),
            ("--ike-rundir".into(), run.display().to_string()),
            ("--ipsec-cacerts-dir".into(), run.display().to_string()),
            ("--monitor-script".into(), s("ovs-monitor-ipsec")),
            ("--monitor-rundir".into(), run.display().to_string()),
            ("--xfrm-netns".into(), self.netns.name().to_string()),
            ("--probe-period".into(), "1".into()),
            ("--stop-grace".into(), "3".into()),
        ]
    }

    /// Starts `kube-ovn-ipsec run` against this cluster with exactly the
    /// runtime flags in `extra` (no stand-ins): the full-runtime variant.
    pub fn spawn_agent_with(
        &self,
        key_dir: &Path,
        status_port: u16,
        lifetime_secs: u32,
        extra: &[&str],
    ) -> Child {
        self.spawn_agent_as(&self.kubeconfig, key_dir, status_port, lifetime_secs, extra)
    }

    /// [`Cluster::spawn_agent_with`] with another identity's kubeconfig.
    pub fn spawn_agent_as(
        &self,
        kubeconfig: &Path,
        key_dir: &Path,
        status_port: u16,
        lifetime_secs: u32,
        extra: &[&str],
    ) -> Child {
        spawn_agent_process(&AgentProcess {
            pod: &self.pod,
            ovsdb: &self.ovs.address(),
            kubeconfig,
            key_dir,
            status_port,
            lifetime_secs,
            log: &self.agent_log(),
            extra,
            env: &[],
        })
    }

    /// Waits (bounded) for a Kubernetes Event with `reason` in `default`
    /// (where the agent records Events on its Node) and returns it.
    pub async fn wait_event(
        &self,
        reason: &str,
        timeout: Duration,
    ) -> k8s_openapi::api::core::v1::Event {
        use k8s_openapi::api::core::v1::Event;
        let admin = self.api.client(ADMIN_TOKEN).await.unwrap();
        let events: Api<Event> = Api::namespaced(admin, "default");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let list = events.list(&Default::default()).await.unwrap();
            if let Some(e) = list
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
            {
                return e;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {reason} Event within {timeout:?}\nagent logs:\n{}",
                self.agent_logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Open_vSwitch . external_ids`.
    pub fn external_ids(&self) -> std::collections::BTreeMap<String, String> {
        let out = self
            .ovs
            .vsctl(&["get", "Open_vSwitch", ".", "external_ids"])
            .unwrap();
        parse_ovs_map(out.trim())
    }

    /// Where spawned agents' stderr (JSON logs) goes, appended across runs.
    pub fn agent_log(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// The agents' logs so far.
    pub fn agent_logs(&self) -> String {
        std::fs::read_to_string(self.agent_log()).unwrap_or_default()
    }

    /// The three identity keys and one unrelated key of other_config.
    pub fn other_config(&self) -> std::collections::BTreeMap<String, String> {
        let out = self
            .ovs
            .vsctl(&["--format=json", "get", "Open_vSwitch", ".", "other_config"])
            .unwrap();
        // ovs-vsctl prints {key=value, ...} with quoted values when needed.
        parse_ovs_map(out.trim())
    }
}

/// Parses `ovs-vsctl get`'s `{a="x", b=y}` map rendering.
pub fn parse_ovs_map(s: &str) -> std::collections::BTreeMap<String, String> {
    let inner = s.trim_start_matches('{').trim_end_matches('}');
    inner
        .split(", ")
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((
                k.trim_matches('"').to_string(),
                v.trim_matches('"').to_string(),
            ))
        })
        .collect()
}

/// GETs `path` from the agent's status server: (HTTP code, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}
