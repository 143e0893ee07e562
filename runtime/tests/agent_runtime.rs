//! `kube-ovn-ipsec run` as a process with its runtime actors:
//!
//! - the capability gate refuses Debian's ovn-controller (image) and a
//!   running daemon without the marker before any key, CSR or lease exists
//!   (exit code 3, empty key directory, no lease in `external_ids`, no CSR);
//! - with real strongSwan and Debian's ovs-monitor-ipsec in a simulated
//!   node's namespaces: ready; the IKE daemon killed (then, separately, the
//!   monitor) is restarted by its actor after the 1 s backoff, the guards
//!   are in every XFRM dump taken meanwhile, readyz is false during the
//!   outage and true again after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};
use kube_ovn_ipsec_runtime::lease::LeaseStore;
use kube_ovn_ipsec_runtime::xfrm::model::{Family, Policy, compare_guard};
use kube_ovn_ipsec_runtime::xfrm::{Xfrm, XfrmHandle};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgid};
use support::cluster::{Cluster, http_get};
use testbed::ipsec::{DEBIAN_MONITOR_SCRIPT, IpsecNode};

async fn wait_exit(agent: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(c) = agent.try_wait().unwrap() {
            return c;
        }
        assert!(Instant::now() < deadline, "agent did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn csr_count(cluster: &Cluster) -> usize {
    let client = cluster
        .api
        .client(lab::apiserver::ADMIN_TOKEN)
        .await
        .unwrap();
    Api::<CertificateSigningRequest>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len()
}

fn assert_nothing_created(cluster: &Cluster, key_dir: &Path) {
    let entries = std::fs::read_dir(key_dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(entries, 0, "the key directory must stay empty");
    let ids = cluster.external_ids();
    assert!(
        !ids.keys().any(|k| k.starts_with("ovn-ipsec-protection")),
        "no lease may be published: {ids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capability_missing_refuses_before_any_key_csr_or_lease() {
    let t0 = Instant::now();
    let ovn_controller = testbed::require_program("ovn-controller").unwrap();
    let appctl = testbed::require_program("ovs-appctl").unwrap();
    let cluster = Cluster::start(Duration::from_secs(3600)).await;

    // Image: Debian's real ovn-controller lacks the marker.
    let key_dir = cluster.dir.path().join("keys-image");
    let port = Cluster::free_port();
    let oc = ovn_controller.display().to_string();
    let mut agent = cluster.spawn_agent(&key_dir, port, 600, &["--ovn-controller", &oc]);
    let code = wait_exit(&mut agent, Duration::from_secs(30)).await;
    println!("image refusal: {code:?} after {:?}", t0.elapsed());
    assert_eq!(code.code(), Some(3), "logs:\n{}", cluster.agent_logs());
    assert_nothing_created(&cluster, &key_dir);

    // Running: a real unixctl server answering `version` without it.
    let key_dir = cluster.dir.path().join("keys-running");
    let ctl = cluster.ovs.ctl_path().display().to_string();
    let appctl = appctl.display().to_string();
    let mut agent = cluster.spawn_agent(
        &key_dir,
        Cluster::free_port(),
        600,
        &["--ovs-appctl", &appctl, "--ovn-controller-ctl", &ctl],
    );
    let code = wait_exit(&mut agent, Duration::from_secs(30)).await;
    println!("running refusal: {code:?} after {:?}", t0.elapsed());
    assert_eq!(code.code(), Some(3));
    assert_nothing_created(&cluster, &key_dir);
    assert_eq!(csr_count(&cluster).await, 0, "no CSR may be created");
    let logs = cluster.agent_logs();
    assert!(logs.contains("capability gate failed"), "{logs}");
}

fn guards_in_dump(xfrm: &mut XfrmHandle, mark: u32) -> usize {
    let policies = xfrm.dump_policies().unwrap();
    policies
        .iter()
        .filter(|p| {
            Family::ALL
                .iter()
                .any(|f| compare_guard(&Policy::guard(*f, mark), p).is_empty())
        })
        .count()
}

async fn ready(port: u16) -> bool {
    http_get(port, "/readyz").await.map(|(c, _)| c) == Some(200)
}

/// Kills the process group of the process in `pidfile`, then takes XFRM
/// dumps until readyz is back: every dump holds both guards, readyz was
/// false in between, and the pidfile names a new process. Returns the
/// time from the kill to the new process's pidfile and to readyz.
async fn outage(
    what: &str,
    pidfile: &Path,
    xfrm: &mut XfrmHandle,
    mark: u32,
    port: u16,
    cluster: &Cluster,
    node: &IpsecNode,
) -> (Duration, Duration) {
    let old: i32 = std::fs::read_to_string(pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pgid = getpgid(Some(Pid::from_raw(old))).unwrap();
    killpg(pgid, Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    let (mut dumps, mut unready, mut restarted) = (0, 0, None);
    loop {
        assert_eq!(
            guards_in_dump(xfrm, mark),
            2,
            "guards missing during the {what} outage"
        );
        dumps += 1;
        if !ready(port).await {
            unready += 1;
        } else if restarted.is_some() {
            break;
        }
        if restarted.is_none()
            && let Some(pid) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            && pid != old
            && Path::new(&format!("/proc/{pid}")).exists()
        {
            restarted = Some(killed.elapsed());
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "{what} not back and ready:\n{}\n{}",
            node.diagnostics(),
            cluster.agent_logs()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let back = killed.elapsed();
    let restarted = restarted.unwrap();
    println!(
        "{what} killed: restarted after {restarted:?}, ready again after {back:?}; {dumps} XFRM dumps all held both guards; readyz false in {unready} polls"
    );
    assert!(unready > 0, "readyz must be false while the {what} is down");
    // The first restart follows the 1 s backoff (plus the exit poll).
    assert!(
        restarted >= Duration::from_secs(1) && restarted < Duration::from_secs(6),
        "{what} restarted after {restarted:?}"
    );
    (restarted, back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_ike_daemon_and_monitor_restart_with_guards_in_place() {
    for p in ["ipsec", "ovs-appctl", "nsenter", "ip", "python3"] {
        testbed::require_program(p).unwrap();
    }
    assert!(Path::new(DEBIAN_MONITOR_SCRIPT).exists());
    let t0 = Instant::now();
    let cluster = Cluster::start(Duration::from_secs(3600)).await;
    let node = IpsecNode::new(
        "koi-rt-agent",
        support::cluster::CHASSIS,
        [10, 78, 0, 1].into(),
    )
    .unwrap();
    // ovs-appctl for the monitor, the stand-in's marker for the
    // (not running here) patched ovn-controller.
    let appctl = cluster.standins.join("ovs-appctl-real");
    std::fs::write(
        &appctl,
        format!(
            "#!/bin/sh\nif [ \"$3\" = version ] && [ \"$2\" = ovn-controller ]; then exec {} \"$@\"; fi\nexec ovs-appctl \"$@\"\n",
            cluster.standins.join("ovs-appctl").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &appctl,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();

    let key_dir = cluster.dir.path().join("keys");
    let port = Cluster::free_port();
    let s = |p: &Path| p.display().to_string();
    let flags: Vec<String> = vec![
        "--ovn-controller".into(),
        s(&cluster.standins.join("ovn-controller")),
        "--ovs-appctl".into(),
        s(&appctl),
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
        DEBIAN_MONITOR_SCRIPT.into(),
        "--monitor-python".into(),
        "/usr/bin/python3".into(),
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
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut agent = cluster.spawn_agent_with(&key_dir, port, 600, &flags);

    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(port).await {
        assert!(
            Instant::now() < deadline,
            "not ready: {:?}\n{}\n{}",
            http_get(port, "/status").await,
            node.diagnostics(),
            cluster.agent_logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "ready with real strongSwan and monitor after {:?}",
        t0.elapsed()
    );
    let (_, status) = http_get(port, "/status").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["protectionArmed"], true);
    assert_eq!(status["runtimeHealthy"], true);
    assert_eq!(status["configurationApplied"], true);

    let lease = LeaseStore::new(&key_dir).load().unwrap().unwrap();
    let ids = cluster.external_ids();
    assert_eq!(
        ids.get("ovn-ipsec-protection-mark"),
        Some(&lease.mark.to_string()),
        "{ids:?}"
    );
    let mut xfrm = XfrmHandle::in_netns(node.netns().name()).unwrap();
    assert_eq!(guards_in_dump(&mut xfrm, lease.mark), 2);

    outage(
        "IKE daemon",
        &node.run_path("starter.charon.pid"),
        &mut xfrm,
        lease.mark,
        port,
        &cluster,
        &node,
    )
    .await;
    outage(
        "monitor",
        &node.run_path("openvswitch/ovs-monitor-ipsec.pid"),
        &mut xfrm,
        lease.mark,
        port,
        &cluster,
        &node,
    )
    .await;

    // SIGTERM: the agent stops its processes and leaves the guards.
    nix::sys::signal::kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM).unwrap();
    let code = wait_exit(&mut agent, Duration::from_secs(30)).await;
    assert!(code.success(), "{code:?}\n{}", cluster.agent_logs());
    assert_eq!(
        guards_in_dump(&mut xfrm, lease.mark),
        2,
        "guards outlive the agent"
    );
    let starter = node.run_path("starter.charon.pid");
    if let Ok(pid) = std::fs::read_to_string(&starter) {
        assert!(
            !Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "IKE daemon left running"
        );
    }
    println!("total {:?}", t0.elapsed());
}
