//! `NB_Global.ipsec` (the global switch, SPEC §7) and its mirror
//! `SB_Global.ipsec`, which `ovn-northd` copies over.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use uuid::Uuid;

use super::{OVN_NORTHBOUND, OVN_SOUTHBOUND};
use crate::Error;
use crate::client::Client;
use crate::connection::MonitorEvent;
use crate::datum::Datum;
use crate::protocol::{MonitorRequest, Operation, Row, RowUpdate2};

impl Client {
    /// Sets `NB_Global.ipsec` (connect this client to the NB database).
    pub async fn set_nb_ipsec(&self, enabled: bool) -> Result<(), Error> {
        let op = Operation::Update {
            table: "NB_Global".into(),
            conditions: vec![],
            row: Row::from([("ipsec".to_string(), Datum::from(enabled))]),
        };
        let res = self
            .transact(OVN_NORTHBOUND, std::slice::from_ref(&op))
            .await?;
        match res.first().and_then(|r| r.count) {
            Some(1) => Ok(()),
            n => Err(Error::RowCount {
                table: "NB_Global".into(),
                found: n.unwrap_or(0) as usize,
            }),
        }
    }

    /// Reads `NB_Global.ipsec` (connect this client to the NB database).
    pub async fn read_nb_ipsec(&self) -> Result<bool, Error> {
        self.read_bool(OVN_NORTHBOUND, "NB_Global", "ipsec").await
    }

    /// Reads `SB_Global.ipsec` (connect this client to the SB database).
    pub async fn read_sb_ipsec(&self) -> Result<bool, Error> {
        self.read_bool(OVN_SOUTHBOUND, "SB_Global", "ipsec").await
    }

    async fn read_bool(&self, db: &str, table: &str, column: &str) -> Result<bool, Error> {
        let (_, row) = self.select_single(db, table, &[column]).await?;
        row.get(column)
            .and_then(Datum::as_bool)
            .ok_or_else(|| Error::UnexpectedReply {
                reason: format!("{table}.{column} is not a boolean"),
            })
    }

    /// Waits until the `SB_Global` row exists and its `ipsec` equals
    /// `expected`, following a `monitor_cond` (no polling); survives
    /// reconnects. [`Error::Timeout`] after `timeout`.
    pub async fn wait_sb_ipsec(&self, expected: bool, timeout: Duration) -> Result<(), Error> {
        let tables =
            BTreeMap::from([("SB_Global".to_string(), MonitorRequest::columns(["ipsec"]))]);
        let wait = async {
            let mut stream = self.monitor_cond(OVN_SOUTHBOUND, tables).await?;
            let mut rows: HashMap<Uuid, Option<bool>> = HashMap::new();
            while let Some(ev) = stream.next().await {
                let updates = match ev {
                    MonitorEvent::Initial(u) => {
                        rows.clear();
                        u
                    }
                    MonitorEvent::Update(u) => u,
                    MonitorEvent::Disconnected(e) => {
                        tracing::debug!(error = %e, "SB monitor disconnected; waiting for resync");
                        continue;
                    }
                };
                for (uuid, change) in updates.into_values().flatten() {
                    match change {
                        RowUpdate2::Initial(r) | RowUpdate2::Insert(r) => {
                            // update2 omits columns that hold their default,
                            // and a boolean's default is false.
                            let v = r.get("ipsec").map_or(Some(false), Datum::as_bool);
                            rows.insert(uuid, v);
                        }
                        RowUpdate2::Modify(r) => {
                            if let Some(v) = r.get("ipsec") {
                                rows.insert(uuid, v.as_bool());
                            }
                        }
                        RowUpdate2::Delete => {
                            rows.remove(&uuid);
                        }
                    }
                }
                if !rows.is_empty() && rows.values().all(|v| *v == Some(expected)) {
                    return Ok(());
                }
            }
            Err(Error::Closed)
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    what: format!("SB_Global.ipsec == {expected}"),
                    millis: timeout.as_millis(),
                })
            })
    }
}
