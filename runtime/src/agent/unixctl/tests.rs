use super::*;
use actors::clock::TokioClock;
use actors::ports::LeaseSummary;
use kube_ovn_ipsec_api::datapath::{
    DatapathReport, Encapsulation, MtuReport, PeerHealth, PeerState, SaCounters,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::time::Timestamp;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

fn board() -> StatusBoard {
    let b = StatusBoard::new(Arc::new(TokioClock::starting_at(
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )));
    b.set_active(
        3,
        Sha256Digest::of(b"cert"),
        Timestamp::from_unix(1_800_086_400).unwrap(),
    );
    b.set_lease(Some(LeaseSummary {
        lease_id: "lease-1".into(),
        mark: 0x1234_5678,
        reqid: 4242,
        allocated: false,
    }));
    b.set_protection(true, None);
    b.set_datapath(Some(DatapathReport {
        peers: vec![PeerHealth {
            outbound: SaCounters {
                sas: 1,
                bytes: 9_000,
                packets: 90,
            },
            inbound: SaCounters {
                sas: 1,
                bytes: 100,
                packets: 1,
            },
            enable_window_millis: Some(1250),
            ..kube_ovn_ipsec_api::test_util::peer_health(PeerState::InboundMissing, false)
        }],
        mtu: Some(MtuReport::check(
            1500,
            1442,
            Encapsulation::Geneve,
            false,
            false,
        )),
    }));
    b
}

#[tokio::test]
async fn show_names_the_state_the_cause_and_the_numbers_and_no_key_material() {
    let text = render_show(&board().diagnostics(), 7);
    for want in [
        "phase: Degraded  reason: InboundMissing",
        "generation 3",
        "certificate sha256 ",
        "lease: lease-1  mark 0x12345678 (305419896)  reqid 4242",
        "guards: armed, read back 0.0 s ago",
        "datapath: UNHEALTHY",
        "set the tunnel (Pod) MTU to 1408",
        "192.0.2.2 (chassis node-2): InboundMissing [unhealthy]",
        "out: 1 SA(s), 90 packets, 9000 bytes",
        "enable window: 1.25 s",
        "ESP (IP proto 50) or UDP 4500",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
    assert!(!text.contains("BEGIN"), "{text}");
}

async fn call(path: &Path, request: &str) -> Value {
    let mut s = UnixStream::connect(path).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed without a reply");
        buf.extend_from_slice(&chunk[..n]);
        if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
            return v;
        }
    }
}

#[tokio::test]
async fn answers_json_rpc_split_across_writes_and_rejects_what_it_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.ctl");
    let (stop, rx) = watch::channel(false);
    let board = board();
    let serve = bind(&path, board.clone(), RefreshSignal::default(), rx).unwrap();
    let server = tokio::spawn(serve);
    let mode = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o750);

    let v = call(&path, r#"{"id":1,"method":"ipsec/show","params":[]}"#).await;
    assert_eq!(v["id"], 1);
    assert!(v["error"].is_null());
    assert!(v["result"].as_str().unwrap().contains("InboundMissing"));

    let v = call(&path, r#"{"id":"x","method":"ipsec/flush","params":[]}"#).await;
    assert!(v["result"].is_null());
    assert!(v["error"].as_str().unwrap().contains("not a valid command"));
    let v = call(&path, r#"{"id":2,"method":"ipsec/show","params":["all"]}"#).await;
    assert!(v["error"].as_str().unwrap().contains("takes no arguments"));
    let v = call(&path, r#"{"id":3,"method":"list-commands","params":[]}"#).await;
    assert!(v["result"].as_str().unwrap().contains("ipsec/refresh"));

    // One request written in two pieces.
    let mut s = UnixStream::connect(&path).await.unwrap();
    s.write_all(br#"{"id":4,"method":"ipsec/"#).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.write_all(br#"show","params":[]}"#).await.unwrap();
    let mut buf = vec![0u8; 65536];
    let mut got = Vec::new();
    while serde_json::from_slice::<Value>(&got).is_err() {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(serde_json::from_slice::<Value>(&got).unwrap()["id"], 4);

    // Garbage closes the connection, the server keeps serving.
    let mut s = UnixStream::connect(&path).await.unwrap();
    s.write_all(b"}{ not json").await.unwrap();
    assert_eq!(s.read(&mut buf).await.unwrap(), 0);
    let v = call(&path, r#"{"id":5,"method":"ipsec/show","params":[]}"#).await;
    assert_eq!(v["id"], 5);

    // The real ovs-appctl, where it is installed.
    if let Ok(out) = tokio::process::Command::new("ovs-appctl")
        .arg("-t")
        .arg(&path)
        .arg("ipsec/show")
        .output()
        .await
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(text.contains("192.0.2.2 (chassis node-2)"), "{text}");
        let bad = tokio::process::Command::new("ovs-appctl")
            .arg("-t")
            .arg(&path)
            .arg("ipsec/nope")
            .output()
            .await
            .unwrap();
        assert_eq!(bad.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&bad.stderr).contains("not a valid command"));
    }

    stop.send(true).unwrap();
    server.await.unwrap();
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn refuses_to_replace_a_file_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.ctl");
    std::fs::write(&path, b"keep me").unwrap();
    let (_stop, rx) = watch::channel(false);
    let Err(e) = bind(&path, board(), RefreshSignal::default(), rx) else {
        panic!("bound over a regular file");
    };
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

#[tokio::test]
async fn a_live_socket_is_not_taken_over_a_stale_one_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.ctl");
    let (stop, rx) = watch::channel(false);
    let server = tokio::spawn(bind(&path, board(), RefreshSignal::default(), rx.clone()).unwrap());
    let Err(e) = bind(&path, board(), RefreshSignal::default(), rx) else {
        panic!("took over a live socket");
    };
    assert!(e.to_string().contains("running process"), "{e}");
    stop.send(true).unwrap();
    server.await.unwrap();
    // A socket file nobody serves (a SIGKILLed agent's) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let (_stop, rx) = watch::channel(false);
    assert!(bind(&path, board(), RefreshSignal::default(), rx).is_ok());
}
