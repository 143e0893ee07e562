//! The protection, IKE and monitor actors' ports over this crate's adapters: lease and guards
//! ([`crate::lease`], [`xfrm::guard`] over netlink XFRM), the IKE daemon
//! ([`crate::ike`]) and the monitor ([`crate::monitor`], with the
//! acknowledgement and the trust bundle installed one file per CA).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use actors::ports::{
    Acknowledgement, DatapathPort, DatapathSample, GuardChange, GuardReadback, IkePort,
    LeaseSummary, MonitorPort, OvsdbIdentityKeys, ProtectionPort, RunningMonitor, RunningProcess,
    SaSummary, blocking,
};
use async_trait::async_trait;
use kube_ovn_ipsec_api::Uid;
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::status::Reason;

use crate::ike::{IkeConfig, IkeDaemon};
use crate::lease::{self, AllocationConfig, Lease, LeaseStore};
use crate::monitor::{self, ActiveIdentity, Monitor, MonitorConfig};
use crate::monitor_patch::MonitorPatch;
use crate::process::Launcher;
use crate::sa;
use kube_ovn_ipsec_api::strongswan::parse_listcerts;
use xfrm::alloc::OsRandom;
use xfrm::guard::{GuardEvent, GuardKeeper};
use xfrm::{Xfrm, XfrmHandle};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn protection_err(e: impl Into<crate::Error>) -> actors::Error {
    let e: crate::Error = e.into();
    let reason = match &e {
        crate::Error::Xfrm(xfrm::Error::BypassPresent { .. }) => Reason::BypassPolicyPresent,
        crate::Error::Xfrm(xfrm::Error::LeaseExhausted { .. }) => Reason::LeaseAllocationFailed,
        crate::Error::Ovsdb(_) => Reason::OvsdbUnavailable,
        crate::Error::Corrupt { path, .. } | crate::Error::Io { path, .. }
            if path.file_name() == Some(std::ffi::OsStr::new(lease::LEASE_FILE)) =>
        {
            Reason::LeaseFileInvalid
        }
        _ => Reason::GuardMissing,
    };
    actors::Error::Protection {
        reason,
        detail: e.to_string(),
    }
}

fn process_err(process: &'static str, e: crate::Error) -> actors::Error {
    actors::Error::Process {
        process,
        reason: e.to_string(),
    }
}

fn create_key_dir(dir: Option<&Path>) -> Result<(), crate::Error> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = dir else { return Ok(()) };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| crate::Error::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// [`ProtectionPort`] over the lease file, netlink XFRM and OVSDB.
///
/// Netlink requests and lease-file writes block (a netlink round trip is
/// microseconds, a dump of 10,000 policies milliseconds, an fsync'd write
/// milliseconds): they run on tokio's blocking threads, never inside an
/// actor's handler. OVSDB calls are async and stay on the executor.
#[derive(Debug, Clone)]
pub struct ProtectionAdapter {
    node: Arc<ProtectedNode>,
    ovs: ovsdb::Client,
}

/// The part of the observation record that decides whether it is
/// rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    boot_id: String,
    lease_id: String,
    attribution: sa::Attribution,
    tunnels: Vec<sa::TunnelEndpoints>,
}

/// What the blocking side of [`ProtectionAdapter`] owns.
#[derive(Debug)]
struct ProtectedNode {
    store: LeaseStore,
    node_uid: Uid,
    allocation: AllocationConfig,
    keeper: Mutex<GuardKeeper<XfrmHandle>>,
    lease: Mutex<Option<Lease>>,
    /// What the last SA observation recorded (boot ID, attribution, the
    /// tunnels seen under the lease), so the record is rewritten only when
    /// it changes.
    observed: Mutex<Option<Observed>>,
    /// What a data-path sample reads besides XFRM.
    datapath: Mutex<DatapathReaders>,
}

/// Where the tunnel (Pod) MTU of the MTU check comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelMtu {
    /// Configured (kube-ovn-cni's `--mtu`).
    Fixed(u32),
    /// The MTU of this interface of the node's namespace (`ovn0`, which
    /// kube-ovn-cni gives the Pod MTU).
    Interface(String),
}

/// What a data-path sample reads besides XFRM, opened once in the node's
/// network namespace: the kernel's XFRM counters and the link MTUs.
#[derive(Debug)]
pub struct DatapathReaders {
    stat: Option<xfrm::stat::StatFile>,
    links: xfrm::link::LinkHandle,
    tunnel_mtu: TunnelMtu,
    /// Samples taken.
    samples: u64,
    /// What changes rarely, re-read every [`SLOW_EVERY`] samples.
    slow: Option<SlowReadings>,
}

/// A sample reads the SAs and `xfrm_stat` every time — what movement is
/// judged by — and the MTUs and the policy dump (only counted) every this
/// many samples (a minute at the default period), on `ipsec/refresh`, or
/// when the tunnels' local address changes: the sample stays one SA dump, one OVSDB select
/// and one `/proc` read, which matters on nodes with many peers and under
/// emulation.
const SLOW_EVERY: u64 = 30;

/// The rarely changing part of a sample.
#[derive(Debug, Clone, Default)]
struct SlowReadings {
    /// The tunnels' local address they were read for.
    local: Option<std::net::IpAddr>,
    underlay_mtu: Option<u32>,
    tunnel_mtu: Option<u32>,
    lease_policies: usize,
}

impl DatapathReaders {
    /// Opens the readers in the named network namespace (`None`: this
    /// process's). Blocks briefly (a helper thread enters the namespace).
    pub fn open(netns: Option<&str>, tunnel_mtu: TunnelMtu) -> Result<Self, crate::Error> {
        let stat = xfrm::stat::StatFile::open(netns)?;
        if stat.is_none() {
            tracing::warn!(
                "this kernel keeps no XFRM statistics (/proc/net/xfrm_stat): GuardDrop cannot be told from NoSA"
            );
        }
        let links = match netns {
            Some(ns) => xfrm::link::LinkHandle::in_netns(ns)?,
            None => xfrm::link::LinkHandle::open()?,
        };
        Ok(Self {
            stat,
            links,
            tunnel_mtu,
            samples: 0,
            slow: None,
        })
    }
}

impl ProtectionAdapter {
    /// The lease of `node_uid` in `key_dir`, guards through `xfrm`,
    /// publication through `ovs`.
    pub fn new(
        key_dir: &Path,
        node_uid: Uid,
        allocation: AllocationConfig,
        xfrm: XfrmHandle,
        ovs: ovsdb::Client,
        datapath: DatapathReaders,
    ) -> Self {
        Self {
            node: Arc::new(ProtectedNode {
                store: LeaseStore::new(key_dir),
                node_uid,
                allocation,
                keeper: Mutex::new(GuardKeeper::new(xfrm)),
                lease: Mutex::new(None),
                observed: Mutex::new(None),
                datapath: Mutex::new(datapath),
            }),
            ovs,
        }
    }
}

impl ProtectedNode {
    fn current(&self) -> actors::Result<Lease> {
        lock(&self.lease)
            .clone()
            .ok_or_else(|| actors::Error::Protection {
                reason: Reason::GuardMissing,
                detail: "no lease obtained yet".into(),
            })
    }

    fn obtain_lease(&self, allocate: bool) -> actors::Result<Option<LeaseSummary>> {
        if !allocate {
            // Only this node's persisted lease; a foreign one is retired
            // when allocation is allowed, not before.
            return match self
                .store
                .load_for(&self.node_uid)
                .map_err(protection_err)?
            {
                crate::lease::Loaded::Mine(lease) => Ok(Some(self.keep(lease, false))),
                _ => Ok(None),
            };
        }
        // The identity actor may not have created the key directory yet.
        create_key_dir(self.store.path().parent()).map_err(protection_err)?;
        let (lease, allocated) = {
            let mut keeper = lock(&self.keeper);
            self.store
                .obtain(
                    &self.node_uid,
                    keeper.xfrm(),
                    &self.allocation,
                    &mut OsRandom,
                )
                .map_err(protection_err)?
        };
        Ok(Some(self.keep(lease, allocated)))
    }

    /// Makes `lease` the current one; its summary.
    fn keep(&self, lease: Lease, allocated: bool) -> LeaseSummary {
        let summary = LeaseSummary {
            lease_id: lease.lease_id.clone(),
            mark: lease.mark,
            reqid: lease.reqid,
            allocated,
        };
        *lock(&self.lease) = Some(lease);
        summary
    }

    fn evaluate_guards(&self) -> actors::Result<GuardReadback> {
        let mut lease_slot = lock(&self.lease);
        let Some(lease) = lease_slot.as_mut() else {
            return Err(actors::Error::Protection {
                reason: Reason::GuardMissing,
                detail: "no lease obtained yet".into(),
            });
        };
        let eval = lock(&self.keeper).evaluate(lease).map_err(protection_err)?;
        if eval.lease_changed {
            self.store.save(lease).map_err(protection_err)?;
        }
        Ok(GuardReadback {
            armed: eval.armed,
            changes: eval.events.iter().map(change_of).collect(),
        })
    }

    /// Attributes the kernel's SAs and policies to `lease` over `tunnels`
    /// and records the observation when it changed.
    fn observe_sas(
        &self,
        lease: &Lease,
        tunnels: &[sa::TunnelEndpoints],
    ) -> actors::Result<SaSummary> {
        let (states, policies) = {
            let mut keeper = lock(&self.keeper);
            let xfrm = keeper.xfrm();
            let states = xfrm.dump_states().map_err(protection_err)?;
            (states, xfrm.dump_policies().map_err(protection_err)?)
        };
        let attribution = sa::attribute(lease, &states, &policies, tunnels);
        let mut summary = SaSummary {
            tunnels: tunnels.len(),
            sas: attribution.sas.len(),
            policies: attribution.policies.len(),
            recorded: false,
        };
        let boot_id = crate::fsutil::boot_id().map_err(protection_err)?;
        let lease_file = self.store.path();
        let dir = lease_file.parent().unwrap_or(Path::new("."));
        let mut observed = lock(&self.observed);
        // The tunnels recorded under this lease so far: from the last
        // observation, or (first pass after a restart) from the record on
        // disk. The cleanup path drains over them once the tunnels are gone.
        let recorded = match observed.as_ref() {
            Some(o) if o.lease_id == lease.lease_id => o.tunnels.clone(),
            Some(_) => Vec::new(),
            None => sa::load(dir)
                .ok()
                .flatten()
                .filter(|r| r.lease_id == lease.lease_id)
                .map(|r| r.tunnels)
                .unwrap_or_default(),
        };
        let current = Observed {
            boot_id,
            lease_id: lease.lease_id.clone(),
            attribution,
            tunnels: sa::union_tunnels(&recorded, tunnels),
        };
        if observed.as_ref() != Some(&current) {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            sa::record(
                dir,
                lease,
                current.attribution.clone(),
                current.tunnels.clone(),
                now,
            )
            .map_err(protection_err)?;
            *observed = Some(current);
            summary.recorded = true;
        }
        Ok(summary)
    }
}

impl ProtectedNode {
    /// One data-path sample of `lease` over `peers` (blocking: netlink
    /// dumps and a `/proc` read).
    fn sample_datapath(
        &self,
        lease: &Lease,
        peers: &[sa::PeerTunnel],
        full: bool,
    ) -> actors::Result<DatapathSample> {
        let mut readers = lock(&self.datapath);
        let local = peers.first().map(|p| p.endpoints.local);
        let stale = full
            || readers
                .slow
                .as_ref()
                .is_none_or(|s| s.local != local || readers.samples.is_multiple_of(SLOW_EVERY));
        readers.samples += 1;
        let states = lock(&self.keeper)
            .xfrm()
            .dump_states()
            .map_err(protection_err)?;
        if stale {
            let policies = lock(&self.keeper)
                .xfrm()
                .dump_policies()
                .map_err(protection_err)?;
            let tunnels: Vec<sa::TunnelEndpoints> = peers.iter().map(|p| p.endpoints).collect();
            let lease_policies = sa::attribute(lease, &states, &policies, &tunnels)
                .policies
                .len();
            let underlay_mtu = match local {
                Some(a) => readers.links.mtu_of_address(a).map_err(protection_err)?,
                None => None,
            };
            let tunnel_mtu = match readers.tunnel_mtu.clone() {
                TunnelMtu::Fixed(m) => Some(m),
                TunnelMtu::Interface(name) => {
                    readers.links.mtu_of_name(&name).map_err(protection_err)?
                }
            };
            readers.slow = Some(SlowReadings {
                local,
                underlay_mtu,
                tunnel_mtu,
                lease_policies,
            });
        }
        let xfrm_stat = match readers.stat.as_mut() {
            Some(f) => f.read().map_err(protection_err)?.into_map(),
            None => Default::default(),
        };
        let slow = readers.slow.clone().unwrap_or_default();
        let peers = sa::peer_samples(lease, &states, peers);
        let lease_sas = peers
            .iter()
            .map(|p| p.outbound.len() + p.inbound.len())
            .sum();
        Ok(DatapathSample {
            peers,
            xfrm_stat,
            underlay_mtu: slow.underlay_mtu,
            tunnel_mtu: slow.tunnel_mtu,
            lease_sas,
            lease_policies: slow.lease_policies,
        })
    }
}

#[async_trait]
impl DatapathPort for ProtectionAdapter {
    async fn sample(&self, full: bool) -> actors::Result<Option<DatapathSample>> {
        let Ok(lease) = self.node.current() else {
            return Ok(None);
        };
        let peers = sa::read_peers(&self.ovs, lease.reqid)
            .await
            .map_err(protection_err)?;
        let node = Arc::clone(&self.node);
        blocking(move || node.sample_datapath(&lease, &peers, full))
            .await
            .map(Some)
    }
}

fn change_of(e: &GuardEvent) -> GuardChange {
    match e {
        GuardEvent::Armed { family, index } => GuardChange::Armed {
            family: family.to_string(),
            index: *index,
        },
        GuardEvent::Readded {
            family,
            old_index,
            new_index,
        } => GuardChange::Readded {
            family: family.to_string(),
            old_index: *old_index,
            new_index: *new_index,
        },
        GuardEvent::Adopted {
            family, new_index, ..
        } => GuardChange::Adopted {
            family: family.to_string(),
            new_index: *new_index,
        },
        GuardEvent::Conflict {
            family,
            index,
            mismatches,
        } => GuardChange::Conflict {
            family: family.to_string(),
            index: *index,
            detail: format!("{mismatches:?}"),
        },
    }
}

#[async_trait]
impl ProtectionPort for ProtectionAdapter {
    async fn obtain_lease(&self, allocate: bool) -> actors::Result<Option<LeaseSummary>> {
        let node = Arc::clone(&self.node);
        blocking(move || node.obtain_lease(allocate)).await
    }

    async fn evaluate_guards(&self) -> actors::Result<GuardReadback> {
        let node = Arc::clone(&self.node);
        blocking(move || node.evaluate_guards()).await
    }

    async fn publish_lease(&self) -> actors::Result<Vec<String>> {
        let lease = self.node.current()?;
        lease::publish(&self.ovs, &lease)
            .await
            .map_err(protection_err)
    }

    async fn observe_sas(&self) -> actors::Result<SaSummary> {
        let lease = self.node.current()?;
        let tunnels = sa::read_tunnels(&self.ovs, lease.reqid)
            .await
            .map_err(protection_err)?;
        let node = Arc::clone(&self.node);
        blocking(move || node.observe_sas(&lease, &tunnels)).await
    }
}

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
