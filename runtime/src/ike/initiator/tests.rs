use super::*;

use kube_ovn_ipsec_api::strongswan::parse_status;

/// A node with two peers, as charon 5.9 showed it in the lab's three-node
/// run: both traps routed, only the first peer's outbound CHILD_SA up (the
/// trap manager picked its trap for every ACQUIRE of the shared reqid).
const TWO_PEERS_ONE_DARK: &str = "\
Routed Connections:
ovn-bbbbbb-0-out-1{1}:  ROUTED, TRANSPORT, reqid 4242
ovn-bbbbbb-0-in-1{2}:  ROUTED, TRANSPORT, reqid 4242
ovn-cccccc-0-out-1{3}:  ROUTED, TRANSPORT, reqid 4242
ovn-cccccc-0-in-1{4}:  ROUTED, TRANSPORT, reqid 4242
Security Associations (2 up, 0 connecting):
ovn-bbbbbb-0-out-1[1]: ESTABLISHED 9 seconds ago, 10.77.0.1[CN=a]...10.77.0.2[CN=b]
ovn-bbbbbb-0-out-1{5}:  INSTALLED, TRANSPORT, reqid 4242, ESP SPIs: c1_i c2_o
ovn-bbbbbb-0-out-1{5}:   AES_GCM_16_256, 840 bytes_i, 840 bytes_o, rekeying in 44 minutes
ovn-bbbbbb-0-out-1{5}:   10.77.0.1/32[udp] === 10.77.0.2/32[udp/6081]
ovn-cccccc-0-in-1[2]: ESTABLISHED 8 seconds ago, 10.77.0.1[CN=a]...10.77.0.3[CN=c]
ovn-cccccc-0-in-1{6}:  INSTALLED, TRANSPORT, reqid 4242, ESP SPIs: c3_i c4_o
";

fn t0() -> Instant {
    Instant::now()
}

#[test]
fn outbound_connections_are_named_out_and_a_version() {
    assert!(is_outbound_conn("ovn-bbbbbb-0-out-1"));
    assert!(is_outbound_conn("vxlan_sys-out-12"));
    for other in [
        "ovn-bbbbbb-0-in-1",
        "ovn-bbbbbb-0-1",
        "-out-1",
        "ovn-bbbbbb-0-out-",
        "ovn-bbbbbb-0-out-1a",
        "prevent_unencrypted_geneve",
    ] {
        assert!(!is_outbound_conn(other), "{other}");
    }
}

#[test]
fn a_tunnel_is_its_connection_name_without_direction_and_version() {
    assert_eq!(tunnel_of("ovn-bbbbbb-0-out-12"), "ovn-bbbbbb-0");
    assert_eq!(tunnel_of("ovn-bbbbbb-0-in-1"), "ovn-bbbbbb-0");
    assert_eq!(tunnel_of("gre_sys-3"), "gre_sys");
    assert_eq!(
        tunnel_of("prevent_unencrypted_geneve"),
        "prevent_unencrypted_geneve"
    );
}

#[test]
fn only_the_dark_outbound_connection_is_stalled() {
    let status = parse_status(TWO_PEERS_ONE_DARK);
    assert_eq!(stalled_outbound(&status), vec!["ovn-cccccc-0-out-1"]);
}

#[test]
fn a_connecting_ike_sa_or_a_child_in_any_state_is_not_stalled() {
    let connecting = format!(
        "{TWO_PEERS_ONE_DARK}ovn-cccccc-0-out-1[3]: CONNECTING, 10.77.0.1[%any]...10.77.0.3[%any]\n"
    );
    assert!(stalled_outbound(&parse_status(&connecting)).is_empty());
    // The tunnel's merged configuration shows the IKE_SA under `-in-`.
    let merged = format!(
        "{TWO_PEERS_ONE_DARK}ovn-cccccc-0-in-1[3]: CONNECTING, 10.77.0.1[%any]...10.77.0.3[%any]\n"
    );
    assert!(stalled_outbound(&parse_status(&merged)).is_empty());
    // Another tunnel's connecting IKE_SA does not hold this one back.
    let other = format!(
        "{TWO_PEERS_ONE_DARK}ovn-bbbbbb-0-in-2[3]: CONNECTING, 10.77.0.1[%any]...10.77.0.2[%any]\n"
    );
    assert_eq!(
        stalled_outbound(&parse_status(&other)),
        vec!["ovn-cccccc-0-out-1"]
    );
    let rekeying =
        format!("{TWO_PEERS_ONE_DARK}ovn-cccccc-0-out-1{{7}}:  REKEYING, TRANSPORT, reqid 4242\n");
    assert!(stalled_outbound(&parse_status(&rekeying)).is_empty());
    // The previous version's outbound CHILD_SA still carries the tunnel
    // (a replacement in progress, or kept by the monitor).
    let older =
        format!("{TWO_PEERS_ONE_DARK}ovn-cccccc-0-out-0{{7}}:  INSTALLED, TRANSPORT, reqid 4242\n");
    assert!(stalled_outbound(&parse_status(&older)).is_empty());
    // ...but not its inbound one.
    let inbound =
        format!("{TWO_PEERS_ONE_DARK}ovn-cccccc-0-in-0{{7}}:  INSTALLED, TRANSPORT, reqid 4242\n");
    assert_eq!(stalled_outbound(&parse_status(&inbound)).len(), 1);
}

#[test]
fn initiates_after_the_grace_then_backs_off() {
    let status = parse_status(TWO_PEERS_ONE_DARK);
    let start = t0();
    let mut i = Initiator::new();
    assert!(i.plan(&status, start).is_empty(), "first sight waits");
    assert_eq!(i.look_again_within(), Some(Initiator::GRACE));
    let at = |s: u64| start + Duration::from_millis(s);
    assert!(i.plan(&status, at(500)).is_empty(), "inside the grace");
    assert_eq!(i.plan(&status, at(1000)), vec!["ovn-cccccc-0-out-1"]);
    assert_eq!(
        i.look_again_within(),
        Some(Initiator::GRACE),
        "a young stall is looked at every second"
    );
    // Retries after 2 s, 4 s, 8 s, ... then every 60 s.
    let mut last = 1000;
    for wait in [2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000] {
        assert!(i.plan(&status, at(last + wait - 1)).is_empty(), "{wait}");
        assert_eq!(i.plan(&status, at(last + wait)).len(), 1, "{wait}");
        last += wait;
    }
    // An old stall: looked at when its next retry is due, not every second.
    assert_eq!(i.look_again_within(), Some(Duration::from_secs(60)));
    i.plan(&status, at(last + 45_000));
    assert_eq!(i.look_again_within(), Some(Duration::from_secs(15)));
}

#[test]
fn the_peers_ike_sa_has_the_stalled_connection_initiated_at_once() {
    // The dark tunnel without any IKE_SA yet.
    let no_ike: String = TWO_PEERS_ONE_DARK
        .lines()
        .filter(|l| !l.starts_with("ovn-cccccc-0-in-1[") && !l.starts_with("ovn-cccccc-0-in-1{6}"))
        .map(|l| format!("{l}\n"))
        .collect();
    let dark = parse_status(&no_ike);
    assert_eq!(stalled_outbound(&dark), vec!["ovn-cccccc-0-out-1"]);
    let start = t0();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut i = Initiator::new();
    i.plan(&dark, at(0));
    assert_eq!(i.plan(&dark, at(1000)).len(), 1);
    // The peer initiated: the tunnel's IKE_SA is up, its outbound CHILD_SA
    // still missing (the ACQUIRE ignored for the shared reqid).
    let peer_up = parse_status(&format!(
        "{no_ike}ovn-cccccc-0-in-1[3]: ESTABLISHED 1 second ago, 10.77.0.1[CN=a]...10.77.0.3[CN=c]\n"
    ));
    assert_eq!(
        i.plan(&peer_up, at(1500)),
        vec!["ovn-cccccc-0-out-1"],
        "no backoff once an IKE_SA carries the tunnel"
    );
    // Once per IKE_SA coming up: then the backoff again.
    assert!(i.plan(&peer_up, at(2000)).is_empty());
    assert_eq!(i.plan(&peer_up, at(5500)).len(), 1, "4 s after the second");
}

#[test]
fn an_attempt_in_flight_keeps_its_backoff() {
    let dark = parse_status(TWO_PEERS_ONE_DARK);
    let connecting = parse_status(&format!(
        "{TWO_PEERS_ONE_DARK}ovn-cccccc-0-out-1[3]: CONNECTING, 10.77.0.1[%any]...10.77.0.3[%any]\n"
    ));
    let start = t0();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let mut i = Initiator::new();
    i.plan(&dark, at(0));
    assert_eq!(i.plan(&dark, at(1000)).len(), 1);
    assert!(i.plan(&connecting, at(1500)).is_empty());
    assert_eq!(i.look_again_within(), Some(Initiator::GRACE));
    // The peer refused (no configuration yet): stalled again, retried on
    // the backoff, not after a fresh grace.
    assert!(i.plan(&dark, at(2500)).is_empty());
    assert_eq!(i.plan(&dark, at(3000)).len(), 1);
}

#[test]
fn an_established_connection_is_forgotten_and_starts_over() {
    let dark = parse_status(TWO_PEERS_ONE_DARK);
    let up = parse_status(&format!(
        "{TWO_PEERS_ONE_DARK}ovn-cccccc-0-out-1{{7}}:  INSTALLED, TRANSPORT, reqid 4242\n"
    ));
    let start = t0();
    let at = |s: u64| start + Duration::from_secs(s);
    let mut i = Initiator::new();
    i.plan(&dark, at(0));
    assert_eq!(i.plan(&dark, at(1)).len(), 1);
    assert!(i.plan(&up, at(2)).is_empty());
    // Lost again later: a fresh grace, not the old backoff.
    assert!(i.plan(&dark, at(100)).is_empty());
    assert_eq!(i.plan(&dark, at(101)).len(), 1);
}

#[test]
fn nothing_routed_nothing_to_do() {
    let mut i = Initiator::new();
    assert_eq!(i.look_again_within(), None, "nothing seen yet");
    assert!(i.plan(&Status::default(), t0()).is_empty());
    assert_eq!(i.look_again_within(), None);
}
