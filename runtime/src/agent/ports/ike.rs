//! [`IkePort`] over the IKE daemon ([`crate::ike`]).

use std::path::PathBuf;

use actors::ports::{IkePort, RunningProcess};
use async_trait::async_trait;

use super::process_err;
use crate::ike::{IkeConfig, IkeDaemon};
use crate::process::Launcher;

/// [`IkePort`] over [`IkeDaemon`].
#[derive(Debug, Clone)]
pub struct IkeAdapter {
    /// How the daemon runs.
    pub config: IkeConfig,
    /// Where (namespaces) it runs.
    pub launcher: Launcher,
    /// The IKE daemon's pidfiles (as the agent sees them), made safe
    /// before each start ([`crate::pidfile::clear`]): starter refuses to
    /// start over them, and a live daemon's must never just be deleted.
    pub stale_pidfiles: Vec<PathBuf>,
}

#[derive(Debug)]
struct RunningIke(IkeDaemon);

#[async_trait]
impl RunningProcess for RunningIke {
    fn pid(&self) -> u32 {
        self.0.pid()
    }
    fn try_exited(&mut self) -> Option<String> {
        self.0.process().try_exited().map(|s| s.to_string())
    }
    async fn probe(&mut self) -> actors::Result<()> {
        self.0
            .probe()
            .await
            .map(|_| ())
            .map_err(|e| process_err("ike", e))
    }
    async fn stop(&mut self) -> actors::Result<()> {
        self.0
            .stop()
            .await
            .map(|_| ())
            .map_err(|e| process_err("ike", e))
    }
    fn probe_again_within(&self) -> Option<std::time::Duration> {
        self.0.probe_again_within()
    }
}

#[async_trait]
impl IkePort for IkeAdapter {
    async fn start(&self) -> actors::Result<Box<dyn RunningProcess>> {
        for p in &self.stale_pidfiles {
            if let Err(e) = crate::pidfile::clear(p, self.config.stop_grace).await {
                tracing::warn!(path = %p.display(), error = %e, "IKE pidfile");
            }
        }
        let d = IkeDaemon::start(self.config.clone(), self.launcher.clone())
            .map_err(|e| process_err("ike", e))?;
        Ok(Box::new(RunningIke(d)))
    }
}
