use super::*;

const STATUSALL: &str = "\
Status of IKE charon daemon (strongSwan 5.9.8, Linux 6.1.0, x86_64):
Connections:
ovn-chassb-0-out-1:  %any...10.77.0.2  IKEv2
Routed Connections:
ovn-chassb-0-out-1{1}:  ROUTED, TRANSPORT, reqid 1
Security Associations (1 up, 0 connecting):
ovn-chassb-0-out-1[1]: ESTABLISHED 2 seconds ago, 10.77.0.1[CN=chass-a, O=kube-ovn]...10.77.0.2[CN=chass-b, O=kube-ovn]
ovn-chassb-0-out-1[1]: IKEv2 SPIs: 5b1d0c1a2f3e4d5c_i* 8a9b0c1d2e3f4a5b_r, public key reauthentication in 2 hours
ovn-chassb-0-out-1[1]: IKE proposal: AES_GCM_16_256/PRF_HMAC_SHA2_256/MODP_2048
     other[2]: CONNECTING, 10.77.0.1[%any]...10.77.0.9[%any]
";

#[test]
fn parses_ike_sas_with_spis() {
    let sas = parse_status(STATUSALL).ike_sas;
    assert_eq!(sas.len(), 2, "{sas:?}");
    assert_eq!(
        sas[0],
        IkeSa {
            conn: "ovn-chassb-0-out-1".into(),
            unique_id: 1,
            state: "ESTABLISHED".into(),
            spi_i: Some("5b1d0c1a2f3e4d5c".into()),
            spi_r: Some("8a9b0c1d2e3f4a5b".into()),
        }
    );
    assert_eq!(sas[1].conn, "other");
    assert_eq!(sas[1].state, "CONNECTING");
    assert_eq!(sas[1].spi_i, None);
}

#[test]
fn parses_status_and_children() {
    let text = "\
Security Associations (1 up, 0 connecting):
ovn-chassb-0-out-1[1]: ESTABLISHED 2 seconds ago, 10.77.0.1[CN=chass-a, O=kube-ovn]...10.77.0.2[CN=chass-b]
ovn-chassb-0-out-1[1]: IKEv2 SPIs: 5b1d_i* 8a9b_r, public key reauthentication in 2 hours
ovn-chassb-0-out-1{1}:  ROUTED, TRANSPORT, reqid 77
ovn-chassb-0-in-1{2}:  INSTALLED, TRANSPORT, reqid 77, ESP SPIs: c1_i c2_o
";
    let h = parse_status(text);
    assert_eq!(h.ike_sas.len(), 1);
    assert_eq!(h.ike_sas[0].state, "ESTABLISHED");
    assert_eq!(h.child_sas.len(), 2);
    assert_eq!(h.child_sas[0].reqid, Some(77));
    assert_eq!(h.child_sas[1].state, "INSTALLED");
}

#[test]
fn parses_listcerts() {
    let text = "\
List of X.509 End Entity Certificates

  subject:  \"CN=chass-a, O=kube-ovn\"
  issuer:   \"CN=test CA, O=kube-ovn\"
  validity:  not before Jan 01 00:00:00 2025, ok
  serial:    0A:1b:2c
  pubkey:    RSA 2048 bits, has private key
";
    let c = parse_listcerts(text);
    assert_eq!(
        c,
        [LoadedCert {
            subject: "CN=chass-a, O=kube-ovn".into(),
            serial: "0a:1b:2c".into(),
            has_private_key: true
        }]
    );
}

#[test]
fn garbage_is_skipped_not_misread() {
    let h = parse_status("x[y]: ESTABLISHED\nz{1}: lowercase\n: \n[]: A\n\u{0}{: B");
    assert!(h.ike_sas.is_empty(), "{h:?}");
    assert!(h.child_sas.is_empty(), "{h:?}");
}

#[test]
fn monitor_connection_names_split_into_tunnel_direction_and_version() {
    use super::{ConnDirection, MonitorConn};
    let c = MonitorConn::parse("ovn-chass-0-in-12").unwrap();
    assert_eq!(
        (c.tunnel, c.direction, c.version),
        ("ovn-chass-0", ConnDirection::In, 12)
    );
    let c = MonitorConn::parse("ovn-chass-0-out-1").unwrap();
    assert_eq!((c.tunnel, c.direction), ("ovn-chass-0", ConnDirection::Out));
    let c = MonitorConn::parse("gre-a-3").unwrap();
    assert_eq!((c.tunnel, c.direction), ("gre-a", ConnDirection::Both));
    for not_ours in ["ovn-b-0-in-x", "ovn-b-0-in-", "-in-1", "nodash", "-1"] {
        assert_eq!(MonitorConn::parse(not_ours), None, "{not_ours}");
    }
}
