//! Guarded, key-preserving updates of a string map column of a single-row
//! table (`Open_vSwitch . other_config`, `Open_vSwitch . external_ids`).
//!
//! Two layers:
//! - on [`Client`], single requests: [`Client::read_map`] (one `select`) and
//!   [`Client::write_map_guarded`] (one guarded transaction, no retry);
//! - [`MapWriter`], the retrying write: it owns a [`Client`] and the map of
//!   each column as it last read or wrote it (its *view*), so a write whose
//!   view is current costs one round trip.
//!
//! ## Why the guard looks like this
//! A `wait` compares whole columns, so the guard is the full map exactly as
//! read. The write then deletes the target keys and inserts their new values
//! with one `mutate`, so keys the caller did not name are never rewritten:
//! a concurrent writer of another key makes the guard fail (and the caller
//! retry on a fresh read) instead of having its key silently reverted, and
//! the target keys change together or not at all.
//!
//! ## One retry loop
//! [`MapWriter::update_map_from`] is the only place that retries a guarded
//! write, bounded by the caller's `max_attempts`. Callers (the agent's OVSDB
//! writer, the lease publication) make one call and do not loop around it:
//! stacked loops multiply their bounds, and the only retryable failure, a
//! lost guard, is known here, where the fresh read that resolves it happens.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::Error;
use crate::client::Client;
use crate::datum::Datum;
use crate::helpers::OPEN_VSWITCH;
use crate::protocol::{Condition, Mutation, Operation, Row};

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

/// The guard alone: a `wait` until the column equals the map as read.
fn guard_op(col: &MapColumn, snapshot: &MapSnapshot) -> Operation {
    Operation::Wait {
        table: col.table.clone(),
        timeout_ms: Some(0),
        conditions: vec![Condition::uuid(snapshot.row)],
        columns: vec![col.column.clone()],
        until: "==".into(),
        rows: vec![Row::from([(
            col.column.clone(),
            Datum::string_map(&snapshot.entries),
        )])],
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
        guard_op(col, snapshot),
        Operation::Mutate {
            table: col.table.clone(),
            conditions: vec![Condition::uuid(snapshot.row)],
            mutations,
        },
    ]
}

impl Client {
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
    /// the map is [`Error::GuardFailed`]. Returns the map as written. One
    /// attempt: retrying is [`MapWriter`]'s.
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

    /// Confirms that the map still equals `snapshot` with a transaction
    /// that holds only the guard (nothing is written); a changed map is
    /// [`Error::GuardFailed`].
    async fn confirm_map(&self, col: &MapColumn, snapshot: &MapSnapshot) -> Result<(), Error> {
        self.transact(&col.db, &[guard_op(col, snapshot)])
            .await
            .map(drop)
    }
}

/// The retrying, guarded multi-key write of map columns, with the map of
/// each column as this writer last read or wrote it (its view).
///
/// Clones share the view. Give one writer to the one owner of a set of keys
/// (the agent's OVSDB writer owns the identity keys of `other_config`): its
/// view is then current unless someone else changed the column, and a stale
/// view only fails the guard, which triggers the re-read.
#[derive(Debug, Clone)]
pub struct MapWriter {
    client: Client,
    views: Arc<Mutex<HashMap<MapColumn, MapSnapshot>>>,
}

impl MapWriter {
    /// A writer over `client`, with no view yet (the first write reads).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            views: Arc::default(),
        }
    }

    /// The connection this writer uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The column as this writer last read or wrote it, if it did.
    pub fn view(&self, col: &MapColumn) -> Option<MapSnapshot> {
        self.views.lock().ok().and_then(|v| v.get(col).cloned())
    }

    fn remember(&self, col: &MapColumn, result: &Result<MapSnapshot, Error>) {
        if let Ok(mut views) = self.views.lock() {
            match result {
                Ok(s) => views.insert(col.clone(), s.clone()),
                // After any failure, trust nothing: the next call re-reads.
                Err(_) => views.remove(col),
            };
        }
    }

    /// Reads a map column and makes it this writer's view.
    pub async fn read_map(&self, col: &MapColumn) -> Result<MapSnapshot, Error> {
        let result = self.client.read_map(col).await;
        self.remember(col, &result);
        result
    }

    /// Sets `changes` with a guarded write, retried on [`Error::GuardFailed`]
    /// after a fresh read, up to `max_attempts` guarded transactions in
    /// total; then [`Error::RetriesExhausted`]. Returns the map as written.
    ///
    /// The first attempt starts from this writer's view of the column (one
    /// round trip); without one it reads first. The result becomes the view.
    pub async fn update_map(
        &self,
        col: &MapColumn,
        changes: &MapChanges,
        max_attempts: u32,
    ) -> Result<MapSnapshot, Error> {
        let view = self.view(col);
        let result = self
            .update_map_from(col, view.as_ref(), changes, max_attempts)
            .await;
        self.remember(col, &result);
        result
    }

    /// Like [`MapWriter::update_map`], but starts from `hint` (e.g. the
    /// snapshot the previous write returned), or reads first when `hint` is
    /// `None`; the view is neither used nor updated. This is the crate's one
    /// retry loop (see the module doc).
    ///
    /// A map that already holds the values is not written: after a fresh
    /// read that is known at once; from a hint, which may be stale, a
    /// transaction holding only the guard confirms it (still one round trip).
    pub async fn update_map_from(
        &self,
        col: &MapColumn,
        hint: Option<&MapSnapshot>,
        changes: &MapChanges,
        max_attempts: u32,
    ) -> Result<MapSnapshot, Error> {
        let (mut snapshot, mut fresh) = match hint {
            Some(h) => (h.clone(), false),
            None => (self.client.read_map(col).await?, true),
        };
        for attempt in 1..=max_attempts {
            let outcome = match (snapshot.satisfies(changes), fresh) {
                (true, true) => return Ok(snapshot),
                (true, false) => self
                    .client
                    .confirm_map(col, &snapshot)
                    .await
                    .map(|()| snapshot.clone()),
                (false, _) => self.client.write_map_guarded(col, &snapshot, changes).await,
            };
            match outcome {
                Err(Error::GuardFailed { .. }) if attempt < max_attempts => {
                    tracing::debug!(table = %col.table, column = %col.column, attempt, "guarded map write lost a race; re-reading");
                    snapshot = self.client.read_map(col).await?;
                    fresh = true;
                }
                // The last attempt's lost guard is not worth a read nobody uses.
                Err(Error::GuardFailed { .. }) => break,
                other => return other,
            }
        }
        Err(Error::RetriesExhausted {
            attempts: max_attempts,
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
