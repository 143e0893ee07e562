//! A fake server on a unix socket that misbehaves: the client must return
//! typed errors, never panic or hang; and it answers the server's `echo`.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use ovsdb::{Address, Client, Config, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::timeout;

/// Accepts one connection, reads the first request, then runs `script`.
async fn fake<F, Fut>(script: F) -> (tempfile::TempDir, PathBuf)
where
    F: FnOnce(UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        script(sock).await;
    });
    (dir, path)
}

async fn read_some(sock: &mut UnixStream) -> String {
    let mut buf = vec![0u8; 4096];
    let n = sock.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn cfg(max: usize) -> Config {
    // Long backoff: these tests look at the first failure only.
    Config {
        max_message: max,
        backoff_initial: Duration::from_secs(60),
        ..Config::default()
    }
}

#[tokio::test]
async fn junk_bytes_are_malformed() {
    let (_d, path) = fake(|mut s| async move {
        read_some(&mut s).await;
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let c = Client::connect(Address::Unix(path), cfg(1 << 20))
        .await
        .unwrap();
    let err = timeout(Duration::from_secs(5), c.echo())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{err:?}");
    assert_eq!(err.metric_label(), "malformed");
    // Later requests fail fast while the client waits to reconnect.
    let err = timeout(Duration::from_secs(5), c.echo())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::NotConnected { .. }), "{err:?}");
}

#[tokio::test]
async fn invalid_json_and_wrong_shapes_are_malformed() {
    for junk in [&b"{\"id\":0,\"result\":tru}"[..], b"[1,2,3]", b"{\"id\":0}"] {
        let junk = junk.to_vec();
        let (_d, path) = fake(move |mut s| async move {
            read_some(&mut s).await;
            s.write_all(&junk).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
        .await;
        let c = Client::connect(Address::Unix(path), cfg(1 << 20))
            .await
            .unwrap();
        let err = timeout(Duration::from_secs(5), c.echo())
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, Error::Malformed { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn oversized_reply_is_rejected() {
    let (_d, path) = fake(|mut s| async move {
        read_some(&mut s).await;
        // A reply that never ends within the cap (2 MiB of string content).
        s.write_all(b"{\"id\":0,\"result\":\"").await.unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..32 {
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let c = Client::connect(Address::Unix(path), cfg(1 << 20))
        .await
        .unwrap();
    let err = timeout(Duration::from_secs(5), c.echo())
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, Error::Oversized { limit } if limit == 1 << 20),
        "{err:?}"
    );
}

#[tokio::test]
async fn hang_up_mid_message_is_connection_lost() {
    let (_d, path) = fake(|mut s| async move {
        read_some(&mut s).await;
        s.write_all(b"{\"id\":0,\"res").await.unwrap();
    })
    .await;
    let c = Client::connect(Address::Unix(path), cfg(1 << 20))
        .await
        .unwrap();
    let err = timeout(Duration::from_secs(5), c.echo())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err:?}");
}

#[tokio::test]
async fn answers_server_echo() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (_d, path) = fake(|mut s| async move {
        s.write_all(br#"{"id":"echo","method":"echo","params":["hi"]}"#)
            .await
            .unwrap();
        let mut got = String::new();
        while !got.contains("\"echo\"") {
            got.push_str(&read_some(&mut s).await);
        }
        let _ = tx.send(got);
    })
    .await;
    let _c = Client::connect(Address::Unix(path), cfg(1 << 20))
        .await
        .unwrap();
    let got = timeout(Duration::from_secs(5), rx).await.unwrap().unwrap();
    let v: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"id":"echo","result":["hi"],"error":null})
    );
}

#[tokio::test]
async fn connect_to_nothing_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Client::connect(
        Address::Unix(dir.path().join("none.sock")),
        Config::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn silent_server_is_detected_by_the_inactivity_probe() {
    let (_d, path) = fake(|mut s| async move {
        // Reads everything (so writes never block) and never answers.
        let mut buf = vec![0u8; 4096];
        while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    let config = Config {
        inactivity_probe: Some(Duration::from_millis(100)),
        ..cfg(1 << 20)
    };
    let c = Client::connect(Address::Unix(path), config).await.unwrap();
    let err = timeout(Duration::from_secs(5), c.echo())
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, Error::ConnectionLost { ref reason, .. } if reason.contains("probe")),
        "{err:?}"
    );
}
