//! OVSDB method payloads (RFC 7047 §4.1, §5.2; `monitor_cond` from
//! ovsdb-server(7)): transaction operations and results, monitor requests
//! and table updates.
//!
//! Pure: everything converts to and from `serde_json::Value`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::Error;
use crate::datum::{Atom, Datum};

/// A row: column name → value.
pub type Row = BTreeMap<String, Datum>;

/// `[column, function, value]` in a `where` clause.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// Column name (`_uuid` for the row's UUID).
    pub column: String,
    /// `==`, `!=`, `<`, `<=`, `>`, `>=`, `includes`, `excludes`.
    pub function: String,
    /// The value compared with.
    pub value: Datum,
}

impl Condition {
    /// `column == value`.
    pub fn eq(column: impl Into<String>, value: impl Into<Datum>) -> Self {
        Self {
            column: column.into(),
            function: "==".into(),
            value: value.into(),
        }
    }

    /// `_uuid == uuid`: selects exactly one row.
    pub fn uuid(uuid: Uuid) -> Self {
        Self::eq("_uuid", Datum::Atom(Atom::Uuid(uuid)))
    }

    fn to_json(&self) -> Value {
        json!([self.column, self.function, self.value.to_json()])
    }
}

/// `[column, mutator, value]` in a `mutate` operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    /// Column name.
    pub column: String,
    /// `+=`, `-=`, `*=`, `/=`, `%=`, `insert`, `delete`.
    pub mutator: String,
    /// The operand.
    pub value: Datum,
}

impl Mutation {
    /// `insert` into a set or map column (map keys already present are kept).
    pub fn insert(column: impl Into<String>, value: Datum) -> Self {
        Self {
            column: column.into(),
            mutator: "insert".into(),
            value,
        }
    }

    /// `delete` from a set or map column; for a map, a set operand deletes
    /// keys whatever their value, a map operand deletes matching pairs only.
    pub fn delete(column: impl Into<String>, value: Datum) -> Self {
        Self {
            column: column.into(),
            mutator: "delete".into(),
            value,
        }
    }

    fn to_json(&self) -> Value {
        json!([self.column, self.mutator, self.value.to_json()])
    }
}

/// One operation of a `transact` call (RFC 7047 §5.2).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Operation {
    /// Reads rows.
    Select {
        /// Table name.
        table: String,
        /// Row filter; empty = every row.
        conditions: Vec<Condition>,
        /// Columns to return; `None` = all.
        columns: Option<Vec<String>>,
    },
    /// Inserts a row.
    Insert {
        /// Table name.
        table: String,
        /// Column values; unset columns get their defaults.
        row: Row,
        /// Name later operations may reference as `named-uuid`.
        uuid_name: Option<String>,
    },
    /// Sets columns of the matching rows.
    Update {
        /// Table name.
        table: String,
        /// Row filter.
        conditions: Vec<Condition>,
        /// New column values.
        row: Row,
    },
    /// Mutates columns of the matching rows in place.
    Mutate {
        /// Table name.
        table: String,
        /// Row filter.
        conditions: Vec<Condition>,
        /// Mutations, applied in order.
        mutations: Vec<Mutation>,
    },
    /// Deletes the matching rows.
    Delete {
        /// Table name.
        table: String,
        /// Row filter.
        conditions: Vec<Condition>,
    },
    /// Aborts the transaction unless the matching rows' `columns` equal
    /// (`until: "=="`) or differ from (`"!="`) `rows`.
    Wait {
        /// Table name.
        table: String,
        /// Milliseconds to wait; `Some(0)` fails at once, which is what an
        /// optimistic guard wants.
        timeout_ms: Option<u64>,
        /// Row filter.
        conditions: Vec<Condition>,
        /// The compared columns.
        columns: Vec<String>,
        /// `==` or `!=`.
        until: String,
        /// The expected rows (only `columns` are compared).
        rows: Vec<Row>,
    },
    /// Adds a comment to the server's log of this transaction.
    Comment {
        /// Free text.
        comment: String,
    },
}

fn conditions_json(c: &[Condition]) -> Value {
    Value::Array(c.iter().map(Condition::to_json).collect())
}

fn row_json(row: &Row) -> Value {
    Value::Object(row.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
}

impl Operation {
    /// `columns` of every row of `table`.
    pub fn select(table: &str, columns: &[&str]) -> Self {
        Operation::Select {
            table: table.into(),
            conditions: Vec::new(),
            columns: Some(columns.iter().map(|c| (*c).to_owned()).collect()),
        }
    }

    /// The operation's `op` name.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Select { .. } => "select",
            Operation::Insert { .. } => "insert",
            Operation::Update { .. } => "update",
            Operation::Mutate { .. } => "mutate",
            Operation::Delete { .. } => "delete",
            Operation::Wait { .. } => "wait",
            Operation::Comment { .. } => "comment",
        }
    }

    /// The JSON form.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("op".into(), json!(self.name()));
        match self {
            Operation::Select {
                table,
                conditions,
                columns,
            } => {
                m.insert("table".into(), json!(table));
                m.insert("where".into(), conditions_json(conditions));
                if let Some(cols) = columns {
                    m.insert("columns".into(), json!(cols));
                }
            }
            Operation::Insert {
                table,
                row,
                uuid_name,
            } => {
                m.insert("table".into(), json!(table));
                m.insert("row".into(), row_json(row));
                if let Some(name) = uuid_name {
                    m.insert("uuid-name".into(), json!(name));
                }
            }
            Operation::Update {
                table,
                conditions,
                row,
            } => {
                m.insert("table".into(), json!(table));
                m.insert("where".into(), conditions_json(conditions));
                m.insert("row".into(), row_json(row));
            }
            Operation::Mutate {
                table,
                conditions,
                mutations,
            } => {
                m.insert("table".into(), json!(table));
                m.insert("where".into(), conditions_json(conditions));
                m.insert(
                    "mutations".into(),
                    Value::Array(mutations.iter().map(Mutation::to_json).collect()),
                );
            }
            Operation::Delete { table, conditions } => {
                m.insert("table".into(), json!(table));
                m.insert("where".into(), conditions_json(conditions));
            }
            Operation::Wait {
                table,
                timeout_ms,
                conditions,
                columns,
                until,
                rows,
            } => {
                m.insert("table".into(), json!(table));
                if let Some(t) = timeout_ms {
                    m.insert("timeout".into(), json!(t));
                }
                m.insert("where".into(), conditions_json(conditions));
                m.insert("columns".into(), json!(columns));
                m.insert("until".into(), json!(until));
                m.insert(
                    "rows".into(),
                    Value::Array(rows.iter().map(row_json).collect()),
                );
            }
            Operation::Comment { comment } => {
                m.insert("comment".into(), json!(comment));
            }
        }
        Value::Object(m)
    }
}

/// The `params` of a `transact` request.
pub fn transact_params(db: &str, ops: &[Operation]) -> Value {
    let mut v = Vec::with_capacity(ops.len() + 1);
    v.push(json!(db));
    v.extend(ops.iter().map(Operation::to_json));
    Value::Array(v)
}

/// The successful result of one operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperationResult {
    /// Rows touched (update, mutate, delete).
    pub count: Option<u64>,
    /// The new row's UUID (insert).
    pub uuid: Option<Uuid>,
    /// Selected rows (select).
    pub rows: Option<Vec<Row>>,
}

/// Parses a `transact` result array against the operations sent.
///
/// RFC 7047 §4.1.3: a failed operation carries `error`/`details`, operations
/// after it are `null`, and a commit failure is reported as one extra element
/// past the operations. Each becomes a typed error; a `wait` that failed is
/// [`Error::GuardFailed`] so callers can retry an optimistic update.
pub fn parse_transact_result(
    ops: &[Operation],
    result: &Value,
) -> Result<Vec<OperationResult>, Error> {
    let Value::Array(items) = result else {
        return Err(unexpected("transact result is not an array"));
    };
    let mut out = Vec::with_capacity(ops.len());
    for (index, item) in items.iter().enumerate() {
        if let Some(err) = item.get("error").filter(|e| !e.is_null()) {
            let error = err.as_str().unwrap_or_default().to_string();
            let details = item
                .get("details")
                .and_then(Value::as_str)
                .map(str::to_string);
            return Err(match ops.get(index) {
                Some(Operation::Wait { table, columns, .. }) if error == "timed out" => {
                    Error::GuardFailed {
                        table: table.clone(),
                        columns: columns.clone(),
                    }
                }
                Some(op) => Error::Transaction {
                    index,
                    op: op.name().to_string(),
                    error,
                    details,
                },
                None => Error::Transaction {
                    index,
                    op: "commit".to_string(),
                    error,
                    details,
                },
            });
        }
        if index >= ops.len() {
            continue;
        }
        let mut r = OperationResult {
            count: item.get("count").and_then(Value::as_u64),
            ..Default::default()
        };
        if let Some(u) = item.get("uuid") {
            match Atom::from_json(u)? {
                Atom::Uuid(u) => r.uuid = Some(u),
                _ => return Err(unexpected("insert result uuid is not a uuid")),
            }
        }
        if let Some(rows) = item.get("rows") {
            let Value::Array(rows) = rows else {
                return Err(unexpected("select rows is not an array"));
            };
            r.rows = Some(rows.iter().map(parse_row).collect::<Result<_, _>>()?);
        }
        out.push(r);
    }
    if out.len() < ops.len() {
        return Err(unexpected(&format!(
            "transact returned {} results for {} operations",
            out.len(),
            ops.len()
        )));
    }
    Ok(out)
}

/// Parses a JSON object of column values.
pub fn parse_row(v: &Value) -> Result<Row, Error> {
    let Value::Object(obj) = v else {
        return Err(unexpected("row is not an object"));
    };
    obj.iter()
        .map(|(k, v)| Ok((k.clone(), Datum::from_json(v)?)))
        .collect()
}

/// What to monitor in one table (`<monitor-request>`, plus the `where` of
/// `monitor_cond`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MonitorRequest {
    /// Columns to report; empty = all.
    pub columns: Vec<String>,
    /// Only for `monitor_cond`: rows to report; `None` = all.
    pub conditions: Option<Vec<Condition>>,
}

impl MonitorRequest {
    /// Monitors `columns` of every row.
    pub fn columns<S: Into<String>>(columns: impl IntoIterator<Item = S>) -> Self {
        Self {
            columns: columns.into_iter().map(Into::into).collect(),
            conditions: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.columns.is_empty() {
            m.insert("columns".into(), json!(self.columns));
        }
        if let Some(c) = &self.conditions {
            m.insert("where".into(), conditions_json(c));
        }
        Value::Object(m)
    }
}

/// The `params` of a `monitor`/`monitor_cond` request.
pub fn monitor_params(
    db: &str,
    monitor_id: &Value,
    tables: &BTreeMap<String, MonitorRequest>,
) -> Value {
    let reqs: Map<String, Value> = tables
        .iter()
        .map(|(t, r)| (t.clone(), r.to_json()))
        .collect();
    json!([db, monitor_id, reqs])
}

/// A row change reported by `monitor` (`<row-update>`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowUpdate {
    /// The row before (absent for inserts and the initial contents).
    pub old: Option<Row>,
    /// The row after (absent for deletes).
    pub new: Option<Row>,
}

/// A row change reported by `monitor_cond` (`<row-update2>`).
#[derive(Debug, Clone, PartialEq)]
pub enum RowUpdate2 {
    /// The row as it was when the monitor started.
    Initial(Row),
    /// A new row.
    Insert(Row),
    /// The row was deleted.
    Delete,
    /// Changed columns. Scalar columns carry the new value; set and map
    /// columns carry the difference (ovsdb-server(7) "update2").
    Modify(Row),
}

/// `table → row uuid → change`.
pub type TableUpdates<U> = BTreeMap<String, BTreeMap<Uuid, U>>;

fn parse_table_updates<U>(
    v: &Value,
    row: impl Fn(&Value) -> Result<U, Error>,
) -> Result<TableUpdates<U>, Error> {
    let Value::Object(tables) = v else {
        return Err(unexpected("table-updates is not an object"));
    };
    let mut out = BTreeMap::new();
    for (table, rows) in tables {
        let Value::Object(rows) = rows else {
            return Err(unexpected("table-update is not an object"));
        };
        let mut t = BTreeMap::new();
        for (uuid, u) in rows {
            let uuid = Uuid::parse_str(uuid)
                .map_err(|e| unexpected(&format!("row uuid {uuid:?}: {e}")))?;
            t.insert(uuid, row(u)?);
        }
        out.insert(table.clone(), t);
    }
    Ok(out)
}

/// Parses `<table-updates>` (the `monitor` reply and `update` notifications).
pub fn parse_table_updates1(v: &Value) -> Result<TableUpdates<RowUpdate>, Error> {
    parse_table_updates(v, |u| {
        let get = |k| u.get(k).map(parse_row).transpose();
        Ok(RowUpdate {
            old: get("old")?,
            new: get("new")?,
        })
    })
}

/// Parses `<table-updates2>` (the `monitor_cond` reply and `update2`
/// notifications).
pub fn parse_table_updates2(v: &Value) -> Result<TableUpdates<RowUpdate2>, Error> {
    parse_table_updates(v, |u| {
        let Value::Object(o) = u else {
            return Err(unexpected("row-update2 is not an object"));
        };
        match o.iter().next() {
            Some((k, row)) if o.len() == 1 => match k.as_str() {
                "initial" => Ok(RowUpdate2::Initial(parse_row(row)?)),
                "insert" => Ok(RowUpdate2::Insert(parse_row(row)?)),
                "modify" => Ok(RowUpdate2::Modify(parse_row(row)?)),
                "delete" => Ok(RowUpdate2::Delete),
                other => Err(unexpected(&format!("unknown row-update2 kind {other:?}"))),
            },
            _ => Err(unexpected("row-update2 must have exactly one member")),
        }
    })
}

fn unexpected(reason: &str) -> Error {
    Error::UnexpectedReply {
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_serialize_as_rfc7047() {
        let u = Uuid::nil();
        let ops = vec![
            Operation::Select {
                table: "T".into(),
                conditions: vec![],
                columns: Some(vec!["c".into()]),
            },
            Operation::Insert {
                table: "T".into(),
                row: Row::from([("name".to_string(), Datum::from("x"))]),
                uuid_name: Some("r".into()),
            },
            Operation::Update {
                table: "T".into(),
                conditions: vec![Condition::uuid(u)],
                row: Row::new(),
            },
            Operation::Mutate {
                table: "T".into(),
                conditions: vec![],
                mutations: vec![Mutation::delete("m", Datum::string_set(["k"]))],
            },
            Operation::Delete {
                table: "T".into(),
                conditions: vec![Condition::eq("n", 1i64)],
            },
            Operation::Wait {
                table: "T".into(),
                timeout_ms: Some(0),
                conditions: vec![],
                columns: vec!["m".into()],
                until: "==".into(),
                rows: vec![Row::from([(
                    "m".to_string(),
                    Datum::string_map([("a", "b")]),
                )])],
            },
            Operation::Comment {
                comment: "hi".into(),
            },
        ];
        let got = transact_params("DB", &ops);
        let want = json!(["DB",
            {"op":"select","table":"T","where":[],"columns":["c"]},
            {"op":"insert","table":"T","row":{"name":"x"},"uuid-name":"r"},
            {"op":"update","table":"T","where":[["_uuid","==",["uuid","00000000-0000-0000-0000-000000000000"]]],"row":{}},
            {"op":"mutate","table":"T","where":[],"mutations":[["m","delete",["set",["k"]]]]},
            {"op":"delete","table":"T","where":[["n","==",1]]},
            {"op":"wait","table":"T","timeout":0,"where":[],"columns":["m"],"until":"==","rows":[{"m":["map",[["a","b"]]]}]},
            {"op":"comment","comment":"hi"}]);
        assert_eq!(got, want);
    }

    fn two_ops() -> Vec<Operation> {
        vec![
            Operation::Wait {
                table: "T".into(),
                timeout_ms: Some(0),
                conditions: vec![],
                columns: vec!["m".into()],
                until: "==".into(),
                rows: vec![],
            },
            Operation::Select {
                table: "T".into(),
                conditions: vec![],
                columns: None,
            },
        ]
    }

    #[test]
    fn per_operation_errors_are_typed() {
        let ops = two_ops();
        let r = parse_transact_result(&ops, &json!([{"error":"timed out"}, null]));
        assert!(matches!(r, Err(Error::GuardFailed { ref table, .. }) if table == "T"));
        let r = parse_transact_result(
            &ops,
            &json!([{}, {"error":"constraint violation","details":"d"}]),
        );
        assert!(
            matches!(r, Err(Error::Transaction { index: 1, ref op, ref details, .. })
            if op == "select" && details.as_deref() == Some("d"))
        );
        let r = parse_transact_result(
            &ops,
            &json!([{}, {"rows":[]}, {"error":"referential integrity violation"}]),
        );
        assert!(matches!(r, Err(Error::Transaction { index: 2, ref op, .. }) if op == "commit"));
        assert!(matches!(
            parse_transact_result(&ops, &json!([{}])),
            Err(Error::UnexpectedReply { .. })
        ));
        assert!(matches!(
            parse_transact_result(&ops, &json!({})),
            Err(Error::UnexpectedReply { .. })
        ));
    }

    #[test]
    fn results_parse() {
        let ops = two_ops();
        let r = parse_transact_result(&ops, &json!([{}, {"rows":[{"m":["map",[]],"_uuid":["uuid","00000000-0000-0000-0000-000000000001"]}]}])).unwrap();
        let rows = r[1].rows.as_ref().unwrap();
        assert_eq!(rows[0]["m"], Datum::Map(vec![]));
    }

    #[test]
    fn updates_parse() {
        let u = "00000000-0000-0000-0000-000000000001";
        let v1 = json!({"SB_Global": {u: {"new": {"ipsec": true}, "old": {"ipsec": false}}}});
        let t = parse_table_updates1(&v1).unwrap();
        let ru = &t["SB_Global"][&Uuid::parse_str(u).unwrap()];
        assert_eq!(ru.new.as_ref().unwrap()["ipsec"].as_bool(), Some(true));
        let v2 = json!({"SB_Global": {u: {"modify": {"ipsec": true}}}, "X": {u: {"delete": null}}});
        let t = parse_table_updates2(&v2).unwrap();
        assert!(matches!(t["X"].values().next(), Some(RowUpdate2::Delete)));
        assert!(parse_table_updates2(&json!({"T": {u: {"bogus": {}}}})).is_err());
        assert!(parse_table_updates2(&json!({"T": {"not-a-uuid": {"delete": null}}})).is_err());
    }

    #[test]
    fn monitor_params_shape() {
        let mut t = BTreeMap::new();
        t.insert("SB_Global".to_string(), MonitorRequest::columns(["ipsec"]));
        assert_eq!(
            monitor_params("OVN_Southbound", &json!("m1"), &t),
            json!(["OVN_Southbound", "m1", {"SB_Global": {"columns": ["ipsec"]}}])
        );
    }
}
