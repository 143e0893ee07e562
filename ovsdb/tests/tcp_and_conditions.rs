//! TCP transport and `monitor_cond` conditions, against a real NB server.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use ovsdb::{
    Client, Condition, Datum, MonitorEvent, MonitorRequest, OVN_NORTHBOUND, Operation, Row,
    RowUpdate2,
};
use testbed::ovs::OvsdbServer;
use tokio::time::timeout;

fn switch(name: &str) -> Operation {
    Operation::Insert {
        table: "Logical_Switch".into(),
        row: Row::from([("name".to_string(), Datum::from(name))]),
        uuid_name: None,
    }
}

#[tokio::test]
async fn tcp_client_with_conditional_monitor() {
    let dir = tempfile::tempdir().unwrap();
    let nb = OvsdbServer::start_nb(dir.path()).unwrap();
    let tcp = nb.listen_tcp().unwrap();
    let c = Client::connect_str(&tcp).await.unwrap();
    assert!(!c.read_nb_ipsec().await.unwrap());

    let req = MonitorRequest {
        columns: vec!["name".into()],
        conditions: Some(vec![Condition::eq("name", "ls-a")]),
    };
    let tables = BTreeMap::from([("Logical_Switch".to_string(), req)]);
    let mut m = c.monitor_cond(OVN_NORTHBOUND, tables).await.unwrap();
    match timeout(Duration::from_secs(5), m.next()).await.unwrap() {
        Some(MonitorEvent::Initial(u)) => assert!(u.values().all(|t| t.is_empty()), "{u:?}"),
        other => panic!("unexpected {other:?}"),
    }

    let res = c
        .transact(OVN_NORTHBOUND, &[switch("ls-b"), switch("ls-a")])
        .await
        .unwrap();
    let a = res[1].uuid.unwrap();
    // Only the row matching the condition is reported.
    match timeout(Duration::from_secs(5), m.next()).await.unwrap() {
        Some(MonitorEvent::Update(u)) => {
            let rows = &u["Logical_Switch"];
            assert_eq!(rows.len(), 1, "{u:?}");
            assert!(matches!(&rows[&a], RowUpdate2::Insert(r) if r["name"] == Datum::from("ls-a")));
        }
        other => panic!("unexpected {other:?}"),
    }
    c.transact(
        OVN_NORTHBOUND,
        &[Operation::Delete {
            table: "Logical_Switch".into(),
            conditions: vec![Condition::uuid(a)],
        }],
    )
    .await
    .unwrap();
    match timeout(Duration::from_secs(5), m.next()).await.unwrap() {
        Some(MonitorEvent::Update(u)) => {
            assert!(matches!(u["Logical_Switch"][&a], RowUpdate2::Delete))
        }
        other => panic!("unexpected {other:?}"),
    }
    // NB_Global.ipsec over TCP too.
    c.set_nb_ipsec(true).await.unwrap();
    assert_eq!(
        nb.nbctl(&["get", "NB_Global", ".", "ipsec"])
            .unwrap()
            .trim(),
        "true"
    );
}
