//! [`IkePort`] over the IKE daemon ([`crate::ike`]): start it, and install
//! the trust bundle into its CA directory one file per CA.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use actors::ports::{IkePort, OvsdbIdentityKeys, RunningProcess, TrustInstalled, blocking};
use async_trait::async_trait;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::strongswan::{MonitorConn, parse_status};

use super::process_err;
use crate::ike::{IkeConfig, IkeDaemon};
use crate::monitor::ActiveIdentity;
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

/// Runs the control command `ipsec <args>` against the running daemon and
/// returns its output; a non-zero exit is an error. The monitor adapter
/// reads the daemon's certificates through it too.
pub(super) async fn ipsec(
    config: &IkeConfig,
    launcher: &Launcher,
    args: &[&str],
) -> actors::Result<String> {
    let cmd = args.join(" ");
    let (status, out) = launcher
        .output(
            config.ipsec.clone(),
            args.iter().map(OsString::from),
            config.command_timeout,
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

    async fn install_trust(
        &self,
        keys: &OvsdbIdentityKeys,
        installed: Option<Sha256Digest>,
    ) -> actors::Result<Option<TrustInstalled>> {
        let (Some(cert), Some(ca)) = (&keys.certificate, &keys.ca_cert) else {
            return Ok(None);
        };
        // The digest the acknowledgement compares: the bundle as read with
        // its certificate, so an unreadable identity installs nothing.
        let active = ActiveIdentity::load(Path::new(cert), Path::new(ca))
            .map_err(|e| process_err("ike", e))?;
        if installed == Some(active.trust_digest) {
            return Ok(Some(TrustInstalled {
                digest: active.trust_digest,
                retired: 0,
            }));
        }
        // strongSwan loads only the first CA of a PEM file, the monitor's
        // `cacert=` included: every CA gets a file of its own.
        let dir = self.config.cacerts_dir.clone();
        let bundle = PathBuf::from(ca);
        let done = blocking(move || {
            crate::ike::read_trust_bundle(&bundle)
                .and_then(|b| crate::ike::install_trust_bundle(&dir, &b))
                .map_err(|e| process_err("ike", e))
        })
        .await?;
        ipsec(&self.config, &self.launcher, &["rereadcacerts"]).await?;
        tracing::info!(
            dir = %self.config.cacerts_dir.display(),
            cas = done.files.len(),
            written = done.written.len(),
            removed = done.removed.len(),
            trust_digest = %active.trust_digest,
            "trust bundle installed for the IKE daemon, one file per CA"
        );
        Ok(Some(TrustInstalled {
            digest: active.trust_digest,
            retired: done.retired(),
        }))
    }

    async fn end_ike_sas(&self) -> actors::Result<Vec<String>> {
        let status = parse_status(&ipsec(&self.config, &self.launcher, &["statusall"]).await?);
        let mut ended = Vec::new();
        for sa in status
            .ike_sas
            .iter()
            .filter(|sa| MonitorConn::parse(&sa.conn).is_some())
        {
            // By unique id: only that IKE_SA, not the connection's others
            // nor its trap; not blocking, so a peer that does not answer
            // the delete holds nothing up.
            let name = format!("{}[{}]", sa.conn, sa.unique_id);
            ipsec(&self.config, &self.launcher, &["stroke", "down-nb", &name]).await?;
            ended.push(name);
        }
        Ok(ended)
    }
}
