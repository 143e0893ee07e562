//! [`MonitorPort`] over ovs-monitor-ipsec ([`crate::monitor`]): start,
//! probe, stop, and the acknowledgement of the active generation.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use actors::ports::{
    Acknowledgement, MonitorPort, OvsdbIdentityKeys, RunningMonitor, RunningProcess, blocking,
};
use async_trait::async_trait;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::strongswan::parse_listcerts;

use super::process_err;
use crate::ike::IkeConfig;
use crate::monitor::{self, ActiveIdentity, Monitor, MonitorConfig};
use crate::monitor_patch::MonitorPatch;
use crate::process::Launcher;

/// [`MonitorPort`] over [`Monitor`], with the IKE daemon's certificate
/// listing for the acknowledgement.
#[derive(Debug, Clone)]
pub struct MonitorAdapter {
    /// How the monitor runs.
    pub config: MonitorConfig,
    /// The IKE daemon's configuration (`ipsec` program, CA directory).
    pub ike: IkeConfig,
    /// Where (namespaces) they run.
    pub launcher: Launcher,
    /// Whether the monitor script carries the project's patch (reported;
    /// the trust bundle is installed one file per CA either way, since
    /// even the patched monitor's `cacert=` loads only its first CA).
    pub patch: MonitorPatch,
}

#[derive(Debug)]
struct RunningMon {
    monitor: Monitor,
    pid: u32,
    adapter: MonitorAdapter,
    /// The trust digest of the bundle last installed into the CA directory.
    installed_trust: Option<Sha256Digest>,
}

impl RunningMon {
    async fn ipsec(&self, cmd: &str) -> actors::Result<String> {
        let (status, out) = self
            .adapter
            .launcher
            .output(
                self.adapter.ike.ipsec.clone(),
                [OsString::from(cmd)],
                self.adapter.ike.command_timeout,
            )
            .await
            .map_err(|e| process_err("ike", e))?;
        if !status.success() {
            return Err(actors::Error::Process {
                process: "ike",
                reason: format!("`ipsec {cmd}` exited with {status}"),
            });
        }
        Ok(out)
    }
}

#[async_trait]
impl RunningProcess for RunningMon {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn try_exited(&mut self) -> Option<String> {
        self.monitor.process().try_exited().map(|s| s.to_string())
    }
    async fn probe(&mut self) -> actors::Result<()> {
        self.monitor
            .probe()
            .await
            .map(|_| ())
            .map_err(|e| process_err("monitor", e))
    }
    async fn stop(&mut self) -> actors::Result<()> {
        self.monitor
            .stop()
            .await
            .map(|_| ())
            .map_err(|e| process_err("monitor", e))
    }
}

#[async_trait]
impl RunningMonitor for RunningMon {
    async fn acknowledge(&mut self, keys: &OvsdbIdentityKeys) -> actors::Result<Acknowledgement> {
        let (Some(cert), Some(ca)) = (&keys.certificate, &keys.ca_cert) else {
            return Ok(Acknowledgement {
                configuration_applied: false,
                trust_digest: None,
                mismatches: vec!["OVSDB names no certificate or CA".into()],
            });
        };
        let active = ActiveIdentity::load(Path::new(cert), Path::new(ca))
            .map_err(|e| process_err("monitor", e))?;
        if self.installed_trust != Some(active.trust_digest) {
            // strongSwan loads only the first CA of a PEM file, the
            // monitor's `cacert=` included: every CA gets a file of its own.
            let dir = self.adapter.ike.cacerts_dir.clone();
            let bundle = PathBuf::from(ca);
            let installed = blocking(move || {
                crate::ike::read_trust_bundle(&bundle)
                    .and_then(|b| crate::ike::install_trust_bundle(&dir, &b))
                    .map_err(|e| process_err("ike", e))
            })
            .await?;
            self.ipsec("rereadcacerts").await?;
            tracing::info!(
                dir = %self.adapter.ike.cacerts_dir.display(),
                cas = installed.files.len(),
                written = installed.written.len(),
                removed = installed.removed.len(),
                trust_digest = %active.trust_digest,
                "trust bundle installed for the IKE daemon, one file per CA"
            );
            self.installed_trust = Some(active.trust_digest);
        }
        let tunnels = self
            .monitor
            .tunnels()
            .await
            .map_err(|e| process_err("monitor", e))?;
        let certs = parse_listcerts(&self.ipsec("listcerts").await?);
        let cacerts = parse_listcerts(&self.ipsec("listcacerts").await?);
        let ack = monitor::acknowledge(&active, &tunnels, &certs, &cacerts, &monitor::digest_file);
        Ok(Acknowledgement {
            configuration_applied: ack.configuration_applied,
            trust_digest: ack.acknowledged_trust_digest,
            mismatches: ack.mismatches,
        })
    }
}

#[async_trait]
impl MonitorPort for MonitorAdapter {
    async fn start(&self) -> actors::Result<Box<dyn RunningMonitor>> {
        let mut m = Monitor::start(self.config.clone(), self.launcher.clone())
            .map_err(|e| process_err("monitor", e))?;
        let pid = m.process().pid();
        Ok(Box::new(RunningMon {
            monitor: m,
            pid,
            adapter: self.clone(),
            installed_trust: None,
        }))
    }
}
