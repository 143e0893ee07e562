//! [`OvsdbIdentity`] over the `ovsdb` crate: the three identity keys of
//! `Open_vSwitch . other_config` read and switched together.

use std::collections::BTreeMap;

use actors::ports::{OvsdbIdentity, OvsdbIdentityKeys};
use actors::{Error, Result};
use async_trait::async_trait;
use kube_ovn_ipsec_api::names::ovs;
use ovsdb::{Client, MapChanges, MapColumn, MapSnapshot};

/// How often an activation re-reads after another writer changed an
/// unrelated `other_config` key between our read and our write. Each retry
/// is one round trip; a writer that changes the map continuously is a
/// conflict the actor reports rather than a loop.
const UNRELATED_RACE_RETRIES: u32 = 8;

/// The identity keys of one Open_vSwitch database.
#[derive(Debug, Clone)]
pub struct OvsdbIdentityAdapter {
    client: Client,
}

impl OvsdbIdentityAdapter {
    /// Uses `client` (connected to the `Open_vSwitch` database).
    pub fn new(client: Client) -> Self {
        OvsdbIdentityAdapter { client }
    }
}

fn keys_of(snapshot: &MapSnapshot) -> OvsdbIdentityKeys {
    let get = |k: &str| snapshot.entries.get(k).cloned();
    OvsdbIdentityKeys {
        private_key: get(ovs::OTHER_CONFIG_PRIVATE_KEY),
        certificate: get(ovs::OTHER_CONFIG_CERTIFICATE),
        ca_cert: get(ovs::OTHER_CONFIG_CA_CERT),
    }
}

fn changes_to(new: &OvsdbIdentityKeys) -> MapChanges {
    BTreeMap::from([
        (
            ovs::OTHER_CONFIG_PRIVATE_KEY.to_string(),
            new.private_key.clone(),
        ),
        (
            ovs::OTHER_CONFIG_CERTIFICATE.to_string(),
            new.certificate.clone(),
        ),
        (ovs::OTHER_CONFIG_CA_CERT.to_string(), new.ca_cert.clone()),
    ])
}

fn ovsdb_err(e: ovsdb::Error) -> Error {
    Error::Ovsdb(e.to_string())
}

#[async_trait]
impl OvsdbIdentity for OvsdbIdentityAdapter {
    async fn read(&self) -> Result<OvsdbIdentityKeys> {
        let snap = self
            .client
            .read_map(&MapColumn::ovs_other_config())
            .await
            .map_err(ovsdb_err)?;
        Ok(keys_of(&snap))
    }

    async fn activate(&self, expected: &OvsdbIdentityKeys, new: &OvsdbIdentityKeys) -> Result<()> {
        let col = MapColumn::ovs_other_config();
        let changes = changes_to(new);
        for _ in 0..UNRELATED_RACE_RETRIES {
            let snap = self.client.read_map(&col).await.map_err(ovsdb_err)?;
            // The guard the actor asked for: the three keys as it last saw
            // them. Someone else moved them → a real conflict.
            if keys_of(&snap) != *expected {
                return Err(Error::ActivationConflict);
            }
            // The transaction waits on the whole map as read, so it also
            // fails when an unrelated key changed in between; that race is
            // harmless and retried here with a fresh read.
            match self.client.write_map_guarded(&col, &snap, &changes).await {
                Ok(_) => return Ok(()),
                Err(ovsdb::Error::GuardFailed { .. }) => continue,
                Err(e) => return Err(ovsdb_err(e)),
            }
        }
        Err(Error::ActivationConflict)
    }
}
