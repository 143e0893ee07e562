//! `ssl:` remotes against the real `ovsdb-server` serving OVN's
//! northbound database over SSL, with a PKI made by OVS's own `ovs-pki`
//! (what Kube-OVN's `ENABLE_SSL` uses): a client with the PKI's key,
//! certificate and CA reads and writes; a server certificate that does not
//! chain to the client's CA, a client certificate the server's CA did not
//! sign, a missing file and an `ssl:` remote without files are each
//! refused with a reason that names the remote or the file.

// Test helpers outside #[test] fns may unwrap too: a panic is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ovsdb::{Address, Client, Config, Error, TlsFiles};
use testbed::ovs::{OvsPki, OvsdbServer, SslFiles};

fn client_files(f: &SslFiles) -> TlsFiles {
    TlsFiles {
        private_key: f.private_key.clone(),
        certificate: f.certificate.clone(),
        ca_cert: f.ca_cert.clone(),
    }
}

async fn connect(address: &str, tls: Option<TlsFiles>) -> Result<Client, Error> {
    Client::connect(
        Address::parse(address),
        Config {
            tls,
            ..Config::default()
        },
    )
    .await
}

#[tokio::test]
async fn ssl_remotes_are_served_and_refused_with_their_reasons() {
    testbed::require_program("ovs-pki").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pki = OvsPki::create(&dir.path().join("ovn")).unwrap();
    let server = pki.issue("ovsdb").unwrap();
    let controller = pki.issue("controller").unwrap();
    let mut nb = OvsdbServer::start_nb(dir.path()).unwrap();
    let remote = nb.serve_ssl(server).unwrap();
    println!("NB over SSL at {remote}");

    // The PKI's own client: reads and writes, as over TCP.
    let c = connect(&remote, Some(client_files(&controller)))
        .await
        .unwrap();
    assert!(!c.read_nb_ipsec().await.unwrap());
    c.set_nb_ipsec(true).await.unwrap();
    assert!(c.read_nb_ipsec().await.unwrap());

    // A client that trusts another CA: the server's certificate does not
    // chain to it.
    let other = OvsPki::create(&dir.path().join("other")).unwrap();
    let stranger = other.issue("stranger").unwrap();
    let mut wrong_ca = client_files(&controller);
    wrong_ca.ca_cert = other.ca_cert();
    let e = connect(&remote, Some(wrong_ca)).await.unwrap_err();
    println!("server certificate from another CA: {e}");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains(&remote), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");

    // A client certificate the server's CA did not sign: the server
    // refuses the handshake (seen at the first request or at connect).
    let mut foreign_client = client_files(&stranger);
    foreign_client.ca_cert = pki.ca_cert();
    match connect(&remote, Some(foreign_client)).await {
        Err(e) => {
            println!("client certificate from another CA: {e}");
            assert!(e.to_string().contains(&remote), "{e}");
        }
        Ok(c) => {
            let e = c.read_nb_ipsec().await.unwrap_err();
            println!("client certificate from another CA, at the first request: {e}");
            assert!(e.is_connection(), "{e:?}");
        }
    }

    // A missing file is named; no connection is tried without files.
    let mut missing = client_files(&controller);
    missing.private_key = dir.path().join("no-such-key.pem");
    let e = connect(&remote, Some(missing)).await.unwrap_err();
    println!("missing key file: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains("no-such-key.pem"), "{e}");
    let e = connect(&remote, None).await.unwrap_err();
    println!("no files: {e}");
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
    assert!(e.to_string().contains(&remote), "{e}");
}
