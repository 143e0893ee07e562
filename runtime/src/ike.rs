//! The IKE daemon: strongSwan's `ipsec start --nofork` (starter + charon,
//! the stroke interface ovs-monitor-ipsec drives) in the foreground, its
//! health probe (`ipsec statusall`), the loaded certificates
//! (`ipsec listcerts` / `listcacerts`), and the CA workaround for an
//! unpatched monitor.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;
use crate::monitor_patch::MonitorPatch;
use crate::process::{Launcher, ProcessSpec, Supervised};

/// Timeout of one `ipsec` control command.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How the IKE daemon is run.
#[derive(Debug, Clone)]
pub struct IkeConfig {
    /// The `ipsec` script (`/usr/sbin/ipsec`).
    pub ipsec: OsString,
    /// Where its output goes.
    pub log_file: Option<PathBuf>,
    /// Grace period between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// strongSwan's CA directory (`/etc/ipsec.d/cacerts`), for the CA
    /// workaround.
    pub cacerts_dir: PathBuf,
}

impl Default for IkeConfig {
    fn default() -> Self {
        Self {
            ipsec: "ipsec".into(),
            log_file: None,
            stop_grace: Duration::from_secs(10),
            cacerts_dir: PathBuf::from("/etc/ipsec.d/cacerts"),
        }
    }
}

/// An IKE_SA as `ipsec statusall` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeSa {
    /// Connection name (`ovn-chassb-0-out-1`).
    pub conn: String,
    /// charon's unique id.
    pub unique_id: u32,
    /// State (`ESTABLISHED`, `CONNECTING`, ...).
    pub state: String,
}

/// A CHILD_SA line of `ipsec statusall`: `<conn>{<n>}:  <STATE>, ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSa {
    /// Connection name.
    pub conn: String,
    /// State word (`INSTALLED`, `ROUTED`, ...).
    pub state: String,
    /// The reqid shown, if any.
    pub reqid: Option<u32>,
}

/// The daemon's health as probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeHealth {
    /// IKE_SAs.
    pub ike_sas: Vec<IkeSa>,
    /// CHILD_SAs and routed (trap) connections.
    pub child_sas: Vec<ChildSa>,
}

/// Parses `ipsec statusall` (or `status`): IKE_SA lines `<conn>[<n>]:
/// <STATE> ...` and CHILD_SA lines `<conn>{<n>}:  <STATE>, ..., reqid <r>`.
pub fn parse_status(text: &str) -> IkeHealth {
    let mut h = IkeHealth {
        ike_sas: Vec::new(),
        child_sas: Vec::new(),
    };
    for line in text.lines() {
        let line = line.trim();
        let Some((head, rest)) = line.split_once(": ") else {
            continue;
        };
        let rest = rest.trim();
        let word = rest
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .trim_end_matches(',');
        if word.is_empty() || !word.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            continue;
        }
        if let Some((conn, id)) = head.strip_suffix(']').and_then(|h| h.rsplit_once('[')) {
            let Ok(unique_id) = id.parse() else { continue };
            if !h
                .ike_sas
                .iter()
                .any(|s| s.unique_id == unique_id && s.conn == conn)
            {
                h.ike_sas.push(IkeSa {
                    conn: conn.to_string(),
                    unique_id,
                    state: word.to_string(),
                });
            }
        } else if let Some((conn, _)) = head.strip_suffix('}').and_then(|h| h.rsplit_once('{')) {
            let reqid = rest
                .split(", ")
                .find_map(|part| part.trim().strip_prefix("reqid "))
                .and_then(|r| r.trim().parse().ok());
            h.child_sas.push(ChildSa {
                conn: conn.to_string(),
                state: word.to_string(),
                reqid,
            });
        }
    }
    h
}

/// A certificate strongSwan has loaded (`ipsec listcerts` /
/// `listcacerts`): public data only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCert {
    /// `subject:` as strongSwan prints it (`"CN=chass-a, O=kube-ovn"`).
    pub subject: String,
    /// `serial:` as colon-separated lowercase hex.
    pub serial: String,
    /// Whether strongSwan has the matching private key (`pubkey: ... , has
    /// private key`).
    pub has_private_key: bool,
}

/// Parses `ipsec listcerts` / `ipsec listcacerts` output.
pub fn parse_listcerts(text: &str) -> Vec<LoadedCert> {
    let mut out: Vec<LoadedCert> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(s) = line.strip_prefix("subject:") {
            out.push(LoadedCert {
                subject: s.trim().trim_matches('"').to_string(),
                serial: String::new(),
                has_private_key: false,
            });
        } else if let Some(last) = out.last_mut() {
            if let Some(s) = line.strip_prefix("serial:") {
                last.serial = s.trim().to_ascii_lowercase();
            } else if line.starts_with("pubkey:") && line.contains("has private key") {
                last.has_private_key = true;
            }
        }
    }
    out
}

/// The running IKE daemon.
#[derive(Debug)]
pub struct IkeDaemon {
    config: IkeConfig,
    launcher: Launcher,
    process: Supervised,
}

impl IkeDaemon {
    /// Starts `ipsec start --nofork` in the foreground.
    pub fn start(config: IkeConfig, launcher: Launcher) -> Result<Self, Error> {
        let spec = ProcessSpec {
            name: "ike",
            program: config.ipsec.clone(),
            args: vec!["start".into(), "--nofork".into()],
            log_file: config.log_file.clone(),
        };
        let process = Supervised::start(&spec, &launcher)?;
        Ok(Self {
            config,
            launcher,
            process,
        })
    }

    /// The starter's PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The process handle (exit notification, signals).
    pub fn process(&mut self) -> &mut Supervised {
        &mut self.process
    }

    async fn ipsec(&self, args: &[&str]) -> Result<String, Error> {
        let (status, out) = self
            .launcher
            .output(
                self.config.ipsec.clone(),
                args.iter().copied(),
                COMMAND_TIMEOUT,
            )
            .await?;
        if !status.success() {
            return Err(Error::Unhealthy {
                process: "ike",
                reason: format!("`ipsec {}` exited with {status}", args.join(" ")),
            });
        }
        Ok(out)
    }

    /// Health probe: the starter runs and `ipsec statusall` answers with
    /// charon's status (a starter without charon fails it).
    pub async fn probe(&mut self) -> Result<IkeHealth, Error> {
        if let Some(s) = self.process.try_exited() {
            return Err(Error::Unhealthy {
                process: "ike",
                reason: format!("exited with {s}"),
            });
        }
        let out = self.ipsec(&["statusall"]).await?;
        if !out.contains("Security Associations") {
            return Err(Error::Unhealthy {
                process: "ike",
                reason: "charon does not answer (no status)".into(),
            });
        }
        Ok(parse_status(&out))
    }

    /// The end-entity certificates charon has loaded.
    pub async fn loaded_certs(&self) -> Result<Vec<LoadedCert>, Error> {
        Ok(parse_listcerts(&self.ipsec(&["listcerts"]).await?))
    }

    /// The CA certificates charon has loaded.
    pub async fn loaded_cacerts(&self) -> Result<Vec<LoadedCert>, Error> {
        Ok(parse_listcerts(&self.ipsec(&["listcacerts"]).await?))
    }

    /// The CA workaround (SPEC §12), kept only for an unpatched monitor:
    /// copy the trust bundle into strongSwan's CA directory and have charon
    /// reread it. Returns whether it was applied.
    pub async fn apply_ca_workaround(
        &self,
        monitor: MonitorPatch,
        trust_bundle: &Path,
    ) -> Result<bool, Error> {
        if !monitor.needs_ca_workaround() {
            return Ok(false);
        }
        let pem = std::fs::read(trust_bundle).map_err(|source| Error::Io {
            path: trust_bundle.to_path_buf(),
            source,
        })?;
        let dst = self.config.cacerts_dir.join("kube-ovn-ipsec-trust.pem");
        crate::fsutil::write_atomic(&dst, &pem, 0o644)?;
        self.ipsec(&["rereadcacerts"]).await?;
        Ok(true)
    }

    /// Stops the daemon: SIGTERM to its process group, SIGKILL after the
    /// grace period.
    pub async fn stop(&mut self) -> Result<std::process::ExitStatus, Error> {
        let grace = self.config.stop_grace;
        self.process.stop(grace).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_children() {
        let text = "\
Security Associations (1 up, 0 connecting):
ovn-chassb-0-out-1[1]: ESTABLISHED 2 seconds ago, 10.77.0.1[CN=chass-a, O=kube-ovn]...10.77.0.2[CN=chass-b]
ovn-chassb-0-out-1[1]: IKEv2 SPIs: 5b1d_i* 8a9b_r, public key reauthentication in 2 hours
ovn-chassb-0-out-1{1}:  ROUTED, TRANSPORT, reqid 77
ovn-chassb-0-in-1{2}:  INSTALLED, TRANSPORT, reqid 77, ESP SPIs: c1_i c2_o
";
        let h = parse_status(text);
        assert_eq!(h.ike_sas.len(), 1);
        assert_eq!(h.ike_sas[0].state, "ESTABLISHED");
        assert_eq!(h.child_sas.len(), 2);
        assert_eq!(h.child_sas[0].reqid, Some(77));
        assert_eq!(h.child_sas[1].state, "INSTALLED");
    }

    #[test]
    fn parses_listcerts() {
        let text = "\
List of X.509 End Entity Certificates

  subject:  \"CN=chass-a, O=kube-ovn\"
  issuer:   \"CN=test CA, O=kube-ovn\"
  validity:  not before Jan 01 00:00:00 2025, ok
  serial:    0A:1b:2c
  pubkey:    RSA 2048 bits, has private key
";
        let c = parse_listcerts(text);
        assert_eq!(
            c,
            [LoadedCert {
                subject: "CN=chass-a, O=kube-ovn".into(),
                serial: "0a:1b:2c".into(),
                has_private_key: true
            }]
        );
    }
}
