//! `ovsdb-server` killed under a live monitor: the stream reports the loss as
//! a typed event, the client reconnects to the restarted server on the same
//! socket path and re-establishes the monitor.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use ovsdb::{
    Client, Config, Datum, Error, MapChanges, MapColumn, MapWriter, MonitorEvent, MonitorRequest,
    OPEN_VSWITCH, RowUpdate2, TableUpdates,
};
use testbed::ovs::OvsdbServer;
use tokio::time::timeout;

fn other_config_of<U>(
    u: &TableUpdates<U>,
    get: impl Fn(&U) -> Option<&Datum>,
) -> Option<std::collections::BTreeMap<String, String>> {
    u.get(OPEN_VSWITCH)?
        .values()
        .find_map(|r| get(r)?.as_string_map())
}

#[tokio::test]
async fn monitor_survives_server_crash_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let cfg = Config {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
        ..Config::default()
    };
    let c = Client::connect(ovsdb::Address::parse(&s.address()), cfg)
        .await
        .unwrap();
    let tables = BTreeMap::from([(
        OPEN_VSWITCH.to_string(),
        MonitorRequest::columns(["other_config"]),
    )]);
    let mut v1 = c.monitor(OPEN_VSWITCH, tables.clone()).await.unwrap();
    let mut v2 = c.monitor_cond(OPEN_VSWITCH, tables).await.unwrap();
    let next = |d| Duration::from_secs(d);

    assert!(matches!(
        timeout(next(5), v1.next()).await.unwrap(),
        Some(MonitorEvent::Initial(_))
    ));
    assert!(matches!(
        timeout(next(5), v2.next()).await.unwrap(),
        Some(MonitorEvent::Initial(_))
    ));

    let col = MapColumn::ovs_other_config();
    MapWriter::new(c.clone())
        .update_map(&col, &MapChanges::from([("k".into(), Some("1".into()))]), 3)
        .await
        .unwrap();
    match timeout(next(5), v1.next()).await.unwrap() {
        Some(MonitorEvent::Update(u)) => {
            let m = other_config_of(&u, |r| r.new.as_ref()?.get("other_config")).unwrap();
            assert_eq!(m["k"], "1");
        }
        other => panic!("unexpected {other:?}"),
    }
    match timeout(next(5), v2.next()).await.unwrap() {
        Some(MonitorEvent::Update(u)) => {
            // update2 carries the map difference: the inserted pair.
            let m = other_config_of(&u, |r| match r {
                RowUpdate2::Modify(row) => row.get("other_config"),
                _ => None,
            })
            .unwrap();
            assert_eq!(m["k"], "1");
        }
        other => panic!("unexpected {other:?}"),
    }

    s.kill().unwrap();
    for stream in [&mut v1 as &mut dyn StreamLike, &mut v2] {
        match stream.next_event().await {
            Some(e) => assert!(e.is_connection(), "{e:?}"),
            None => panic!("stream ended instead of reporting the disconnect"),
        }
    }
    // While down, requests fail fast with a connection error, not a hang.
    let err = timeout(next(5), c.read_map(&col))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_connection(), "{err:?}");

    // A change made while the client is away shows up in the resync.
    s.restart().unwrap();
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:while_down=yes"])
        .unwrap();
    for stream in [&mut v1 as &mut dyn StreamLike, &mut v2] {
        let keys = stream.next_initial_keys().await;
        assert!(keys.contains(&"k".to_string()), "{keys:?}");
    }
    // And the connection serves requests again.
    let m = timeout(next(5), c.read_map(&col)).await.unwrap().unwrap();
    assert_eq!(m.entries["while_down"], "yes");
}

/// Lets the test treat both stream kinds alike.
trait StreamLike {
    fn next_event(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Error>> + '_>>;
    fn next_initial_keys(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>> + '_>>;
}

macro_rules! stream_like {
    ($u:ty, $get:expr) => {
        impl StreamLike for ovsdb::MonitorStream<$u> {
            fn next_event(
                &mut self,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<Error>> + '_>> {
                Box::pin(async move {
                    match timeout(Duration::from_secs(5), self.next())
                        .await
                        .unwrap()?
                    {
                        MonitorEvent::Disconnected(e) => Some(e),
                        other => panic!("expected Disconnected, got {other:?}"),
                    }
                })
            }
            fn next_initial_keys(
                &mut self,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<String>> + '_>> {
                Box::pin(async move {
                    loop {
                        match timeout(Duration::from_secs(10), self.next()).await.unwrap() {
                            Some(MonitorEvent::Initial(u)) => {
                                return other_config_of(&u, $get)
                                    .unwrap_or_default()
                                    .into_keys()
                                    .collect();
                            }
                            Some(MonitorEvent::Update(_)) => {}
                            other => panic!("expected Initial, got {other:?}"),
                        }
                    }
                })
            }
        }
    };
}
stream_like!(ovsdb::RowUpdate, |r: &ovsdb::RowUpdate| r
    .new
    .as_ref()?
    .get("other_config"));
stream_like!(RowUpdate2, |r: &RowUpdate2| match r {
    RowUpdate2::Initial(row) => row.get("other_config"),
    _ => None,
});
