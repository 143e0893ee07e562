//! Harness for running the real components this project talks to.
//!
//! Tests, benches and the lab use the real `ovsdb-server`, `ovn-northd`,
//! strongSwan, `ovs-monitor-ipsec` and kernel XFRM in network namespaces
//! (see `TESTBED.md`). This crate starts them in temporary directories and
//! stops them when their handle is dropped, so a failing test never leaves a
//! daemon behind.
//!
//! # Layout
//! - [`require_program`]: the one place a missing external program turns into
//!   a loud, named failure instead of a silent skip.
//! - `ovs`: ovsdb-server (Open_vSwitch, OVN NB, OVN SB schemas) and ovn-northd.
//! - `netns`: network (and mount) namespaces and veth pairs.
//! - `ipsec`: a simulated node running strongSwan starter and ovs-monitor-ipsec.
//! - `overlay`: the data path beside it — ovs-vswitchd on the OVS kernel
//!   datapath, pod ports, and the instruments that show what the underlay
//!   carries (capture, ping, TCP throughput, XFRM counters).
//! - `probe`: a steady ping stream whose losses are counted per phase.
//! - `guest`: a full kernel (ESP, GENEVE, OVS kernel datapath) for the
//!   kernel checks: the host's when it has them, otherwise Debian's under
//!   qemu; `koi-kernel-run` runs a command there.

// A harness of real daemons in real time: it waits for sockets and
// processes with blocking sleeps and wall-clock deadlines, outside any async
// executor, and is never part of a shipped binary.
#![allow(clippy::disallowed_methods)]

pub mod guest;
pub mod ipsec;
pub mod netns;
pub mod overlay;
pub mod ovs;
pub mod probe;

use std::path::PathBuf;

/// A required external program is not installed.
///
/// Tests call [`require_program`] and unwrap its result, so the test fails
/// with the program's name and the install hint instead of passing silently.
#[derive(Debug, thiserror::Error)]
#[error(
    "required program `{name}` not found on PATH or in /usr/sbin, /usr/bin, /usr/lib/ipsec: run scripts/install-deps.sh (as root) to install it"
)]
pub struct MissingProgram {
    /// The program that was looked for.
    pub name: String,
}

/// Finds `name` on `PATH` (and in the sbin directories root's PATH may lack).
///
/// Returns the absolute path, or [`MissingProgram`] naming the program.
pub fn require_program(name: &str) -> Result<PathBuf, MissingProgram> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/usr/lib/ipsec",
        "/usr/share/openvswitch/scripts",
    ];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| MissingProgram {
            name: name.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_program_names_itself() {
        let err = require_program("definitely-not-a-real-program-xyz").unwrap_err();
        assert!(
            err.to_string()
                .contains("definitely-not-a-real-program-xyz")
        );
    }

    #[test]
    fn finds_sh() {
        assert!(require_program("sh").unwrap().is_absolute());
    }
}
