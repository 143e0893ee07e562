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
use ovsdb::{MapChanges, MapColumn, MapSnapshot, MapWriter};
use serde::{Deserialize, Serialize};

use crate::Error;
use actors::keydir::write_atomic;
use xfrm::alloc::RandomSource;
use xfrm::guard::{GuardRecord, GuardSet};
use xfrm::model::{Policy, State};

/// File name of the lease in the key directory.
pub const LEASE_FILE: &str = "protection-lease.json";
/// Version of the lease file's format.
pub const LEASE_FILE_VERSION: u32 = 1;
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

impl GuardSet for Lease {
    fn mark(&self) -> u32 {
        self.mark
    }
    fn guards(&self) -> &[GuardRecord] {
        &self.guards
    }
    fn guards_mut(&mut self) -> &mut Vec<GuardRecord> {
        &mut self.guards
    }
}

impl Lease {
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
/// [`MapWriter`], which retries a lost guard itself). It reads first, so an
/// already published lease costs one read and no write — which is how the
/// agent also checks its publication for drift on every read-back. Returns
/// the keys that were missing or different (and are now restored); empty
/// when OVSDB already held the lease.
pub async fn publish(client: &ovsdb::Client, lease: &Lease) -> Result<Vec<String>, Error> {
    let col = MapColumn::ovs_external_ids();
    let want = lease.publication();
    let snap = client.read_map(&col).await.map_err(Error::Ovsdb)?;
    let drifted = drifted_keys(&snap.entries, &want);
    if !drifted.is_empty() {
        MapWriter::new(client.clone())
            .update_map_from(&col, Some(&snap), &want, 5)
            .await
            .map_err(Error::Ovsdb)?;
    }
    Ok(drifted)
}

/// The keys of `want` that `have` lacks or holds with another value (or,
/// for a removal, still holds).
pub fn drifted_keys(
    have: &std::collections::BTreeMap<String, String>,
    want: &MapChanges,
) -> Vec<String> {
    want.iter()
        .filter(|(k, v)| have.get(*k) != v.as_ref())
        .map(|(k, _)| k.clone())
        .collect()
}

/// Removes the four keys in one guarded transaction (cleanup path only).
pub async fn unpublish(client: &ovsdb::Client) -> Result<MapSnapshot, Error> {
    MapWriter::new(client.clone())
        .update_map(&MapColumn::ovs_external_ids(), &withdrawal(), 5)
        .await
        .map_err(Error::Ovsdb)
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
/// and `states` ([`xfrm::alloc::allocate`]: aliases and reserved bits
/// rejected, refused while a bypass exists), with a random lease id drawn
/// from the same source.
pub fn allocate(
    node_uid: &Uid,
    policies: &[Policy],
    states: &[State],
    config: &AllocationConfig,
    rng: &mut dyn RandomSource,
) -> Result<Lease, Error> {
    let xfrm::alloc::Allocation { mark, reqid } =
        xfrm::alloc::allocate(policies, states, config.reserved_bits, rng)?;
    let mut bytes = [0u8; 16];
    for chunk in bytes.chunks_mut(4) {
        chunk.copy_from_slice(&rng.next_u32().to_ne_bytes());
    }
    // Version 4 / RFC 4122 variant bits over the random bytes.
    let lease_id = uuid::Builder::from_random_bytes(bytes).into_uuid();
    Ok(Lease {
        version: LEASE_FILE_VERSION,
        lease_id: lease_id.to_string(),
        node_uid: node_uid.as_str().to_string(),
        mark,
        reqid,
        guards: Vec::new(),
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

    /// Reads the lease file, whoever it belongs to, first setting it back
    /// to 0600 if it was wider (the agent's read: it owns the file).
    pub fn load(&self) -> Result<Option<Lease>, Error> {
        let path = self.path();
        // The lease names the mark that exempts packets from the guards'
        // drop: it is kept 0600 like a key (tightened, and said so).
        actors::keydir::tighten_secret(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        self.read()
    }

    /// Reads the lease file and changes nothing (the cleanup's read: a run
    /// that ends with nothing to release leaves the directory as it was).
    /// A symbolic link is refused, never followed.
    pub fn read(&self) -> Result<Option<Lease>, Error> {
        let path = self.path();
        let bytes = match actors::keydir::read_no_follow(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
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
        write_atomic(&self.path(), &bytes, 0o600).map_err(|e| Error::Io {
            path: e.path,
            source: e.source,
        })
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
        xfrm: &mut dyn xfrm::Xfrm,
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
