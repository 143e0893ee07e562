//! Detects whether the `ovs-monitor-ipsec` script carries the project's patch.
//!
//! OVS 3.1's monitor (and upstream master) never loads the CA it writes into
//! `ipsec.conf` and tears down every established IKE_SA on each refresh
//! (`TESTBED.md`, defects 1–3; `docs/ovs-monitor-ipsec-patch.md`). The image
//! applies `image/patches/ovs-monitor-ipsec-3.1.patch`, which also adds the
//! marker line
//!
//! ```text
//! # kube-ovn-ipsec: ovs-monitor-ipsec-patch v6
//! ```
//!
//! The agent reads the script it is about to run (it runs the script, so the
//! script is what counts — not a package version) and reports what it
//! found ([`MonitorPatch::needs_ca_workaround`]); the trust bundle is
//! installed one file per CA either way (`ike::install_trust_bundle`).
//!
//! The detection is a pure function of the script text ([`detect`]);
//! [`inspect`] only adds reading the file.

use std::path::Path;

use crate::Error;

/// Where Debian's `openvswitch-ipsec` package (and the image) installs the
/// monitor; the image patches this file in place.
pub const DEFAULT_MONITOR_SCRIPT: &str = "/usr/share/openvswitch/scripts/ovs-monitor-ipsec";

/// The marker line's text before the version number. A line of the script
/// must be exactly this followed by the decimal version.
pub const MARKER_PREFIX: &str = "# kube-ovn-ipsec: ovs-monitor-ipsec-patch v";

/// The patch version this crate's image carries.
pub const CURRENT_PATCH_VERSION: u32 = 6;

/// What the script is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitorPatch {
    /// The script carries the project's patch, marker version `version`.
    Patched {
        /// The `v<N>` of the marker line.
        version: u32,
    },
    /// A stock ovs-monitor-ipsec (Debian's or upstream's).
    Unpatched,
}

impl MonitorPatch {
    /// Whether the agent must keep its CA workaround: copy the trust bundle
    /// into the IKE daemon's CA directory (`/etc/ipsec.d/cacerts/` for
    /// strongSwan) as part of each activation and have the daemon reread it
    /// (`ipsec rereadcacerts`).
    ///
    /// True only for an unpatched monitor: its `ca` section lacks
    /// `auto=add`, so starter never loads the CA and every peer fails
    /// authentication without the copy. Every patch version (v1 and later)
    /// loads the CA file itself — but only its first certificate, which is
    /// why the agent installs the bundle one file per CA in every case.
    pub fn needs_ca_workaround(self) -> bool {
        match self {
            MonitorPatch::Patched { version } => version < 1,
            MonitorPatch::Unpatched => true,
        }
    }

    /// Whether a refresh of the monitor keeps established IKE_SAs of
    /// unchanged tunnels (the patch's main fix). An unpatched monitor tears
    /// them all down whenever any tunnel is added or removed.
    pub fn refresh_keeps_established_sas(self) -> bool {
        !self.needs_ca_workaround()
    }

    /// Whether the monitor takes the rekeying arguments (`--ike-lifetime`,
    /// `--child-lifetime`, `--rekey-margin`, `--rekey-fuzz`) and writes
    /// `reauth=no` into every connection (patch v4 and later). Any other
    /// monitor leaves strongSwan's defaults: every IKE_SA reauthenticated,
    /// break before make, every 2h42–2h51.
    pub fn takes_rekeying(self) -> bool {
        matches!(self, MonitorPatch::Patched { version } if version >= 4)
    }

    /// Whether the monitor loads an ECDSA node key (patch v4 and later
    /// write `: PKCS8`; every other monitor writes `: RSA`, which charon
    /// refuses for an ECDSA key: "no private key found", no IKE_SA).
    pub fn loads_ecdsa_keys(self) -> bool {
        self.takes_rekeying()
    }

    /// Whether a renewal keeps the established connections and the
    /// monitor answers `tunnels/rebuild` (patch v5 and later).
    pub fn rebuilds(self) -> bool {
        matches!(self, MonitorPatch::Patched { version } if version >= 5)
    }
}

/// Classifies the text of an ovs-monitor-ipsec script.
///
/// Returns `None` when the text is not an ovs-monitor-ipsec script at all
/// (no `class IPsecMonitor`), so a misconfigured path is not mistaken for
/// an unpatched monitor.
pub fn detect(script: &str) -> Option<MonitorPatch> {
    if !script.contains("class IPsecMonitor") {
        return None;
    }
    let version = script
        .lines()
        .filter_map(|line| line.trim_end().strip_prefix(MARKER_PREFIX))
        .find_map(|v| v.parse::<u32>().ok());
    Some(match version {
        Some(version) => MonitorPatch::Patched { version },
        None => MonitorPatch::Unpatched,
    })
}

/// Reads the script at `path` and classifies it.
pub fn inspect(path: &Path) -> Result<MonitorPatch, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::ReadMonitorScript {
        path: path.to_path_buf(),
        source,
    })?;
    detect(&text).ok_or_else(|| Error::NotAMonitorScript {
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STOCK: &str = "#! /usr/bin/python3\n# limitations under the License.\n\nimport argparse\n\
        class IPsecMonitor(object):\n    pass\n";

    fn patched(marker: &str) -> String {
        STOCK.replace("import argparse", &format!("{marker}\n\nimport argparse"))
    }

    #[test]
    fn stock_script_is_unpatched_and_needs_the_workaround() {
        let p = detect(STOCK).unwrap();
        assert_eq!(p, MonitorPatch::Unpatched);
        assert!(p.needs_ca_workaround());
        assert!(!p.refresh_keeps_established_sas());
    }

    #[test]
    fn marker_v1_is_patched_and_drops_the_workaround() {
        let p = detect(&patched("# kube-ovn-ipsec: ovs-monitor-ipsec-patch v1")).unwrap();
        assert_eq!(p, MonitorPatch::Patched { version: 1 });
        assert!(!p.needs_ca_workaround());
        assert!(p.refresh_keeps_established_sas());
    }

    #[test]
    fn rekeying_arguments_from_v4() {
        assert!(!MonitorPatch::Unpatched.takes_rekeying());
        assert!(!MonitorPatch::Patched { version: 3 }.takes_rekeying());
        assert!(MonitorPatch::Patched { version: 4 }.takes_rekeying());
        assert!(!MonitorPatch::Patched { version: 4 }.rebuilds());
        assert!(!MonitorPatch::Unpatched.loads_ecdsa_keys());
        assert!(!MonitorPatch::Patched { version: 3 }.loads_ecdsa_keys());
        assert!(MonitorPatch::Patched { version: 4 }.loads_ecdsa_keys());
        assert!(MonitorPatch::Patched { version: 5 }.rebuilds());
        assert!(
            MonitorPatch::Patched {
                version: CURRENT_PATCH_VERSION
            }
            .takes_rekeying()
        );
    }

    #[test]
    fn later_versions_are_patched_too() {
        let p = detect(&patched("# kube-ovn-ipsec: ovs-monitor-ipsec-patch v12")).unwrap();
        assert_eq!(p, MonitorPatch::Patched { version: 12 });
        assert!(!p.needs_ca_workaround());
    }

    #[test]
    fn marker_must_be_a_whole_comment_line() {
        // Mentioned inside code or with a garbled version: not the marker.
        for text in [
            "x = '# kube-ovn-ipsec: ovs-monitor-ipsec-patch v1'",
            "# kube-ovn-ipsec: ovs-monitor-ipsec-patch vX",
            "# kube-ovn-ipsec: ovs-monitor-ipsec-patch v",
            "#kube-ovn-ipsec: ovs-monitor-ipsec-patch v1",
        ] {
            assert_eq!(
                detect(&patched(text)),
                Some(MonitorPatch::Unpatched),
                "{text}"
            );
        }
    }

    #[test]
    fn other_files_are_not_monitor_scripts() {
        assert_eq!(detect("#!/bin/sh\necho hello\n"), None);
        assert_eq!(detect(""), None);
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = inspect(Path::new("/nonexistent/ovs-monitor-ipsec")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/ovs-monitor-ipsec"),
            "{err}"
        );
        assert_eq!(err.metric_label(), "read_monitor_script");
    }

    #[test]
    fn wrong_file_is_an_error_not_unpatched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-the-monitor");
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        let err = inspect(&path).unwrap_err();
        assert!(matches!(err, Error::NotAMonitorScript { .. }), "{err}");
    }

    #[test]
    fn current_version_matches_the_patch_file() {
        let patch = include_str!("../../image/patches/ovs-monitor-ipsec-3.1.patch");
        let marker = format!("+{MARKER_PREFIX}{CURRENT_PATCH_VERSION}\n");
        assert!(
            patch.contains(&marker),
            "patch file lacks the added line {marker:?}"
        );
    }
}
