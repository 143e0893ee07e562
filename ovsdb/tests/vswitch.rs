//! Against a real `ovsdb-server` with the Open_vSwitch schema: every
//! operation kind, per-operation errors, and the guarded map helpers.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use ovsdb::{
    Client, Condition, Datum, Error, MapChanges, MapColumn, MapWriter, Mutation, OPEN_VSWITCH,
    Operation, Row,
};
use testbed::ovs::OvsdbServer;

fn changes(pairs: &[(&str, Option<&str>)]) -> MapChanges {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect()
}

fn vsctl_get(s: &OvsdbServer, key: &str) -> String {
    s.vsctl(&["--if-exists", "get", "Open_vSwitch", ".", key])
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test]
async fn guarded_activation_sets_keys_together_and_keeps_others() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    s.vsctl(&[
        "set",
        "Open_vSwitch",
        ".",
        "other_config:keep=me",
        "other_config:private_key=/k/0/key.pem",
    ])
    .unwrap();
    let c = Client::connect_str(&s.address()).await.unwrap();
    let w = MapWriter::new(c.clone());
    let col = MapColumn::ovs_other_config();

    let before = c.read_map(&col).await.unwrap();
    assert_eq!(before.entries["keep"], "me");
    let gen1 = changes(&[
        ("private_key", Some("/k/1/key.pem")),
        ("certificate", Some("/k/1/cert.pem")),
        ("ca_cert", Some("/k/1/ca.pem")),
    ]);
    let written = c.write_map_guarded(&col, &before, &gen1).await.unwrap();
    let after = c.read_map(&col).await.unwrap();
    assert_eq!(written, after);
    assert_eq!(after.entries.len(), 4);
    assert_eq!(
        vsctl_get(&s, "other_config:certificate"),
        "\"/k/1/cert.pem\""
    );
    assert_eq!(vsctl_get(&s, "other_config:keep"), "me");

    // Removing a key is a change too; a no-op update is not written.
    let out = w
        .update_map(&col, &changes(&[("ca_cert", None)]), 3)
        .await
        .unwrap();
    assert!(!out.entries.contains_key("ca_cert"));
    assert_eq!(
        w.update_map(&col, &changes(&[("ca_cert", None)]), 1)
            .await
            .unwrap(),
        out
    );
}

#[tokio::test]
async fn concurrent_writer_fails_the_guard_and_retry_keeps_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let c = Client::connect_str(&s.address()).await.unwrap();
    let w = MapWriter::new(c.clone());
    let col = MapColumn::ovs_other_config();
    let gen1 = changes(&[
        ("private_key", Some("/k/1/key.pem")),
        ("certificate", Some("/k/1/cert.pem")),
    ]);

    let stale = c.read_map(&col).await.unwrap();
    // Another writer changes an unrelated key between our read and write.
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:unrelated=x"])
        .unwrap();
    let err = c.write_map_guarded(&col, &stale, &gen1).await.unwrap_err();
    assert!(
        matches!(err, Error::GuardFailed { ref table, .. } if table == "Open_vSwitch"),
        "{err:?}"
    );
    assert_eq!(err.metric_label(), "guard_failed");
    // Nothing of ours was committed.
    assert_eq!(vsctl_get(&s, "other_config:private_key"), "");

    // The retrying wrapper, starting from the stale snapshot, re-reads and wins.
    let done = w
        .update_map_from(&col, Some(&stale), &gen1, 3)
        .await
        .unwrap();
    assert_eq!(done.entries["unrelated"], "x");
    assert_eq!(vsctl_get(&s, "other_config:unrelated"), "x");
    assert_eq!(
        vsctl_get(&s, "other_config:private_key"),
        "\"/k/1/key.pem\""
    );

    // update_map starts from the map it last wrote; another writer makes
    // that stale, the guard catches it and the retry keeps the other key.
    w.update_map(&col, &changes(&[("certificate", Some("/k/2/cert.pem"))]), 3)
        .await
        .unwrap();
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:unrelated=z"])
        .unwrap();
    let done = w
        .update_map(&col, &changes(&[("certificate", Some("/k/3/cert.pem"))]), 3)
        .await
        .unwrap();
    assert_eq!(done.entries["unrelated"], "z");
    assert_eq!(vsctl_get(&s, "other_config:unrelated"), "z");
    assert_eq!(
        vsctl_get(&s, "other_config:certificate"),
        "\"/k/3/cert.pem\""
    );

    // A writer that always wins exhausts the retries with a distinct error.
    let stale = c.read_map(&col).await.unwrap();
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:unrelated=y"])
        .unwrap();
    let err = w
        .update_map_from(&col, Some(&stale), &changes(&[("a", Some("b"))]), 1)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RetriesExhausted { attempts: 1 }),
        "{err:?}"
    );
}

#[tokio::test]
async fn second_client_race_on_external_ids() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let a = Client::connect_str(&s.address()).await.unwrap();
    let b = Client::connect_str(&s.address()).await.unwrap();
    let col = MapColumn::ovs_external_ids();
    let snap_a = a.read_map(&col).await.unwrap();
    MapWriter::new(b)
        .update_map(&col, &changes(&[("system-id", Some("chassis-1"))]), 3)
        .await
        .unwrap();
    let lease = changes(&[
        ("ovn-ipsec-protection-mark", Some("0x1234")),
        ("ovn-ipsec-protection-reqid", Some("7")),
    ]);
    assert!(matches!(
        a.write_map_guarded(&col, &snap_a, &lease).await,
        Err(Error::GuardFailed { .. })
    ));
    let done = MapWriter::new(a.clone())
        .update_map_from(&col, Some(&snap_a), &lease, 3)
        .await
        .unwrap();
    assert_eq!(done.entries["system-id"], "chassis-1");
    assert_eq!(a.read_map(&col).await.unwrap(), done);
}

#[tokio::test]
async fn every_operation_kind_and_typed_failures() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let c = Client::connect_str(&s.address()).await.unwrap();
    assert!(
        c.list_dbs()
            .await
            .unwrap()
            .contains(&"Open_vSwitch".to_string())
    );
    c.echo().await.unwrap();

    // insert a Bridge and reference it from the root row, then update, mutate,
    // wait, select and delete it.
    let (root, _) = c
        .select_single(OPEN_VSWITCH, OPEN_VSWITCH, &[])
        .await
        .unwrap();
    let name = |n: &str| Row::from([("name".to_string(), Datum::from(n))]);
    let res = c
        .transact(
            OPEN_VSWITCH,
            &[
                Operation::Comment {
                    comment: "ovsdb crate test".into(),
                },
                Operation::Insert {
                    table: "Bridge".into(),
                    row: name("br-test"),
                    uuid_name: Some("br".into()),
                },
                Operation::Mutate {
                    table: OPEN_VSWITCH.into(),
                    conditions: vec![Condition::uuid(root)],
                    mutations: vec![Mutation::insert(
                        "bridges",
                        Datum::Set(vec![ovsdb::Atom::NamedUuid("br".into())]),
                    )],
                },
            ],
        )
        .await
        .unwrap();
    let br = res[1].uuid.unwrap();
    assert_eq!(res[2].count, Some(1));
    let by_name = vec![Condition::eq("name", "br-test")];
    let res = c
        .transact(
            OPEN_VSWITCH,
            &[
                Operation::Update {
                    table: "Bridge".into(),
                    conditions: by_name.clone(),
                    row: Row::from([("datapath_type".to_string(), Datum::from("netdev"))]),
                },
                Operation::Wait {
                    table: "Bridge".into(),
                    timeout_ms: Some(0),
                    conditions: by_name.clone(),
                    columns: vec!["datapath_type".into()],
                    until: "==".into(),
                    rows: vec![Row::from([(
                        "datapath_type".to_string(),
                        Datum::from("netdev"),
                    )])],
                },
                Operation::Select {
                    table: "Bridge".into(),
                    conditions: by_name.clone(),
                    columns: Some(vec!["_uuid".into(), "datapath_type".into()]),
                },
            ],
        )
        .await
        .unwrap();
    assert_eq!(res[0].count, Some(1));
    let rows = res[2].rows.as_ref().unwrap();
    assert_eq!(rows[0]["datapath_type"], Datum::from("netdev"));
    assert_eq!(rows[0]["_uuid"], Datum::Atom(ovsdb::Atom::Uuid(br)));
    assert_eq!(
        s.vsctl(&["get", "Bridge", "br-test", "datapath_type"])
            .unwrap()
            .trim(),
        "netdev"
    );

    // A per-operation error surfaces with its error and details; nothing commits.
    let err = c
        .transact(
            OPEN_VSWITCH,
            &[
                Operation::Update {
                    table: "Bridge".into(),
                    conditions: by_name.clone(),
                    row: Row::from([("external_ids".to_string(), Datum::string_map([("a", "b")]))]),
                },
                Operation::Update {
                    table: "Bridge".into(),
                    conditions: vec![],
                    row: Row::from([("no_such_column".to_string(), Datum::from(1i64))]),
                },
            ],
        )
        .await
        .unwrap_err();
    match &err {
        Error::Transaction {
            index: 1,
            op,
            error,
            details,
        } => {
            assert_eq!(op, "update");
            assert!(!error.is_empty());
            assert!(
                details
                    .as_deref()
                    .unwrap_or_default()
                    .contains("no_such_column"),
                "{err}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!err.is_connection());
    assert_eq!(
        s.vsctl(&["get", "Bridge", "br-test", "external_ids"])
            .unwrap()
            .trim(),
        "{}"
    );

    // Deleting a referenced row without removing the reference fails at
    // commit (referential integrity), reported past the last operation.
    let err = c
        .transact(
            OPEN_VSWITCH,
            &[Operation::Delete {
                table: "Bridge".into(),
                conditions: by_name.clone(),
            }],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Transaction { index: 1, ref op, .. } if op == "commit"),
        "{err:?}"
    );
    // Removing the reference garbage-collects the (non-root) Bridge row;
    // deleting it explicitly in the same transaction is also fine.
    c.transact(
        OPEN_VSWITCH,
        &[
            Operation::Mutate {
                table: OPEN_VSWITCH.into(),
                conditions: vec![Condition::uuid(root)],
                mutations: vec![Mutation::delete(
                    "bridges",
                    Datum::Atom(ovsdb::Atom::Uuid(br)),
                )],
            },
            Operation::Delete {
                table: "Bridge".into(),
                conditions: by_name,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(s.vsctl(&["list-br"]).unwrap().trim(), "");

    // A JSON-RPC level error (unknown database) is distinct.
    let err = c
        .transact(
            "NoSuchDb",
            &[Operation::Comment {
                comment: "x".into(),
            }],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Rpc { .. }), "{err:?}");

    // Helpers refuse a table without exactly one row.
    let err = c
        .select_single(OPEN_VSWITCH, "Bridge", &["name"])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RowCount { found: 0, .. }), "{err:?}");
}

/// Regression: a runtime that was blocked for longer than the inactivity
/// probe must not make the client declare a healthy server lost.
#[tokio::test(flavor = "current_thread")]
async fn blocked_runtime_is_not_a_dead_server() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let config = ovsdb::Config {
        inactivity_probe: Some(std::time::Duration::from_millis(50)),
        ..ovsdb::Config::default()
    };
    let c = Client::connect(ovsdb::Address::parse(&s.address()), config)
        .await
        .unwrap();
    c.echo().await.unwrap();
    for _ in 0..3 {
        // Deliberately blocks this (only) runtime thread.
        std::thread::sleep(std::time::Duration::from_millis(300));
        c.read_map(&MapColumn::ovs_other_config()).await.unwrap();
    }
    // Idle but polled: probes are answered and the connection stays up.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    c.echo().await.unwrap();
}
