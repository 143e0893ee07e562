//! The three things this project does with OVSDB:
//!
//! 1. Guarded updates of a string map column of a single-row table, above
//!    all `Open_vSwitch . other_config` (identity activation, SPEC §2) and
//!    `Open_vSwitch . external_ids` (the lease, SPEC §4).
//! 2. `NB_Global.ipsec` read and set (SPEC §7).
//! 3. `SB_Global.ipsec` read and wait-until-equal, driven by a monitor.
//!
//! ## Why the guard looks like this
//! A `wait` compares whole columns, so the guard is the full map exactly as
//! read. The write then deletes the target keys and inserts their new values
//! with one `mutate`, so keys the caller did not name are never rewritten:
//! a concurrent writer of another key makes the guard fail (and the caller
//! retry on a fresh read) instead of having its key silently reverted, and
//! the target keys change together or not at all.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use uuid::Uuid;

use crate::Error;
use crate::client::{Client, MonitorEvent};
use crate::datum::Datum;
use crate::protocol::{Condition, MonitorRequest, Mutation, Operation, Row, RowUpdate2};

/// Database (and table) name of the OVS configuration database.
pub const OPEN_VSWITCH: &str = "Open_vSwitch";
/// Database name of the OVN northbound database.
pub const OVN_NORTHBOUND: &str = "OVN_Northbound";
/// Database name of the OVN southbound database.
pub const OVN_SOUTHBOUND: &str = "OVN_Southbound";

/// A string→string map column of a table that has exactly one row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MapColumn {
    /// Database name.
    pub db: String,
    /// Table name.
    pub table: String,
    /// Column name (type `{"key":"string","value":"string",...}`).
    pub column: String,
}

impl MapColumn {
    /// Any single-row table's string map column.
    pub fn new(db: impl Into<String>, table: impl Into<String>, column: impl Into<String>) -> Self {
        Self {
            db: db.into(),
            table: table.into(),
            column: column.into(),
        }
    }

    /// `Open_vSwitch . other_config` (identity paths).
    pub fn ovs_other_config() -> Self {
        Self::new(OPEN_VSWITCH, OPEN_VSWITCH, "other_config")
    }

    /// `Open_vSwitch . external_ids` (system-id, the lease).
    pub fn ovs_external_ids() -> Self {
        Self::new(OPEN_VSWITCH, OPEN_VSWITCH, "external_ids")
    }
}

/// A map column as read: the guard for a later write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSnapshot {
    /// The row's UUID.
    pub row: Uuid,
    /// The whole map.
    pub entries: BTreeMap<String, String>,
}

/// Key → new value (`None` removes the key).
pub type MapChanges = BTreeMap<String, Option<String>>;

impl MapSnapshot {
    /// The map after `changes`.
    pub fn with(&self, changes: &MapChanges) -> MapSnapshot {
        let mut entries = self.entries.clone();
        for (k, v) in changes {
            match v {
                Some(v) => entries.insert(k.clone(), v.clone()),
                None => entries.remove(k),
            };
        }
        MapSnapshot {
            row: self.row,
            entries,
        }
    }

    /// True when applying `changes` would change nothing.
    pub fn satisfies(&self, changes: &MapChanges) -> bool {
        changes
            .iter()
            .all(|(k, v)| self.entries.get(k) == v.as_ref())
    }
}

/// The operations of a guarded map write: `wait` on the whole map as read,
/// then one `mutate` that deletes the target keys and inserts their new
/// values. Pure, so the exact transaction is unit-tested.
pub fn guarded_map_ops(
    col: &MapColumn,
    snapshot: &MapSnapshot,
    changes: &MapChanges,
) -> Vec<Operation> {
    let row = || vec![Condition::uuid(snapshot.row)];
    let mut mutations = vec![Mutation::delete(
        &col.column,
        Datum::string_set(changes.keys()),
    )];
    let inserts: Vec<(&String, &String)> = changes
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
    if !inserts.is_empty() {
        mutations.push(Mutation::insert(&col.column, Datum::string_map(inserts)));
    }
    vec![
        Operation::Wait {
            table: col.table.clone(),
            timeout_ms: Some(0),
            conditions: row(),
            columns: vec![col.column.clone()],
            until: "==".into(),
            rows: vec![Row::from([(
                col.column.clone(),
                Datum::string_map(&snapshot.entries),
            )])],
        },
        Operation::Mutate {
            table: col.table.clone(),
            conditions: row(),
            mutations,
        },
    ]
}

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
            Some(Datum::Atom(crate::datum::Atom::Uuid(u))) => u,
            _ => {
                return Err(Error::UnexpectedReply {
                    reason: format!("{table} row without _uuid"),
                });
            }
        };
        Ok((uuid, row))
    }

    /// Reads a map column.
    pub async fn read_map(&self, col: &MapColumn) -> Result<MapSnapshot, Error> {
        let (row, mut values) = self
            .select_single(&col.db, &col.table, &[&col.column])
            .await?;
        let entries = values
            .remove(&col.column)
            .and_then(|d| d.as_string_map())
            .ok_or_else(|| Error::UnexpectedReply {
                reason: format!("{}.{} is not a string map", col.table, col.column),
            })?;
        Ok(MapSnapshot { row, entries })
    }

    /// Applies `changes` in one transaction, only if the map still equals
    /// `snapshot`; every other key is left untouched. A concurrent change of
    /// the map is [`Error::GuardFailed`]. Returns the map as written.
    pub async fn write_map_guarded(
        &self,
        col: &MapColumn,
        snapshot: &MapSnapshot,
        changes: &MapChanges,
    ) -> Result<MapSnapshot, Error> {
        if changes.is_empty() {
            return Ok(snapshot.clone());
        }
        let ops = guarded_map_ops(col, snapshot, changes);
        self.transact(&col.db, &ops).await?;
        Ok(snapshot.with(changes))
    }

    /// Sets `changes` with a guarded write, retried on [`Error::GuardFailed`]
    /// after a fresh read, up to `max_attempts` guarded writes in total; then
    /// [`Error::RetriesExhausted`]. Returns the map as written.
    ///
    /// The first attempt starts from the map this client last read or wrote
    /// through this method (one round trip); without one it reads first. A
    /// stale starting point is safe: it only fails the guard, which triggers
    /// the re-read.
    pub async fn update_map(
        &self,
        col: &MapColumn,
        changes: &MapChanges,
        max_attempts: u32,
    ) -> Result<MapSnapshot, Error> {
        let cached = self.snapshots.lock().ok().and_then(|c| c.get(col).cloned());
        let result = self
            .update_map_from(col, cached.as_ref(), changes, max_attempts)
            .await;
        if let Ok(mut cache) = self.snapshots.lock() {
            match &result {
                Ok(s) => cache.insert(col.clone(), s.clone()),
                // After any failure, trust nothing: the next call re-reads.
                Err(_) => cache.remove(col),
            };
        }
        result
    }

    /// Like [`Client::update_map`], but starts from `hint` (e.g. the
    /// snapshot the previous write returned), or reads first when `hint` is
    /// `None`. A map that already holds the values after a fresh read is not
    /// written. No client-side cache is used or updated.
    pub async fn update_map_from(
        &self,
        col: &MapColumn,
        hint: Option<&MapSnapshot>,
        changes: &MapChanges,
        max_attempts: u32,
    ) -> Result<MapSnapshot, Error> {
        let mut snapshot = match hint {
            Some(h) => h.clone(),
            None => self.read_map(col).await?,
        };
        for attempt in 1..=max_attempts {
            if snapshot.satisfies(changes) && (hint.is_none() || attempt > 1) {
                return Ok(snapshot);
            }
            match self.write_map_guarded(col, &snapshot, changes).await {
                Err(Error::GuardFailed { .. }) => {
                    tracing::debug!(table = %col.table, column = %col.column, attempt, "guarded map write lost a race; re-reading");
                    snapshot = self.read_map(col).await?;
                }
                other => return other,
            }
        }
        Err(Error::RetriesExhausted {
            attempts: max_attempts,
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn guarded_ops_touch_only_target_keys() {
        let snap = MapSnapshot {
            row: Uuid::nil(),
            entries: BTreeMap::from([("keep".into(), "1".into()), ("a".into(), "old".into())]),
        };
        let changes = MapChanges::from([("a".into(), Some("new".into())), ("gone".into(), None)]);
        let ops = guarded_map_ops(&MapColumn::ovs_other_config(), &snap, &changes);
        let got = crate::protocol::transact_params("Open_vSwitch", &ops);
        let u = json!([
            "_uuid",
            "==",
            ["uuid", "00000000-0000-0000-0000-000000000000"]
        ]);
        assert_eq!(
            got,
            json!(["Open_vSwitch",
                {"op":"wait","table":"Open_vSwitch","timeout":0,"where":[u],"columns":["other_config"],
                 "until":"==","rows":[{"other_config":["map",[["a","old"],["keep","1"]]]}]},
                {"op":"mutate","table":"Open_vSwitch","where":[u],"mutations":[
                    ["other_config","delete",["set",["a","gone"]]],
                    ["other_config","insert",["map",[["a","new"]]]]]}])
        );
        let after = snap.with(&changes);
        assert_eq!(after.entries.len(), 2);
        assert!(after.satisfies(&changes));
        assert!(!snap.satisfies(&changes));
    }
}
