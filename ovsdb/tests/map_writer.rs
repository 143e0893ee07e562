//! What a [`MapWriter`] sends, seen by a recording proxy between the client
//! and a real `ovsdb-server`: one transaction per write while its view is
//! current, a read only after a lost guard, and no write for a change that
//! is already there.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ovsdb::framing::{DEFAULT_MAX_MESSAGE, Framer};
use ovsdb::{Client, MapChanges, MapColumn, MapWriter};
use testbed::ovs::OvsdbServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// The operation names of every `transact` the client sent, in order.
type Sent = Arc<Mutex<Vec<Vec<String>>>>;

/// Listens on `dir/proxy.sock`, forwards one connection to `server`, and
/// records the client's transactions.
fn proxy(dir: &Path, server: PathBuf) -> (String, Sent) {
    let path = dir.join("proxy.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let sent = Sent::default();
    let log = sent.clone();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let upstream = UnixStream::connect(server).await.unwrap();
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = upstream.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
        let mut framer = Framer::new(DEFAULT_MAX_MESSAGE);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from_client.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            for msg in framer.feed(&buf[..n]).unwrap() {
                if msg["method"] == "transact" {
                    let ops = msg["params"].as_array().unwrap()[1..]
                        .iter()
                        .map(|op| op["op"].as_str().unwrap().to_string())
                        .collect();
                    log.lock().unwrap().push(ops);
                }
            }
            to_server.write_all(&buf[..n]).await.unwrap();
        }
    });
    (format!("unix:{}", path.display()), sent)
}

/// The transactions sent since the last call.
fn take(sent: &Sent) -> Vec<Vec<String>> {
    std::mem::take(&mut *sent.lock().unwrap())
}

fn ops(names: &[&[&str]]) -> Vec<Vec<String>> {
    names
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect()
}

fn generation(n: u32) -> MapChanges {
    ["private_key", "certificate", "ca_cert"]
        .iter()
        .map(|k| (k.to_string(), Some(format!("/k/{n}/{k}.pem"))))
        .collect()
}

#[tokio::test]
async fn one_transaction_while_the_view_is_current() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:keep=me"])
        .unwrap();
    let (address, sent) = proxy(dir.path(), s.socket_path().to_path_buf());
    let w = MapWriter::new(Client::connect_str(&address).await.unwrap());
    let col = MapColumn::ovs_other_config();

    // No view yet: read, then the guarded write.
    w.update_map(&col, &generation(1), 3).await.unwrap();
    assert_eq!(take(&sent), ops(&[&["select"], &["wait", "mutate"]]));

    // The view is the map as written: one transaction, no read.
    let written = w.update_map(&col, &generation(2), 3).await.unwrap();
    assert_eq!(take(&sent), ops(&[&["wait", "mutate"]]));
    assert_eq!(w.view(&col), Some(written.clone()));

    // Already there: the guard alone confirms it, nothing is written.
    assert_eq!(
        w.update_map(&col, &generation(2), 3).await.unwrap(),
        written
    );
    assert_eq!(take(&sent), ops(&[&["wait"]]));

    // Another writer made the view stale: the guard fails, and only then
    // the writer reads and writes again, keeping the other key.
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:keep=too"])
        .unwrap();
    let done = w.update_map(&col, &generation(3), 3).await.unwrap();
    assert_eq!(
        take(&sent),
        ops(&[&["wait", "mutate"], &["select"], &["wait", "mutate"]])
    );
    assert_eq!(done.entries["keep"], "too");
    assert_eq!(done.entries["certificate"], "/k/3/certificate.pem");
    assert_eq!(w.client().read_map(&col).await.unwrap(), done);
}

#[tokio::test]
async fn a_failed_write_forgets_the_view() {
    let dir = tempfile::tempdir().unwrap();
    let s = OvsdbServer::start_vswitch(dir.path()).unwrap();
    let (address, sent) = proxy(dir.path(), s.socket_path().to_path_buf());
    let w = MapWriter::new(Client::connect_str(&address).await.unwrap());
    let col = MapColumn::ovs_other_config();
    w.read_map(&col).await.unwrap();
    assert!(w.view(&col).is_some());

    // One attempt against a changed map: exhausted, without a wasted read.
    s.vsctl(&["set", "Open_vSwitch", ".", "other_config:other=x"])
        .unwrap();
    take(&sent);
    let err = w.update_map(&col, &generation(1), 1).await.unwrap_err();
    assert!(
        matches!(err, ovsdb::Error::RetriesExhausted { attempts: 1 }),
        "{err:?}"
    );
    assert_eq!(take(&sent), ops(&[&["wait", "mutate"]]));
    assert_eq!(w.view(&col), None);

    // The next write starts from a fresh read.
    w.update_map(&col, &generation(1), 1).await.unwrap();
    assert_eq!(take(&sent), ops(&[&["select"], &["wait", "mutate"]]));
}
