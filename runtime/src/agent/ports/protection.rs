//! [`ProtectionPort`] over the lease file, netlink XFRM and OVSDB.

use std::path::Path;
use std::sync::{Arc, Mutex};

use actors::ports::{
    GuardChange, GuardReadback, LeaseSummary, ProtectionPort, SaSummary, blocking,
};
use async_trait::async_trait;
use kube_ovn_ipsec_api::Uid;
use kube_ovn_ipsec_api::status::Reason;
use xfrm::alloc::OsRandom;
use xfrm::guard::{GuardEvent, GuardKeeper};
use xfrm::{Xfrm, XfrmHandle};

use super::datapath_readers::DatapathReaders;
use super::lock;
use crate::lease::{self, AllocationConfig, Lease, LeaseStore};
use crate::sa;

pub(super) fn protection_err(e: impl Into<crate::Error>) -> actors::Error {
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
    pub(super) node: Arc<ProtectedNode>,
    pub(super) ovs: ovsdb::Client,
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
pub(super) struct ProtectedNode {
    store: LeaseStore,
    node_uid: Uid,
    allocation: AllocationConfig,
    pub(super) keeper: Mutex<GuardKeeper<XfrmHandle>>,
    lease: Mutex<Option<Lease>>,
    /// What the last SA observation recorded (boot ID, attribution, the
    /// tunnels seen under the lease), so the record is rewritten only when
    /// it changes.
    observed: Mutex<Option<Observed>>,
    /// What a data-path sample reads besides XFRM.
    pub(super) datapath: Mutex<DatapathReaders>,
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
    pub(super) fn current(&self) -> actors::Result<Lease> {
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
