//! `ovs-monitor-ipsec --no-restart-ike-daemon` in the foreground, its
//! `tunnels/show` read-back, and the acknowledgement (SPEC §3): the
//! certificate and CA paths the monitor uses, and the SHA-256 digests of
//! the files at those paths, must be the active generation's, and the IKE
//! daemon must have loaded that certificate and the trust bundle's CAs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_ovn_ipsec_api::Sha256Digest;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_api::rekeying::Rekeying;

use crate::Error;
use crate::process::{Launcher, ProcessSpec, Supervised};
use kube_ovn_ipsec_api::strongswan::LoadedCert;

/// How the monitor is run.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// The interpreter (`/usr/bin/python3`), or `None` to execute the
    /// script itself.
    pub python: Option<OsString>,
    /// The script ([`crate::monitor_patch::DEFAULT_MONITOR_SCRIPT`]).
    pub script: PathBuf,
    /// The OVS database (`unix:/run/openvswitch/db.sock`).
    pub database: String,
    /// The run directory as the monitor sees it (its control socket is
    /// `<rundir>/ovs-monitor-ipsec.<pid>.ctl`).
    pub rundir: PathBuf,
    /// Its log file (`--log-file`), as the monitor sees it.
    pub log_file: Option<PathBuf>,
    /// Where its standard output and error go, as the agent sees it.
    pub output_file: Option<PathBuf>,
    /// `ovs-appctl`.
    pub appctl: OsString,
    /// Grace period between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// How long one `ovs-appctl` request may take; a health probe that
    /// runs over it fails.
    pub command_timeout: Duration,
    /// Lifetimes and rekeying of every connection, passed as the patched
    /// monitor's arguments; `None` for a monitor that takes none (Debian's,
    /// or a patch before v4): strongSwan's defaults then reauthenticate
    /// every IKE_SA, break before make.
    pub rekeying: Option<Rekeying>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            python: None,
            script: PathBuf::from(crate::monitor_patch::DEFAULT_MONITOR_SCRIPT),
            database: "unix:/run/openvswitch/db.sock".into(),
            rundir: PathBuf::from("/run/openvswitch"),
            log_file: None,
            output_file: None,
            appctl: "ovs-appctl".into(),
            stop_grace: Duration::from_secs(10),
            command_timeout: crate::ike::DEFAULT_COMMAND_TIMEOUT,
            rekeying: None,
        }
    }
}

/// One tunnel of `tunnels/show`. The PSK line is never kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelShow {
    /// Interface name.
    pub name: String,
    /// State (`CONFIGURED`, `INIT`, `INVALID...`).
    pub state: String,
    /// `Remote IP`.
    pub remote_ip: String,
    /// `SKB mark` (`None` when the monitor prints `None`).
    pub skb_mark: Option<String>,
    /// `Local cert` path.
    pub local_cert: Option<PathBuf>,
    /// `Local key` path.
    pub local_key: Option<PathBuf>,
    /// `Remote name`.
    pub remote_name: Option<String>,
    /// `CA cert` path.
    pub ca_cert: Option<PathBuf>,
    /// `Custom Options` text.
    pub custom_options: String,
    /// Lines under "Kernel policies installed".
    pub policies: Vec<String>,
    /// Lines under "IPsec connections that are active".
    pub connections: Vec<String>,
}

fn field(v: &str) -> Option<String> {
    let v = v.trim();
    (!v.is_empty() && v != "None").then(|| v.to_string())
}

/// Parses `ovs-appctl -t <monitor> tunnels/show`.
pub fn parse_tunnels_show(text: &str) -> Vec<TunnelShow> {
    #[derive(PartialEq)]
    enum Section {
        Conf,
        Policies,
        Sas,
        Conns,
    }
    let mut out: Vec<TunnelShow> = Vec::new();
    let mut section = Section::Conf;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Interface name: ") {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let state = tail
                .split_once('(')
                .map(|(_, s)| s.trim_end().trim_end_matches(')'))
                .unwrap_or_default();
            out.push(TunnelShow {
                name: name.to_string(),
                state: state.to_string(),
                ..Default::default()
            });
            section = Section::Conf;
            continue;
        }
        let Some(t) = out.last_mut() else { continue };
        match line.trim_end() {
            "Kernel policies installed:" => section = Section::Policies,
            "Kernel security associations installed:" => section = Section::Sas,
            "IPsec connections that are active:" => section = Section::Conns,
            l if section == Section::Conf => {
                let Some((k, v)) = l.trim().split_once(':') else {
                    continue;
                };
                match k.trim() {
                    "Remote IP" => t.remote_ip = v.trim().to_string(),
                    "SKB mark" => t.skb_mark = field(v),
                    "Local cert" => t.local_cert = field(v).map(PathBuf::from),
                    "Local key" => t.local_key = field(v).map(PathBuf::from),
                    "Remote name" => t.remote_name = field(v),
                    "CA cert" => t.ca_cert = field(v).map(PathBuf::from),
                    "Custom Options" => t.custom_options = v.trim().to_string(),
                    // "PSK" (a secret in PSK mode) and the rest: not kept.
                    _ => {}
                }
            }
            l if !l.trim().is_empty() => match section {
                Section::Policies => t.policies.push(l.trim().to_string()),
                Section::Conns => t.connections.push(l.trim().to_string()),
                // SA lines are not kept (the agent reads SAs from the
                // kernel, without keys).
                _ => {}
            },
            _ => {}
        }
    }
    out
}

/// The active generation, as the acknowledgement compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveIdentity {
    /// Certificate path (`other_config:certificate`).
    pub certificate: PathBuf,
    /// CA bundle path (`other_config:ca_cert`).
    pub ca_cert: PathBuf,
    /// SHA-256 of the leaf's DER.
    pub certificate_digest: Sha256Digest,
    /// The trust digest of the bundle.
    pub trust_digest: Sha256Digest,
    /// The leaf's serial as strongSwan prints it (colon hex).
    pub certificate_serial: String,
    /// The serials of the bundle's CAs, same spelling.
    pub ca_serials: Vec<String>,
}

fn serial_of(der: &[u8]) -> Result<String, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    Ok(normalize_serial(
        &cert
            .raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    ))
}

/// One spelling for a serial from either side: lowercase colon hex without
/// the DER sign-padding `00` that a serial with its top bit set carries
/// (x509-parser keeps it, strongSwan prints the integer without it). Without
/// this, half of all random serials never compared equal.
pub fn normalize_serial(s: &str) -> String {
    let lower = s.trim().to_ascii_lowercase();
    let mut parts: Vec<&str> = lower.split(':').collect();
    while parts.len() > 1 && parts[0] == "00" {
        parts.remove(0);
    }
    parts.join(":")
}

impl ActiveIdentity {
    /// Reads the generation's certificate and CA bundle files.
    pub fn load(certificate: &Path, ca_cert: &Path) -> Result<Self, Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        let corrupt = |p: &Path, reason: String| Error::Corrupt {
            path: p.to_path_buf(),
            reason,
        };
        let leaf = Certificate::from_pem(&read(certificate)?)
            .map_err(|e| corrupt(certificate, e.to_string()))?;
        let trust =
            TrustBundle::from_pem(&read(ca_cert)?).map_err(|e| corrupt(ca_cert, e.to_string()))?;
        let certificate_serial = serial_of(leaf.der()).map_err(|e| corrupt(certificate, e))?;
        let ca_serials = trust
            .certificates()
            .iter()
            .map(|c| serial_of(c.der()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| corrupt(ca_cert, e))?;
        Ok(Self {
            certificate: certificate.to_path_buf(),
            ca_cert: ca_cert.to_path_buf(),
            certificate_digest: leaf.digest(),
            trust_digest: trust.digest(),
            certificate_serial,
            ca_serials,
        })
    }
}

/// The result of comparing the monitor's and the daemon's view with the
/// active generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    /// `configurationApplied`.
    pub configuration_applied: bool,
    /// The trust digest the monitor acknowledged (only when applied).
    pub acknowledged_trust_digest: Option<Sha256Digest>,
    /// Why not, when not.
    pub mismatches: Vec<String>,
}

/// Compares the read-back with `active` (pure apart from `digest_of`,
/// which reads a file the monitor names and digests it: leaf digest for
/// the certificate, trust digest for the CA bundle).
///
/// Every IPsec tunnel (one with `Remote name`) must name the active
/// certificate and CA paths, the files there must have the active digests,
/// and the daemon must have loaded the leaf (with its private key) and
/// every CA of the bundle. With no IPsec tunnel at all there is nothing
/// for the monitor to apply yet (a node alone in its cluster): applied,
/// provided the daemon check holds for the CAs.
pub fn acknowledge(
    active: &ActiveIdentity,
    tunnels: &[TunnelShow],
    loaded_certs: &[LoadedCert],
    loaded_cacerts: &[LoadedCert],
    digest_of: &dyn Fn(&Path, bool) -> Result<Sha256Digest, String>,
) -> Acknowledgement {
    let mut mismatches = Vec::new();
    let ipsec: Vec<&TunnelShow> = tunnels.iter().filter(|t| t.remote_name.is_some()).collect();
    for t in &ipsec {
        match &t.local_cert {
            Some(p) if p == &active.certificate => match digest_of(p, false) {
                Ok(d) if d == active.certificate_digest => {}
                Ok(d) => mismatches.push(format!("{}: certificate digest {d}", t.name)),
                Err(e) => mismatches.push(format!("{}: certificate {}: {e}", t.name, p.display())),
            },
            other => mismatches.push(format!("{}: certificate path {other:?}", t.name)),
        }
        match &t.ca_cert {
            Some(p) if p == &active.ca_cert => match digest_of(p, true) {
                Ok(d) if d == active.trust_digest => {}
                Ok(d) => mismatches.push(format!("{}: trust digest {d}", t.name)),
                Err(e) => mismatches.push(format!("{}: CA {}: {e}", t.name, p.display())),
            },
            other => mismatches.push(format!("{}: CA path {other:?}", t.name)),
        }
    }
    if !ipsec.is_empty()
        && !loaded_certs
            .iter()
            .any(|c| normalize_serial(&c.serial) == active.certificate_serial && c.has_private_key)
    {
        mismatches.push("IKE daemon has not loaded the active certificate with its key".into());
    }
    for s in &active.ca_serials {
        if !loaded_cacerts
            .iter()
            .any(|c| normalize_serial(&c.serial) == *s)
        {
            mismatches.push(format!("IKE daemon has not loaded CA serial {s}"));
        }
    }
    let applied = mismatches.is_empty();
    Acknowledgement {
        configuration_applied: applied,
        acknowledged_trust_digest: applied.then_some(active.trust_digest),
        mismatches,
    }
}

/// Digests a file the monitor names: the leaf (first PEM certificate) or
/// the whole trust bundle.
pub fn digest_file(path: &Path, bundle: bool) -> Result<Sha256Digest, String> {
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    if bundle {
        TrustBundle::from_pem(&pem)
            .map(|t| t.digest())
            .map_err(|e| e.to_string())
    } else {
        Certificate::from_pem(&pem)
            .map(|c| c.digest())
            .map_err(|e| e.to_string())
    }
}

/// The running monitor.
#[derive(Debug)]
pub struct Monitor {
    config: MonitorConfig,
    launcher: Launcher,
    process: Supervised,
}

impl Monitor {
    /// Starts the monitor in the foreground with `--no-restart-ike-daemon`.
    pub fn start(config: MonitorConfig, launcher: Launcher) -> Result<Self, Error> {
        let mut args: Vec<OsString> = Vec::new();
        let program = match &config.python {
            Some(py) => {
                args.push(config.script.clone().into_os_string());
                py.clone()
            }
            None => config.script.clone().into_os_string(),
        };
        args.push(config.database.clone().into());
        args.push("--ike-daemon=strongswan".into());
        args.push("--no-restart-ike-daemon".into());
        let mut pidfile = OsString::from("--pidfile=");
        pidfile.push(config.rundir.join("ovs-monitor-ipsec.pid"));
        args.push(pidfile);
        if let Some(log) = &config.log_file {
            let mut a = OsString::from("--log-file=");
            a.push(log);
            args.push(a);
        }
        if let Some(r) = &config.rekeying {
            args.extend(r.flags().into_iter().map(OsString::from));
        }
        let spec = ProcessSpec {
            name: "monitor",
            program,
            args,
            log_file: config.output_file.clone(),
        };
        let process = Supervised::start(&spec, &launcher)?;
        Ok(Self {
            config,
            launcher,
            process,
        })
    }

    /// The control socket, as the monitor sees it. The monitor runs in
    /// the foreground without forking, so its PID is the child's (the
    /// launcher's `nsenter` execs in place) — the same PID its `--pidfile`
    /// holds.
    pub fn ctl_path(&self) -> PathBuf {
        self.config
            .rundir
            .join(format!("ovs-monitor-ipsec.{}.ctl", self.process.pid()))
    }

    /// The process handle (exit notification, signals).
    pub fn process(&mut self) -> &mut Supervised {
        &mut self.process
    }

    async fn appctl(&self, command: &str) -> Result<String, Error> {
        let ctl = self.ctl_path();
        let (status, out) = self
            .launcher
            .output(
                self.config.appctl.clone(),
                [OsString::from("-t"), ctl.into_os_string(), command.into()],
                self.config.command_timeout,
            )
            .await?;
        if !status.success() {
            return Err(Error::Unhealthy {
                process: "monitor",
                reason: format!("`ovs-appctl {command}` exited with {status}"),
            });
        }
        Ok(out)
    }

    /// Health probe: alive and answering on its control socket.
    pub async fn probe(&mut self) -> Result<Vec<TunnelShow>, Error> {
        if let Some(s) = self.process.try_exited() {
            return Err(Error::Unhealthy {
                process: "monitor",
                reason: format!("exited with {s}"),
            });
        }
        self.tunnels().await
    }

    /// `tunnels/show`, raw (for captures and diagnostics; may contain a PSK
    /// in PSK mode — never log it).
    pub async fn tunnels_show_raw(&self) -> Result<String, Error> {
        self.appctl("tunnels/show").await
    }

    /// `tunnels/rebuild` (patch v5 and later): the tunnels whose
    /// connections kept across renewals are replaced make-before-break.
    pub async fn rebuild(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .appctl("tunnels/rebuild")
            .await?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// `tunnels/show`, parsed.
    pub async fn tunnels(&self) -> Result<Vec<TunnelShow>, Error> {
        Ok(parse_tunnels_show(&self.tunnels_show_raw().await?))
    }

    /// Stops the monitor: SIGTERM to its group (its conns and policies
    /// stay, unlike `ovs-appctl exit`), SIGKILL after the grace period.
    pub async fn stop(&mut self) -> Result<std::process::ExitStatus, Error> {
        let grace = self.config.stop_grace;
        self.process.stop(grace).await
    }
}

#[cfg(test)]
mod tests;
