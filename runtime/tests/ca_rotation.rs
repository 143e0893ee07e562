//! A whole CA rotation, driven by the controller, on two simulated nodes:
//! the embedded API server with RBAC on, the real controller (built-in CA),
//! and per node an agent process with its Pod-bound token, its own
//! ovsdb-server, real strongSwan and the patched ovs-monitor-ipsec in the
//! node's namespaces, and a tunnel to the other node.
//!
//! 1. Both nodes run leaves from the first CA; IKE_SAs come up both ways.
//! 2. `ca rotate` (the CLI's own function, as the operator): the bundle
//!    becomes [old, new], the controller switches and announces the new CA;
//!    each agent renews onto it within its rotation spread and
//!    acknowledges the two-CA bundle.
//! 3. `ca retire` with the digest the nodes acknowledged: the bundle is
//!    [new]; each agent installs it and drops only its file of the old CA.
//!
//! IKE_SAs are re-established both ways after each step, and neither
//! charon logs an authentication failure at any point. The kernel here has
//! no ESP, so CHILD_SAs fail; only IKE_SAs are asserted.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod ike_node;
mod support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use apiserver::{ADMIN_TOKEN, ApiServer};
use ike_node::{Outcome, initiate, start_ovsdb, tear_down};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube_ovn_ipsec_api::clock::SystemClock;
use kube_ovn_ipsec_api::names::{k8s, ovs};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_runtime::ike::CA_FILE_PREFIX;
use kube_ovn_ipsec_runtime::process::{Launcher, Supervised};
use support::cluster::{AgentPod, AgentProcess, http_get, spawn_agent_process};
use support::controller_cluster as cc;
use testbed::ipsec::{DEBIAN_MONITOR_SCRIPT, IpsecNode, Tunnel};
use testbed::netns::wait_for;

/// Lines charon writes when a peer's authentication fails.
const AUTH_FAILURES: [&str; 4] = [
    "AUTHENTICATION_FAILED",
    "no trusted",
    "constraint check failed",
    "signature validation failed",
];

/// One node: its namespaces, its ovsdb-server and its agent.
struct AgentNode {
    // Field order is drop order: the agent, then the database, then the
    // namespaces and files.
    agent: Child,
    _ovsdb: Supervised,
    node: IpsecNode,
    key_dir: PathBuf,
    port: u16,
    log: PathBuf,
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        // SIGTERM: the agent stops its IKE daemon and monitor itself.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.agent.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.agent.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

impl AgentNode {
    /// `/status`, once it answers.
    async fn status(&self) -> Option<serde_json::Value> {
        let (code, body) = http_get(self.port, "/status").await?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    async fn ready(&self) -> bool {
        http_get(self.port, "/readyz").await.map(|(c, _)| c) == Some(200)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The lease as the agent published it: (mark, reqid).
    fn lease(&self) -> (u32, u32) {
        let get = |key: &str| -> u32 {
            let v = self
                .node
                .vsctl(&["get", "Open_vSwitch", ".", &format!("external_ids:{key}")])
                .unwrap();
            v.trim().trim_matches('"').parse().unwrap()
        };
        (
            get(ovs::EXTERNAL_ID_PROTECTION_MARK),
            get(ovs::EXTERNAL_ID_PROTECTION_REQID),
        )
    }

    /// The leaf OVSDB points the monitor at.
    fn leaf(&self) -> Certificate {
        let path = self
            .node
            .vsctl(&["get", "Open_vSwitch", ".", "other_config:certificate"])
            .unwrap();
        let path = path.trim().trim_matches('"');
        Certificate::from_pem(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The agent's own CA files in the IKE daemon's cacerts directory.
    fn own_ca_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.node.etc_path("ipsec.d/cacerts"))
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                name.starts_with(CA_FILE_PREFIX).then_some(name)
            })
            .collect();
        v.sort();
        v
    }

    /// Waits (bounded) until the agent is ready and `done` holds for its
    /// status; fails naming `what` with the status and the logs.
    async fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&serde_json::Value) -> bool) {
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The CA file name the agent installs for `ca`.
fn ca_file(ca: &Certificate) -> String {
    format!("{CA_FILE_PREFIX}{}.pem", &ca.digest().to_hex()[..16])
}

/// Starts node `node`'s ovsdb-server and its agent as `fx`'s Pod.
fn start_node(
    node: IpsecNode,
    fx: &cc::NodeFx,
    api: &apiserver::ApiServerHandle,
    dir: &Path,
    script: &Path,
) -> AgentNode {
    let launcher = Launcher::nsenter(node.netns().holder_pid());
    let ovsdb = start_ovsdb(&node, &launcher);
    node.vsctl(&["init"]).unwrap();
    node.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        &format!("external_ids:system-id={}", node.chassis()),
    ])
    .unwrap();
    node.vsctl(&["add-br", "br-int"]).unwrap();

    let own = dir.join(&fx.name);
    std::fs::create_dir_all(&own).unwrap();
    let kubeconfig = own.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, &fx.token).unwrap();
    let standins = own.join("standins");
    let appctl = support::cluster::write_capability_standins(&standins);
    // RSA node keys (the default): ovs-monitor-ipsec writes the key into
    // ipsec.secrets as `: RSA`, which charon cannot load for an ECDSA key.
    let mut flags = vec!["--rotation-spread".to_owned(), "4".to_owned()];
    flags.extend(support::cluster::real_runtime_flags(
        &node, &standins, &appctl, script,
    ));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let key_dir = own.join("keys");
    let port = support::cluster::Cluster::free_port();
    let log = own.join("agent.log");
    let pod = AgentPod {
        node: fx.name.clone(),
        name: fx.pod_name.clone(),
        uid: fx.pod_uid.clone(),
    };
    let sock = format!("unix:{}", node.run_path("openvswitch/db.sock").display());
    let agent = spawn_agent_process(&AgentProcess {
        pod: &pod,
        ovsdb: &sock,
        kubeconfig: &kubeconfig,
        key_dir: &key_dir,
        status_port: port,
        lifetime_secs: 3600,
        log: &log,
        extra: &flags,
    });
    AgentNode {
        agent,
        _ovsdb: ovsdb,
        node,
        key_dir,
        port,
        log,
    }
}

/// Adds each node's tunnel to the other, with its lease, as the patched
/// ovn-controller would, and waits until the monitor routed the conns.
fn connect(a: &AgentNode, b: &AgentNode) {
    for (n, peer) in [(a, b), (b, a)] {
        let (mark, reqid) = n.lease();
        n.node
            .add_tunnel(&Tunnel {
                mark,
                reqid,
                ..Tunnel::to(&peer.node, 0)
            })
            .unwrap();
    }
    for (n, peer) in [(a, b), (b, a)] {
        let name = Tunnel::to(&peer.node, 0).name;
        wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
            let routed = n.node.routed_conns().ok()?;
            (routed.iter().filter(|c| c.starts_with(&name)).count() >= 2).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "conns of {name} not routed:\n{}\n{}",
                n.logs(),
                n.node.diagnostics()
            )
        });
    }
}

/// An IKE_SA initiated from each side in turn comes up; torn down after.
fn both_ways_establish(a: &AgentNode, b: &AgentNode, when: &str) {
    for (from, to, who) in [(a, b, "A→B"), (b, a, "B→A")] {
        let (outcome, waited) = initiate(&from.node, from.lease().0, &to.node);
        let Some(Outcome::Established(sa)) = outcome else {
            panic!(
                "{when}, {who}: {outcome:?}\n{}\n{}",
                from.node.diagnostics(),
                to.node.diagnostics()
            )
        };
        println!(
            "{when}, {who}: IKE_SA {} ESTABLISHED after {waited:?}",
            sa.conn
        );
        tear_down(&from.node, &to.node);
    }
}

fn no_auth_failures(nodes: &[&AgentNode]) {
    for n in nodes {
        let log = n.node.charon_log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| AUTH_FAILURES.iter().any(|p| l.contains(p)))
            .collect();
        assert!(
            bad.is_empty(),
            "{}: authentication failures in charon's log:\n{}",
            n.node.chassis(),
            bad.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_driven_rotation_moves_every_node_without_an_authentication_failure() {
    for p in [
        "ipsec",
        "ovsdb-server",
        "ovs-vsctl",
        "ovs-appctl",
        "nsenter",
        "patch",
    ] {
        testbed::require_program(p).unwrap();
    }
    assert!(Path::new(DEBIAN_MONITOR_SCRIPT).exists());
    let script =
        testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = api.client(ADMIN_TOKEN).await.unwrap();
    let (fxs, _) = cc::populate(&api, &admin, 2).await;
    let (controller, first_pem) =
        support::cluster::start_controller(&api, &admin, &["--ca-reload", "1s"]).await;
    let old = TrustBundle::from_pem(first_pem.as_bytes())
        .unwrap()
        .certificates()[0]
        .clone();

    let (na, nb) = IpsecNode::pair("koi-rot", &fxs[0].chassis, &fxs[1].chassis).unwrap();
    let a = start_node(na, &fxs[0], &api, dir.path(), script);
    let b = start_node(nb, &fxs[1], &api, dir.path(), script);
    for n in [&a, &b] {
        n.wait("active and ready", Duration::from_secs(60), |s| {
            s["generation"].as_u64().unwrap_or(0) >= 1
        })
        .await;
        n.leaf().verify_issued_by(&old).unwrap();
    }
    println!("both nodes active on the first CA after {:?}", t0.elapsed());
    connect(&a, &b);
    both_ways_establish(&a, &b, "first CA");

    // The operator rotates (what `kube-ovn-ipsec-controller ca rotate` runs).
    let settings = controller::ca::CaSettings {
        namespace: cc::NS.into(),
        algorithm: controller::signer::CaKeyAlgorithm::EcdsaP256,
        lifetime: Duration::from_secs(3650 * 86400),
    };
    let rotated_at = Instant::now();
    let both = controller::ca::rotate_ca(&admin, &settings, &SystemClock)
        .await
        .unwrap();
    let new = both
        .certificates()
        .iter()
        .find(|c| c.der() != old.der())
        .unwrap()
        .clone();
    assert_eq!(both.certificates().len(), 2);
    // The running controller switches and announces the new CA.
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), cc::NS);
    let fingerprint = new.digest().to_hex();
    wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let cm = futures::executor::block_on(maps.get(k8s::TRUST_CONFIGMAP)).ok()?;
        (cm.metadata.annotations?.get(k8s::SIGNING_CA_ANNOTATION)? == &fingerprint).then_some(())
    })
    .expect("the controller announces the new signing CA");
    let both_digest = both.digest().to_hex();
    for n in [&a, &b] {
        n.wait(
            "renewed onto the new CA with the two-CA bundle acknowledged",
            Duration::from_secs(60),
            |s| {
                s["trustDigest"].as_str() == Some(both_digest.as_str())
                    && s["configurationApplied"] == true
            },
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while n.leaf().verify_issued_by(&new).is_err() {
            assert!(
                Instant::now() < deadline,
                "{}: still on the old CA:\n{}",
                n.node.chassis(),
                n.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        n.wait("ready on the new leaf", Duration::from_secs(30), |s| {
            s["configurationApplied"] == true
        })
        .await;
        assert_eq!(n.own_ca_files(), {
            let mut v = vec![ca_file(&old), ca_file(&new)];
            v.sort();
            v
        });
        assert!(
            n.logs()
                .contains("CA rotation: renewing onto the signing CA"),
            "{}: the renewal was not the rotation's",
            n.node.chassis()
        );
    }
    println!(
        "both nodes on the new CA {:?} after the rotation",
        rotated_at.elapsed()
    );
    both_ways_establish(&a, &b, "new CA, bundle [old, new]");

    // The operator retires the old CA with the digest every node reports.
    let retired = controller::ca::retire_old_cas(&admin, cc::NS, &both_digest)
        .await
        .unwrap();
    let retired_digest = retired.digest().to_hex();
    for n in [&a, &b] {
        n.wait(
            "the retired bundle acknowledged",
            Duration::from_secs(60),
            |s| {
                s["trustDigest"].as_str() == Some(retired_digest.as_str())
                    && s["configurationApplied"] == true
            },
        )
        .await;
        assert_eq!(n.own_ca_files(), vec![ca_file(&new)]);
    }
    both_ways_establish(&a, &b, "bundle [new]");
    no_auth_failures(&[&a, &b]);
    assert!(a.key_dir.exists() && b.key_dir.exists());
    println!("whole rotation done after {:?}", t0.elapsed());
    controller.abort();
}
