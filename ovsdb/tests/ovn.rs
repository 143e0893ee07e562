//! Against real OVN NB and SB servers with a real `ovn-northd` between them.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use ovsdb::{Client, Error};
use testbed::ovs::OvnCentral;

#[tokio::test]
async fn nb_ipsec_switch_reaches_sb() {
    let dir = tempfile::tempdir().unwrap();
    let central = OvnCentral::start(dir.path()).unwrap();
    let nb = Client::connect_str(&central.nb.address()).await.unwrap();
    let sb = Client::connect_str(&central.sb.address()).await.unwrap();

    assert!(!nb.read_nb_ipsec().await.unwrap());
    // northd creates SB_Global shortly after start; the wait covers that too.
    sb.wait_sb_ipsec(false, Duration::from_secs(10))
        .await
        .unwrap();

    let t = Instant::now();
    nb.set_nb_ipsec(true).await.unwrap();
    assert!(nb.read_nb_ipsec().await.unwrap());
    sb.wait_sb_ipsec(true, Duration::from_secs(10))
        .await
        .unwrap();
    eprintln!("NB ipsec=true visible in SB after {:?}", t.elapsed());
    assert!(sb.read_sb_ipsec().await.unwrap());
    assert_eq!(
        central
            .sb
            .sbctl(&["get", "SB_Global", ".", "ipsec"])
            .unwrap()
            .trim(),
        "true"
    );

    nb.set_nb_ipsec(false).await.unwrap();
    sb.wait_sb_ipsec(false, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!sb.read_sb_ipsec().await.unwrap());
}

#[tokio::test]
async fn wait_times_out_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let central = OvnCentral::start(dir.path()).unwrap();
    let sb = Client::connect_str(&central.sb.address()).await.unwrap();
    let err = sb
        .wait_sb_ipsec(true, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert_eq!(err.metric_label(), "timeout");
}
