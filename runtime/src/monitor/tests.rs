use super::*;

/// Captured from Debian's ovs-monitor-ipsec (OVS 3.1) in `tests/ike_monitor.rs`.
const SHOW: &str = include_str!("tunnels_show.txt");

#[test]
fn parses_captured_tunnels_show() {
    let t = parse_tunnels_show(SHOW);
    assert_eq!(t.len(), 1, "{t:#?}");
    let t = &t[0];
    assert_eq!(t.state, "CONFIGURED");
    assert_eq!(t.remote_ip, "10.77.0.2");
    assert_eq!(t.remote_name.as_deref(), Some("chass-b"));
    assert!(
        t.local_cert
            .as_ref()
            .is_some_and(|p| p.ends_with("chass-a.pem")),
        "{t:?}"
    );
    assert!(
        t.ca_cert.as_ref().is_some_and(|p| p.ends_with("ca.pem")),
        "{t:?}"
    );
    assert!(t.custom_options.contains("'reqid': '1955260584'"), "{t:?}");
    assert_eq!(t.policies.len(), 4);
    assert!(!t.policies.is_empty(), "{t:?}");
}

#[test]
fn psk_is_never_kept() {
    let text = "Interface name: t0 v1 (CONFIGURED)\n  Remote IP:      1.2.3.4\n  PSK:            hunter2\n";
    let t = parse_tunnels_show(text);
    assert!(!format!("{t:?}").contains("hunter2"));
}

fn digest(b: &[u8]) -> Sha256Digest {
    Sha256Digest::of(b)
}

fn active() -> ActiveIdentity {
    ActiveIdentity {
        certificate: "/keys/2/cert.pem".into(),
        ca_cert: "/keys/2/ca.pem".into(),
        certificate_digest: digest(b"leaf"),
        trust_digest: digest(b"trust"),
        certificate_serial: "01:02".into(),
        ca_serials: vec!["0a".into()],
    }
}

fn tunnel(cert: &str, ca: &str) -> TunnelShow {
    TunnelShow {
        name: "ovn-b-0".into(),
        state: "CONFIGURED".into(),
        remote_name: Some("b".into()),
        local_cert: Some(cert.into()),
        ca_cert: Some(ca.into()),
        ..Default::default()
    }
}

fn loaded(serial: &str, key: bool) -> LoadedCert {
    LoadedCert {
        subject: "CN=a".into(),
        serial: serial.into(),
        has_private_key: key,
    }
}

#[test]
fn acknowledgement_needs_paths_digests_and_daemon_view() {
    let files = |p: &Path, bundle: bool| -> Result<Sha256Digest, String> {
        match (p.to_str(), bundle) {
            (Some("/keys/2/cert.pem"), false) => Ok(digest(b"leaf")),
            (Some("/keys/2/ca.pem"), true) => Ok(digest(b"trust")),
            _ => Ok(digest(b"old")),
        }
    };
    let a = active();
    let good = [tunnel("/keys/2/cert.pem", "/keys/2/ca.pem")];
    let ack = acknowledge(
        &a,
        &good,
        &[loaded("01:02", true)],
        &[loaded("0a", false)],
        &files,
    );
    assert!(ack.configuration_applied, "{ack:?}");
    assert_eq!(ack.acknowledged_trust_digest, Some(a.trust_digest));

    let old = [tunnel("/keys/1/cert.pem", "/keys/2/ca.pem")];
    let ack = acknowledge(
        &a,
        &old,
        &[loaded("01:02", true)],
        &[loaded("0a", false)],
        &files,
    );
    assert!(!ack.configuration_applied);
    assert_eq!(ack.acknowledged_trust_digest, None);

    let ack = acknowledge(
        &a,
        &good,
        &[loaded("01:02", false)],
        &[loaded("0a", false)],
        &files,
    );
    assert!(!ack.configuration_applied, "key not loaded");
    let ack = acknowledge(&a, &good, &[loaded("01:02", true)], &[], &files);
    assert!(!ack.configuration_applied, "CA not loaded");

    // Same path, different content: the digest catches it.
    let changed = |_: &Path, _: bool| -> Result<Sha256Digest, String> { Ok(digest(b"other")) };
    let ack = acknowledge(
        &a,
        &good,
        &[loaded("01:02", true)],
        &[loaded("0a", false)],
        &changed,
    );
    assert_eq!(ack.mismatches.len(), 2, "{ack:?}");
}

#[test]
fn acknowledgement_needs_every_ca_of_the_bundle_loaded() {
    // A rotation's bundle [old, new]: strongSwan loading only the first CA
    // of a one-file bundle leaves the new one out, and that is no
    // acknowledgement.
    let a = ActiveIdentity {
        ca_serials: vec!["0a".into(), "0b".into()],
        ..active()
    };
    let files = |_: &Path, bundle: bool| -> Result<Sha256Digest, String> {
        Ok(if bundle {
            digest(b"trust")
        } else {
            digest(b"leaf")
        })
    };
    let good = [tunnel("/keys/2/cert.pem", "/keys/2/ca.pem")];
    let leaf = [loaded("01:02", true)];
    for (cas, applied) in [
        (vec![loaded("0a", false)], false),
        (vec![loaded("0b", false)], false),
        (vec![loaded("0a", false), loaded("0a", false)], false),
        (vec![loaded("0b", false), loaded("0a", false)], true),
        (
            vec![
                loaded("0a", false),
                loaded("0a", false),
                loaded("0b", false),
            ],
            true,
        ),
    ] {
        let ack = acknowledge(&a, &good, &leaf, &cas, &files);
        assert_eq!(ack.configuration_applied, applied, "{cas:?}: {ack:?}");
        // Also with no tunnel yet: the CA check alone decides.
        let ack = acknowledge(&a, &[], &[], &cas, &files);
        assert_eq!(ack.configuration_applied, applied, "{cas:?}: {ack:?}");
    }
    let ack = acknowledge(&a, &good, &leaf, &[loaded("0a", false)], &files);
    assert_eq!(
        ack.mismatches,
        vec!["IKE daemon has not loaded CA serial 0b".to_string()]
    );
}

#[test]
fn serials_compare_without_der_sign_padding() {
    // x509-parser's raw serial of 0xbf83cbee is 00:bf:83:cb:ee; strongSwan
    // prints bf:83:cb:ee. Both must meet in one spelling.
    assert_eq!(normalize_serial("00:bf:83:cb:ee"), "bf:83:cb:ee");
    assert_eq!(normalize_serial("BF:83:CB:EE"), "bf:83:cb:ee");
    assert_eq!(normalize_serial("00"), "00");
    assert_eq!(normalize_serial("0a:1b"), "0a:1b");
}
