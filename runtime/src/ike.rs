//! The IKE daemon: strongSwan's `ipsec start --nofork` (starter + charon,
//! the stroke interface ovs-monitor-ipsec drives) in the foreground, its
//! health probe (`ipsec statusall`), the loaded certificates
//! (`ipsec listcerts` / `listcacerts`), and the trust bundle installed
//! into strongSwan's CA directory one file per CA.
//!
//! # Why one file per CA
//! strongSwan loads only the first certificate of a PEM file in
//! `/etc/ipsec.d/cacerts` (and of a `ca` section's `cacert=`). During a CA
//! rotation the bundle holds the old and the new CA; written as one file,
//! charon trusts only the first, and every peer whose leaf comes from the
//! other CA fails IKE authentication. [`install_trust_bundle`] writes each
//! CA to a file of its own, named after the CA
//! ([`ca_file_name`]), and removes only the agent's own files whose CA left
//! the bundle ([`plan_ca_dir`]); the patched monitor's `cacert=` then just
//! loads the bundle's first CA a second time, which charon ignores.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::strongswan::{LoadedCert, Status, parse_listcerts, parse_status};

use crate::Error;
use crate::process::{Launcher, ProcessSpec, Supervised};

mod initiator;
pub use self::initiator::{Initiator, is_outbound_conn, stalled_outbound};

/// The default timeout of one control command of the IKE daemon or the
/// monitor (`ipsec statusall`, `ovs-appctl tunnels/show`): the agent's
/// `--command-timeout`.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How the IKE daemon is run.
#[derive(Debug, Clone)]
pub struct IkeConfig {
    /// The `ipsec` script (`/usr/sbin/ipsec`).
    pub ipsec: OsString,
    /// Where its output goes.
    pub log_file: Option<PathBuf>,
    /// Grace period between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// How long one `ipsec` control command may take; a health probe that
    /// runs over it fails.
    pub command_timeout: Duration,
    /// strongSwan's CA directory (`/etc/ipsec.d/cacerts`), where the agent
    /// installs the trust bundle one file per CA ([`install_trust_bundle`]).
    pub cacerts_dir: PathBuf,
}

impl Default for IkeConfig {
    fn default() -> Self {
        Self {
            ipsec: "ipsec".into(),
            log_file: None,
            stop_grace: Duration::from_secs(10),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
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
    initiator: Initiator,
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
            initiator: Initiator::new(),
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
                self.config.command_timeout,
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
    /// charon's status (a starter without charon fails it). The status
    /// also drives the [`Initiator`]: outbound connections that stay
    /// without a CHILD_SA are initiated by name (a failed initiation is
    /// logged, not a failed probe: the daemon answered).
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
        let status = parse_status(&out);
        for conn in self.initiator.plan(&status, tokio::time::Instant::now()) {
            tracing::info!(%conn, "initiating an outbound connection that has no CHILD_SA");
            if let Err(e) = self.ipsec(&["stroke", "up-nb", &conn]).await {
                tracing::warn!(%conn, error = %e, "initiating an outbound connection");
            }
        }
        Ok(status)
    }

    /// When the next probe is due sooner than the normal period: while an
    /// outbound connection waits out the initiator's grace.
    pub fn probe_again_within(&self) -> Option<Duration> {
        self.initiator.look_again_within()
    }

    /// The end-entity certificates charon has loaded.
    pub async fn loaded_certs(&self) -> Result<Vec<LoadedCert>, Error> {
        Ok(parse_listcerts(&self.ipsec(&["listcerts"]).await?))
    }

    /// The CA certificates charon has loaded.
    pub async fn loaded_cacerts(&self) -> Result<Vec<LoadedCert>, Error> {
        Ok(parse_listcerts(&self.ipsec(&["listcacerts"]).await?))
    }

    /// Installs the trust bundle at `trust_bundle` (a PEM file of one or
    /// more CAs, the key directory's `ca.pem`) into the CA directory, one
    /// file per CA ([`install_trust_bundle`]), and has charon reread it
    /// (`ipsec rereadcacerts`). Done for a patched monitor too: its `ca`
    /// section's `cacert=` loads only the bundle's first CA.
    pub async fn install_trust_bundle(&self, trust_bundle: &Path) -> Result<CaInstall, Error> {
        let (dir, path) = (self.config.cacerts_dir.clone(), trust_bundle.to_path_buf());
        let installed = tokio::task::spawn_blocking(move || {
            install_trust_bundle(&dir, &read_trust_bundle(&path)?)
        })
        .await
        .map_err(|e| Error::Blocking {
            what: "installing the trust bundle",
            reason: e.to_string(),
        })??;
        self.ipsec(&["rereadcacerts"]).await?;
        Ok(installed)
    }

    /// Stops the daemon: SIGTERM to its process group, SIGKILL after the
    /// grace period.
    pub async fn stop(&mut self) -> Result<std::process::ExitStatus, Error> {
        let grace = self.config.stop_grace;
        self.process.stop(grace).await
    }
}

/// Prefix of the agent's own files in the IKE daemon's CA directory: one
/// per CA of the trust bundle, `kube-ovn-ipsec-ca-<16 hex>.pem`.
pub const CA_FILE_PREFIX: &str = "kube-ovn-ipsec-ca-";

/// Suffix of the agent's CA files.
const CA_FILE_SUFFIX: &str = ".pem";

/// Hex digits of the CA's DER SHA-256 in its file name: 64 bits, so two
/// distinct CAs of one bundle never share a file.
const CA_FILE_HASH_LEN: usize = 16;

/// The one-file bundle that earlier agent versions wrote (for an unpatched
/// monitor only). It is the agent's own and is removed: strongSwan loads
/// its first CA only, and left in place it would keep a retired CA trusted
/// across every restart of the IKE daemon.
pub const LEGACY_TRUST_FILE: &str = "kube-ovn-ipsec-trust.pem";

/// The file name of `ca` in the CA directory: [`CA_FILE_PREFIX`], the
/// first 16 hex digits of the SHA-256 of its DER, `.pem`. The same CA
/// always gets the same name, whichever bundle or generation holds it.
pub fn ca_file_name(ca: &Certificate) -> String {
    let hex = ca.digest().to_hex();
    format!(
        "{CA_FILE_PREFIX}{}{CA_FILE_SUFFIX}",
        &hex[..CA_FILE_HASH_LEN]
    )
}

/// Whether `name` is exactly a name [`ca_file_name`] produces.
fn is_ca_file_name(name: &str) -> bool {
    name.strip_prefix(CA_FILE_PREFIX)
        .and_then(|n| n.strip_suffix(CA_FILE_SUFFIX))
        .is_some_and(|h| {
            h.len() == CA_FILE_HASH_LEN
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Whether `name` is the temporary file an interrupted
/// `actors::keydir::write_atomic` of one of the agent's files left
/// (`.<name>.tmp-<pid>`) by a process other than `own_pid`. strongSwan
/// loads every regular file of the directory, dot files included.
fn is_stale_temp_name(name: &str, own_pid: u32) -> bool {
    let Some((base, pid)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")) else {
        return false;
    };
    (is_ca_file_name(base) || base == LEGACY_TRUST_FILE)
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && pid != own_pid.to_string()
}

/// What makes the CA directory hold the bundle's CAs, one file each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaDirPlan {
    /// `(file name, PEM)` of every CA of the bundle, in bundle order.
    pub write: Vec<(String, String)>,
    /// The agent's own files to remove: CA files whose CA left the bundle,
    /// the [`LEGACY_TRUST_FILE`], and temporary files of an interrupted
    /// write by an earlier process. Never any other file.
    pub remove: Vec<String>,
}

/// Plans the CA directory for `bundle`, given the names in it now
/// (`existing`) and the agent's PID (`own_pid`, whose temporary files may
/// be in flight). Pure.
pub fn plan_ca_dir(bundle: &TrustBundle, existing: &[String], own_pid: u32) -> CaDirPlan {
    let write: Vec<(String, String)> = bundle
        .certificates()
        .iter()
        .map(|c| (ca_file_name(c), c.to_pem()))
        .collect();
    let mut remove: Vec<String> = existing
        .iter()
        .filter(|n| {
            let left_bundle = is_ca_file_name(n) && !write.iter().any(|(w, _)| w == *n);
            left_bundle || n.as_str() == LEGACY_TRUST_FILE || is_stale_temp_name(n, own_pid)
        })
        .cloned()
        .collect();
    remove.sort();
    CaDirPlan { write, remove }
}

/// What [`install_trust_bundle`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaInstall {
    /// The files holding the bundle's CAs, in bundle order.
    pub files: Vec<PathBuf>,
    /// Those of them written now (new, or with other content before).
    pub written: Vec<PathBuf>,
    /// The agent's own files removed ([`CaDirPlan::remove`]).
    pub removed: Vec<PathBuf>,
}

impl CaInstall {
    /// Whether the directory changed.
    pub fn changed(&self) -> bool {
        !self.written.is_empty() || !self.removed.is_empty()
    }

    /// CAs removed because they left the bundle (not the legacy one-file
    /// bundle, not interrupted temporary files): retired CAs.
    pub fn retired(&self) -> usize {
        self.removed
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_ca_file_name)
            })
            .count()
    }
}

/// Reads and checks the trust bundle at `path` (every PEM block a CA).
pub fn read_trust_bundle(path: &Path) -> Result<TrustBundle, Error> {
    let pem = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    TrustBundle::from_pem(&pem).map_err(|e| Error::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Installs `bundle` into the CA directory `dir` as one file per CA
/// ([`plan_ca_dir`]): every CA's file written atomically
/// (`actors::keydir::write_atomic`, mode 0644, skipped when the content is
/// already there), then the agent's files of CAs that left the bundle
/// removed — in that order, so the directory never lacks a CA of the
/// bundle. Other files in `dir` are never touched. Blocks (fsync); the
/// caller then has charon reread the directory (`ipsec rereadcacerts`).
pub fn install_trust_bundle(dir: &Path, bundle: &TrustBundle) -> Result<CaInstall, Error> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut existing = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        // A name that is not UTF-8 is never one of the agent's.
        if let Ok(name) = entry.file_name().into_string() {
            existing.push(name);
        }
    }
    let plan = plan_ca_dir(bundle, &existing, std::process::id());
    let mut out = CaInstall::default();
    for (name, pem) in &plan.write {
        let path = dir.join(name);
        if std::fs::read(&path).ok().as_deref() != Some(pem.as_bytes()) {
            actors::keydir::write_atomic(&path, pem.as_bytes(), 0o644).map_err(|e| Error::Io {
                path: e.path,
                source: e.source,
            })?;
            out.written.push(path.clone());
        }
        out.files.push(path);
    }
    for name in &plan.remove {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => out.removed.push(path),
            // Gone meanwhile: the goal is reached all the same.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path, source }),
        }
    }
    if !out.removed.is_empty() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
