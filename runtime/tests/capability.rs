//! The capability gate against real programs: Debian's ovn-controller
//! (without the output-protection patch) and a real unixctl server that
//! lacks the marker are refused; stand-ins advertising the marker pass.
//! A refusal happens before any lease exists.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use kube_ovn_ipsec_runtime::Error;
use kube_ovn_ipsec_runtime::capability::{self, CAPABILITY_MARKER, CapabilityConfig, Which};
use kube_ovn_ipsec_runtime::lease::LeaseStore;
use kube_ovn_ipsec_runtime::process::Launcher;

fn stand_in(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\nprintf '%s\\n' '{text}'\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[tokio::test]
async fn gate_refuses_debian_ovn_controller_and_a_running_daemon_without_the_marker() {
    let ovn_controller = testbed::require_program("ovn-controller").unwrap();
    let appctl = testbed::require_program("ovs-appctl").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let store = LeaseStore::new(keys.path());

    // A real unixctl server without the marker (ovsdb-server's `version`).
    let server = testbed::ovs::OvsdbServer::start_vswitch(dir.path()).unwrap();
    let marker_ovn = stand_in(
        dir.path(),
        "ovn-controller-patched",
        &format!("ovn-controller 24.03.90\n{CAPABILITY_MARKER}"),
    );
    let marker_appctl = stand_in(
        dir.path(),
        "appctl-patched",
        &format!("ovn-controller 24.03.90\n{CAPABILITY_MARKER}"),
    );

    // Image: Debian's real ovn-controller --version.
    let cfg = CapabilityConfig {
        ovn_controller: ovn_controller.into_os_string(),
        appctl: marker_appctl.clone().into_os_string(),
        running_ctl: "unused".into(),
    };
    let err = capability::check(&cfg, &Launcher::direct())
        .await
        .unwrap_err();
    println!("image refusal: {err}");
    assert!(
        matches!(
            err,
            Error::CapabilityMissing {
                which: Which::Image,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.metric_label(), "capability_missing");

    // Running: a real unixctl socket answering `version` without the marker.
    let cfg = CapabilityConfig {
        ovn_controller: marker_ovn.clone().into_os_string(),
        appctl: appctl.into_os_string(),
        running_ctl: server.ctl_path().as_os_str().to_owned(),
    };
    let err = capability::check(&cfg, &Launcher::direct())
        .await
        .unwrap_err();
    println!("running refusal: {err}");
    assert!(
        matches!(
            err,
            Error::CapabilityMissing {
                which: Which::Running,
                ..
            }
        ),
        "{err}"
    );

    // Nothing was allocated or written by a refused gate.
    assert!(!store.path().exists());
    assert_eq!(std::fs::read_dir(keys.path()).unwrap().count(), 0);

    // Both advertise the marker (the lab's stand-ins): the gate passes.
    let cfg = CapabilityConfig {
        ovn_controller: marker_ovn.into_os_string(),
        appctl: marker_appctl.into_os_string(),
        running_ctl: "ovn-controller".into(),
    };
    capability::check(&cfg, &Launcher::direct()).await.unwrap();
    assert_eq!(capability::CAPABILITY_MISSING_EXIT_CODE, 3);
}
