//! The node's output-protection lease (SPEC §4): `{leaseId, mark, reqid}`
//! bound to the Node UID, allocated at random against the kernel's XFRM
//! state, persisted 0600 in the key directory, and published in OVS
//! `external_ids` in one transaction.
//!
//! The guards' kernel indexes are recorded in the same file, so cleanup and
//! a restarted agent read back exactly the policies this lease created.

use std::path::{Path, PathBuf};

use kube_ovn_ipsec_api::Uid;
use kube_ovn_ipsec_api::names::defaults::RESERVED_MARK_BITS;
use kube_ovn_ipsec_api::names::ovs::{
    EXTERNAL_ID_PROTECTION_LEASE, EXTERNAL_ID_PROTECTION_MARK, EXTERNAL_ID_PROTECTION_NODE_UID,
    EXTERNAL_ID_PROTECTION_REQID, PROTECTION_KEYS,
};
use ovsdb::{MapChanges, MapColumn, MapSnapshot};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::fsutil::write_atomic;
use crate::xfrm::model::{CandidateRejection, Family, Policy, State, check_candidate, find_bypass};

/// File name of the lease in the key directory.
pub const LEASE_FILE: &str = "protection-lease.json";
/// Version of the lease file's format.
pub const LEASE_FILE_VERSION: u32 = 1;
/// Candidates tried before allocation gives up. With random 32-bit marks
/// and 31-bit reqids a node would need millions of policies for 256
/// rejections in a row; reaching it means something systematic (a
/// wildcard-mask policy with a mark) that an operator must look at.
pub const MAX_CANDIDATES: u32 = 256;

/// A guard the lease armed: its family and kernel index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardRecord {
    /// Address family of the guard.
    pub family: Family,
    /// The kernel's policy index.
    pub index: u32,
}

/// The lease as persisted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// File format version ([`LEASE_FILE_VERSION`]).
    pub version: u32,
    /// Random identifier of this lease (UUID v4).
    pub lease_id: String,
    /// The Node UID the lease belongs to.
    #[serde(rename = "nodeUID")]
    pub node_uid: String,
    /// The output mark (exact, `/0xffffffff`).
    pub mark: u32,
    /// The reqid of this node's IPsec policies and SAs.
    pub reqid: u32,
    /// The guards armed for this lease, with their kernel indexes.
    #[serde(default)]
    pub guards: Vec<GuardRecord>,
}

impl Lease {
    /// The recorded guard of `family`, if any.
    pub fn guard(&self, family: Family) -> Option<GuardRecord> {
        self.guards.iter().copied().find(|g| g.family == family)
    }

    /// Records (or replaces) the guard of `family`.
    pub fn record_guard(&mut self, family: Family, index: u32) {
        self.guards.retain(|g| g.family != family);
        self.guards.push(GuardRecord { family, index });
        self.guards.sort_by_key(|g| g.family);
    }

    /// The four `external_ids` keys and values of the publication.
    pub fn publication(&self) -> MapChanges {
        MapChanges::from([
            (
                EXTERNAL_ID_PROTECTION_NODE_UID.to_string(),
                Some(self.node_uid.clone()),
            ),
            (
                EXTERNAL_ID_PROTECTION_LEASE.to_string(),
                Some(self.lease_id.clone()),
            ),
            (
                EXTERNAL_ID_PROTECTION_MARK.to_string(),
                Some(self.mark.to_string()),
            ),
            (
                EXTERNAL_ID_PROTECTION_REQID.to_string(),
                Some(self.reqid.to_string()),
            ),
        ])
    }
}

/// The changes that withdraw the publication (cleanup path only).
pub fn withdrawal() -> MapChanges {
    PROTECTION_KEYS
        .iter()
        .map(|k| (k.to_string(), None))
        .collect()
}

/// Publishes `lease` in `Open_vSwitch . external_ids`: the four keys in one
/// guarded transaction, every other key untouched (the `ovsdb` crate's
/// guarded map helper, retried on a concurrent writer).
pub async fn publish(client: &ovsdb::Client, lease: &Lease) -> Result<MapSnapshot, Error> {
    client
        .update_map(&MapColumn::ovs_external_ids(), &lease.publication(), 5)
        .await
        .map_err(Error::Ovsdb)
}

/// Removes the four keys in one guarded transaction (cleanup path only).
pub async fn unpublish(client: &ovsdb::Client) -> Result<MapSnapshot, Error> {
    client
        .update_map(&MapColumn::ovs_external_ids(), &withdrawal(), 5)
        .await
        .map_err(Error::Ovsdb)
}

/// Randomness for allocation (a trait so tests can force collisions).
pub trait RandomSource {
    /// A uniformly random 32-bit value.
    fn next_u32(&mut self) -> u32;
}

/// The operating system's CSPRNG (through `rand`).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn next_u32(&mut self) -> u32 {
        rand::random()
    }
}

/// Allocation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationConfig {
    /// Mark bits a lease must never use (default kube-proxy's `0xc000`).
    pub reserved_bits: u32,
}

impl Default for AllocationConfig {
    fn default() -> Self {
        Self {
            reserved_bits: RESERVED_MARK_BITS,
        }
    }
}

/// Allocates a fresh lease for `node_uid` against the kernel's `policies`
/// and `states`: random candidates, each rejected when it aliases an
/// existing mark (under its mask) or reqid or has reserved bits; refuses
/// with [`Error::BypassPresent`] while a bypass exists.
pub fn allocate(
    node_uid: &Uid,
    policies: &[Policy],
    states: &[State],
    config: &AllocationConfig,
    rng: &mut dyn RandomSource,
) -> Result<Lease, Error> {
    let mut last: Option<CandidateRejection> = None;
    for _ in 0..MAX_CANDIDATES {
        let mark = rng.next_u32();
        let reqid = rng.next_u32() & 0x7fff_ffff;
        if let Err(r) = check_candidate(mark, reqid, config.reserved_bits, policies, states) {
            tracing::debug!(rejection = ?r, "lease candidate rejected");
            last = Some(r);
            continue;
        }
        // What remains matches every mark (a mark-specific bypass is an
        // alias above): no candidate could avoid it.
        if let Some(bypass) = find_bypass(mark, policies) {
            return Err(Error::BypassPresent {
                reason: bypass.to_string(),
            });
        }
        let mut bytes = [0u8; 16];
        for chunk in bytes.chunks_mut(4) {
            chunk.copy_from_slice(&rng.next_u32().to_ne_bytes());
        }
        // Version 4 / RFC 4122 variant bits over the random bytes.
        let lease_id = uuid::Builder::from_random_bytes(bytes).into_uuid();
        return Ok(Lease {
            version: LEASE_FILE_VERSION,
            lease_id: lease_id.to_string(),
            node_uid: node_uid.as_str().to_string(),
            mark,
            reqid,
            guards: Vec::new(),
        });
    }
    Err(Error::LeaseExhausted {
        attempts: MAX_CANDIDATES,
        last: last.map_or_else(String::new, |r| format!("{r:?}")),
    })
}

/// What the key directory holds for the asking node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No lease file.
    None,
    /// This node's lease.
    Mine(Lease),
    /// A lease of a node with another UID (re-registered Node object): it is
    /// never inherited.
    Foreign(Lease),
}

/// The lease file in the key directory.
#[derive(Debug, Clone)]
pub struct LeaseStore {
    dir: PathBuf,
}

impl LeaseStore {
    /// The store in key directory `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The lease file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(LEASE_FILE)
    }

    /// Reads the lease file, whoever it belongs to.
    pub fn load(&self) -> Result<Option<Lease>, Error> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let lease: Lease = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if lease.version != LEASE_FILE_VERSION {
            return Err(Error::Corrupt {
                path,
                reason: format!("unknown lease file version {}", lease.version),
            });
        }
        Ok(Some(lease))
    }

    /// Reads the lease file and says whether it belongs to `node_uid`.
    pub fn load_for(&self, node_uid: &Uid) -> Result<Loaded, Error> {
        Ok(match self.load()? {
            None => Loaded::None,
            Some(l) if l.node_uid == node_uid.as_str() => Loaded::Mine(l),
            Some(l) => Loaded::Foreign(l),
        })
    }

    /// Persists `lease` (0600, atomically).
    pub fn save(&self, lease: &Lease) -> Result<(), Error> {
        let bytes = serde_json::to_vec_pretty(lease).map_err(|e| Error::Corrupt {
            path: self.path(),
            reason: e.to_string(),
        })?;
        write_atomic(&self.path(), &bytes, 0o600)
    }

    /// Moves a foreign lease aside as `protection-lease.<uid>.foreign.json`
    /// (evidence for the operator: its guards stay in the kernel, untouched,
    /// since they are not this node's to remove). Returns the new path.
    pub fn retire_foreign(&self, lease: &Lease) -> Result<PathBuf, Error> {
        let safe: String = lease
            .node_uid
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let to = self
            .dir
            .join(format!("protection-lease.{safe}.foreign.json"));
        std::fs::rename(self.path(), &to).map_err(|source| Error::Io {
            path: to.clone(),
            source,
        })?;
        sync_dir(&self.dir)?;
        Ok(to)
    }

    /// This node's lease: the persisted one if it is this node's, otherwise
    /// a fresh allocation against the kernel's current policies and states
    /// (a foreign lease is retired first, never inherited). The returned
    /// flag is true when the lease was allocated now.
    pub fn obtain(
        &self,
        node_uid: &Uid,
        xfrm: &mut dyn crate::xfrm::Xfrm,
        config: &AllocationConfig,
        rng: &mut dyn RandomSource,
    ) -> Result<(Lease, bool), Error> {
        match self.load_for(node_uid)? {
            Loaded::Mine(l) => return Ok((l, false)),
            Loaded::Foreign(l) => {
                let to = self.retire_foreign(&l)?;
                tracing::warn!(
                    foreign_node_uid = %l.node_uid,
                    retired = %to.display(),
                    "lease of another Node UID found; not inherited"
                );
            }
            Loaded::None => {}
        }
        let policies = xfrm.dump_policies()?;
        let states = xfrm.dump_states()?;
        let lease = allocate(node_uid, &policies, &states, config, rng)?;
        self.save(&lease)?;
        Ok((lease, true))
    }
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests;
