//! The capability gate (SPEC §4): before any lease or identity, the
//! ovn-controller in the image (`ovn-controller --version`) **and** the one
//! running on the node (`ovs-appctl -t <its ctl> version`) must advertise
//! [`CAPABILITY_MARKER`]. Otherwise the agent stops with
//! [`crate::Error::CapabilityMissing`] and [`CAPABILITY_MISSING_EXIT_CODE`].
//!
//! Both the program and the control socket are configuration, so the lab
//! (SPEC §11) can give a stand-in that advertises the marker.

use std::ffi::OsString;
use std::time::Duration;

pub use kube_ovn_ipsec_api::names::host::CAPABILITY_MARKER;

use crate::Error;
use crate::process::Launcher;

/// The agent's exit code when the gate fails (the contract's code).
pub const CAPABILITY_MISSING_EXIT_CODE: i32 =
    kube_ovn_ipsec_api::names::exit_code::CAPABILITY_MISSING;

/// Timeout of each probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the two ovn-controllers are.
#[derive(Debug, Clone)]
pub struct CapabilityConfig {
    /// The image's ovn-controller program (`ovn-controller`).
    pub ovn_controller: OsString,
    /// `ovs-appctl`.
    pub appctl: OsString,
    /// The running ovn-controller's control socket (or `-t` target, e.g.
    /// `/var/run/ovn/ovn-controller.<pid>.ctl` or `ovn-controller`).
    pub running_ctl: OsString,
}

impl Default for CapabilityConfig {
    fn default() -> Self {
        Self {
            ovn_controller: "ovn-controller".into(),
            appctl: "ovs-appctl".into(),
            running_ctl: "/var/run/ovn/ovn-controller.ctl".into(),
        }
    }
}

/// Which ovn-controller lacked the marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The image's program.
    Image,
    /// The running daemon.
    Running,
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Which::Image => "image ovn-controller --version",
            Which::Running => "running ovn-controller (unixctl version)",
        })
    }
}

/// Whether a version text advertises the capability: one of its lines is
/// exactly the marker (trimmed), so a longer or different version string
/// ("... version 10") does not count.
pub fn advertises(text: &str) -> bool {
    text.lines().any(|l| l.trim() == CAPABILITY_MARKER)
}

/// Runs both probes; `Ok` only when both advertise the marker.
pub async fn check(config: &CapabilityConfig, launcher: &Launcher) -> Result<(), Error> {
    let probes: [(Which, OsString, Vec<OsString>); 2] = [
        (
            Which::Image,
            config.ovn_controller.clone(),
            vec!["--version".into()],
        ),
        (
            Which::Running,
            config.appctl.clone(),
            vec!["-t".into(), config.running_ctl.clone(), "version".into()],
        ),
    ];
    for (which, program, args) in probes {
        let (status, out) = match launcher.output(program, args, PROBE_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => {
                return Err(Error::CapabilityMissing {
                    which,
                    detail: e.to_string(),
                });
            }
        };
        if !status.success() {
            return Err(Error::CapabilityMissing {
                which,
                detail: format!("exited with {status}"),
            });
        }
        if !advertises(&out) {
            let first = out.lines().next().unwrap_or_default().to_string();
            return Err(Error::CapabilityMissing {
                which,
                detail: format!("no `{CAPABILITY_MARKER}` line (first line: {first:?})"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_must_be_a_whole_line() {
        assert!(advertises(
            "ovn-controller 24.03.2\nIPsec output protection version 1\n"
        ));
        assert!(!advertises(
            "ovn-controller 23.03.0\nOpen vSwitch Library 3.1.0\n"
        ));
        assert!(!advertises("IPsec output protection version 10\n"));
        assert_eq!(CAPABILITY_MISSING_EXIT_CODE, 3);
    }
}
