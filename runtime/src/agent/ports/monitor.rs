//! [`MonitorPort`] over ovs-monitor-ipsec ([`crate::monitor`]): start,
//! probe, stop, and the acknowledgement of the active generation, which
//! only reads (the IKE port installs the trust bundle it checks).

use std::path::Path;

use actors::ports::{
    Acknowledgement, MonitorPort, OvsdbIdentityKeys, RunningMonitor, RunningProcess,
};
use async_trait::async_trait;
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
    /// the IKE port installs the trust bundle one file per CA either way,
    /// since even the patched monitor's `cacert=` loads only its first CA).
    pub patch: MonitorPatch,
}

#[derive(Debug)]
struct RunningMon {
    monitor: Monitor,
    pid: u32,
    adapter: MonitorAdapter,
}

impl RunningMon {
    async fn ipsec(&self, cmd: &str) -> actors::Result<String> {
        super::ike::ipsec(&self.adapter.ike, &self.adapter.launcher, &[cmd]).await
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

    async fn rebuild(&mut self) -> actors::Result<Vec<String>> {
        if !self.adapter.patch.rebuilds() {
            // Nothing was kept: an older monitor replaces every renewed
            // tunnel at once.
            return Ok(Vec::new());
        }
        self.monitor
            .rebuild()
            .await
            .map_err(|e| process_err("monitor", e))
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
        }))
    }
}
