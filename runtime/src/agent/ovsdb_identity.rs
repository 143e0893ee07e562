//! [`OvsdbIdentity`] over the `ovsdb` crate: the three identity keys of
//! `Open_vSwitch . other_config` read and switched together through a
//! [`MapWriter`] that this adapter alone holds.
//!
//! The writer keeps `other_config` as the adapter last read or wrote it, so
//! an activation is one round trip (the `wait` on that map plus the `mutate`
//! of the three keys, one transaction); only a lost guard costs a re-read.
//! Every read the identity and monitor actors make refreshes that view.

use std::collections::BTreeMap;

use actors::ports::{OvsdbIdentity, OvsdbIdentityKeys};
use actors::{Error, Result};
use async_trait::async_trait;
use kube_ovn_ipsec_api::names::ovs;
use ovsdb::{Client, MapChanges, MapColumn, MapSnapshot, MapWriter};

/// Guarded transactions one activation may spend before it reports
/// [`Error::ActivationConflict`]. A guard is lost when anyone changed any
/// `other_config` key since the adapter's view (ovn-controller, an
/// operator); each such loss costs a re-read and one more transaction. The
/// only retry loop of an activation is the one this bounds, inside
/// [`MapWriter::update_map`]: the OVSDB writer does not loop around it.
pub const ACTIVATION_ATTEMPTS: u32 = 8;

/// The identity keys of one Open_vSwitch database.
#[derive(Debug, Clone)]
pub struct OvsdbIdentityAdapter {
    writer: MapWriter,
}

impl OvsdbIdentityAdapter {
    /// Uses `client` (connected to the `Open_vSwitch` database), with a
    /// writer of its own: no one else writes through it.
    pub fn new(client: Client) -> Self {
        OvsdbIdentityAdapter {
            writer: MapWriter::new(client),
        }
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
    match e {
        // Lost every guard to other writers: a conflict, not an OVSDB fault.
        ovsdb::Error::RetriesExhausted { .. } => Error::ActivationConflict,
        e => Error::Ovsdb(e.to_string()),
    }
}

#[async_trait]
impl OvsdbIdentity for OvsdbIdentityAdapter {
    async fn read(&self) -> Result<OvsdbIdentityKeys> {
        let snap = self
            .writer
            .read_map(&MapColumn::ovs_other_config())
            .await
            .map_err(ovsdb_err)?;
        Ok(keys_of(&snap))
    }

    async fn activate(&self, new: &OvsdbIdentityKeys) -> Result<()> {
        self.writer
            .update_map(
                &MapColumn::ovs_other_config(),
                &changes_to(new),
                ACTIVATION_ATTEMPTS,
            )
            .await
            .map(drop)
            .map_err(ovsdb_err)
    }
}
