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

/// The ovn-controller patches the image's base applies
/// (`image/patches/ovn-controller-*.patch`, one per OVN line) speak the
/// contract's names: the marker the gate looks for, the four lease keys
/// the agent publishes, the tunnel options it expects, and kube-proxy's
/// reserved bits the agent always keeps. A renamed key on either side
/// fails here, not on a node. (The patches' behaviour is proven on the
/// real ovn-controller by OVN's own test suite case they add.)
#[test]
fn the_ovn_controller_patches_use_the_contracts_names() {
    use kube_ovn_ipsec_api::names::{defaults, ovs};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../image/patches");
    let mut code = Vec::new();
    for line in ["23.03", "25.03"] {
        let file = dir.join(format!("ovn-controller-{line}.patch"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // The lines the patch adds to ovn-controller's sources (not to the
        // test suite), per file.
        let mut added = String::new();
        let mut in_source = false;
        for l in text.lines() {
            if let Some(path) = l.strip_prefix("+++ b/") {
                in_source = path.starts_with("controller/");
            } else if in_source && l.starts_with('+') {
                added.push_str(&l[1..]);
                added.push('\n');
            }
        }
        let want = [
            format!("#define OVN_IPSEC_OUTPUT_PROTECTION \"{CAPABILITY_MARKER}\""),
            format!(
                "#define IPSEC_LEASE_RESERVED_MARK_BITS {:#x}u",
                defaults::RESERVED_MARK_BITS
            ),
        ]
        .into_iter()
        .chain(ovs::PROTECTION_KEYS.iter().map(|k| format!("\"{k}\"")))
        .chain(
            [
                ovs::OPTION_EGRESS_PKT_MARK,
                ovs::OPTION_IPSEC_MARK_OUT,
                ovs::OPTION_IPSEC_REQID,
            ]
            .iter()
            .map(|o| format!("\"{o}\"")),
        );
        for w in want {
            assert!(added.contains(&w), "{}: adds no {w}", file.display());
        }
        // The mark goes out in decimal (ovs-vswitchd reads only base 10) and
        // as mark/0xffffffff, as the guards match it.
        assert!(
            added.contains("\"%\"PRIu32\"/0xffffffff\""),
            "{}",
            file.display()
        );
        code.push(added);
    }
    // One behaviour: both OVN lines get the same code.
    assert_eq!(code[0], code[1]);
}
