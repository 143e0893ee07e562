//! The IKE daemon: strongSwan's `ipsec start --nofork` (starter + charon,
//! the stroke interface ovs-monitor-ipsec drives) in the foreground, its
//! health probe (`ipsec statusall`), the loaded certificates
//! (`ipsec listcerts` / `listcacerts`), and the CA workaround for an
//! unpatched monitor.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_ovn_ipsec_api::strongswan::{LoadedCert, Status, parse_listcerts, parse_status};

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
    pub async fn probe(&mut self) -> Result<Status, Error> {
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
        actors::keydir::write_atomic(&dst, &pem, 0o644).map_err(|e| Error::Io {
            path: e.path,
            source: e.source,
        })?;
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
