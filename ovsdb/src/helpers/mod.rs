//! The three things this project does with OVSDB, built on [`Client`]'s
//! request/response API (the handle itself knows none of them):
//!
//! 1. Guarded updates of a string map column of a single-row table, above
//!    all `Open_vSwitch . other_config` (identity activation, SPEC §2) and
//!    `Open_vSwitch . external_ids` (the lease, SPEC §4): [`map`], with
//!    [`MapWriter`] keeping the last known value of each column.
//! 2. `NB_Global.ipsec` read and set (SPEC §7): [`ovn`].
//! 3. `SB_Global.ipsec` read and wait-until-equal, driven by a monitor: [`ovn`].

use uuid::Uuid;

use crate::Error;
use crate::client::Client;
use crate::datum::{Atom, Datum};
use crate::protocol::{Operation, Row};

pub mod map;
pub mod ovn;

pub use map::{MapChanges, MapColumn, MapSnapshot, MapWriter, guarded_map_ops};

/// Database (and table) name of the OVS configuration database.
pub const OPEN_VSWITCH: &str = "Open_vSwitch";
/// Database name of the OVN northbound database.
pub const OVN_NORTHBOUND: &str = "OVN_Northbound";
/// Database name of the OVN southbound database.
pub const OVN_SOUTHBOUND: &str = "OVN_Southbound";

impl Client {
    /// Selects `columns` of the only row of `table`; [`Error::RowCount`] when
    /// there is not exactly one.
    pub async fn select_single(
        &self,
        db: &str,
        table: &str,
        columns: &[&str],
    ) -> Result<(Uuid, Row), Error> {
        let mut cols: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        cols.push("_uuid".into());
        let op = Operation::Select {
            table: table.into(),
            conditions: vec![],
            columns: Some(cols),
        };
        let mut res = self.transact(db, std::slice::from_ref(&op)).await?;
        let rows = res.pop().and_then(|r| r.rows).unwrap_or_default();
        let [mut row] = <[Row; 1]>::try_from(rows).map_err(|rows| Error::RowCount {
            table: table.into(),
            found: rows.len(),
        })?;
        let uuid = match row.remove("_uuid") {
            Some(Datum::Atom(Atom::Uuid(u))) => u,
            _ => {
                return Err(Error::UnexpectedReply {
                    reason: format!("{table} row without _uuid"),
                });
            }
        };
        Ok((uuid, row))
    }
}
