use super::*;
use kube_ovn_ipsec_api::datapath::Encapsulation;
use kube_ovn_ipsec_api::status::Reason;
use std::time::UNIX_EPOCH;

const WINDOW: Duration = Duration::from_secs(10);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn sa(spi: u32, packets: u64) -> SaSample {
    SaSample {
        spi,
        bytes: packets * 100,
        packets,
    }
}

fn peer(out: &[SaSample], inb: &[SaSample]) -> PeerSample {
    PeerSample {
        peer: "192.0.2.2".parse().unwrap(),
        local: "192.0.2.1".parse().unwrap(),
        chassis: Some("node-2".into()),
        encapsulation: Some(Encapsulation::Geneve),
        outbound: out.to_vec(),
        inbound: inb.to_vec(),
        nat_traversal: false,
    }
}

fn sample(peers: Vec<PeerSample>, block: u64) -> DatapathSample {
    DatapathSample {
        peers,
        xfrm_stat: [(OUT_POL_BLOCK.to_string(), block)].into_iter().collect(),
        ..DatapathSample::default()
    }
}

/// Feeds `(t, outbound packets, inbound packets, OutPolBlock)` with one SA
/// each way (SPIs 1 and 2); returns the last report's only peer.
fn run(c: &mut Classifier, steps: &[(u64, u64, u64, u64)]) -> PeerHealth {
    let mut last = None;
    for &(t, o, i, b) in steps {
        let r = c.observe(at(t), &sample(vec![peer(&[sa(1, o)], &[sa(2, i)])], b));
        last = Some(r.peers[0].clone());
    }
    last.unwrap()
}

#[test]
fn both_directions_moving_is_healthy() {
    let mut c = Classifier::new(WINDOW);
    let p = run(&mut c, &[(0, 10, 10, 0), (2, 20, 20, 0), (4, 30, 30, 0)]);
    assert_eq!(p.state, PeerState::Healthy);
    assert!(p.healthy);
    assert_eq!(p.outbound.packets, 30);
    assert_eq!(p.chassis.unwrap().as_str(), "node-2");
}

#[test]
fn outbound_growing_inbound_flat_for_a_window_is_inbound_missing_and_clears() {
    let mut c = Classifier::new(WINDOW);
    run(&mut c, &[(0, 10, 10, 0), (2, 20, 20, 0)]);
    // Inbound stops moving at t=2.
    let p = run(&mut c, &[(4, 30, 20, 0), (8, 40, 20, 0)]);
    assert_eq!(p.state, PeerState::Healthy, "not a window of evidence yet");
    let p = run(&mut c, &[(10, 45, 20, 0)]);
    assert_eq!(
        p.state,
        PeerState::Healthy,
        "the baseline (t=0) saw inbound at 10"
    );
    // Flat since t=2, a whole window.
    let p = run(&mut c, &[(12, 50, 20, 0)]);
    assert_eq!(p.state, PeerState::InboundMissing);
    assert_eq!(p.reason, Some(Reason::InboundMissing));
    assert!(!p.healthy, "counts at once");
    assert_eq!(p.since, timestamp(at(12)));
    let report = c.observe(at(16), &sample(vec![peer(&[sa(1, 70)], &[sa(2, 20)])], 0));
    assert!(!report.healthy());
    assert_eq!(report.reason(), Some(Reason::InboundMissing));
    // Inbound moves again: healthy at the next sample.
    let p = run(&mut c, &[(18, 80, 21, 0)]);
    assert_eq!(p.state, PeerState::Healthy);
    assert!(p.healthy);
}

#[test]
fn no_outbound_sa_is_guard_drop_when_the_guards_drop_else_no_sa() {
    let mut c = Classifier::new(WINDOW);
    run(&mut c, &[(0, 10, 10, 5), (2, 20, 20, 5)]);
    let none = |c: &mut Classifier, t, block| {
        c.observe(at(t), &sample(vec![peer(&[], &[sa(2, 20)])], block))
            .peers[0]
            .clone()
    };
    let p = none(&mut c, 4, 9);
    assert_eq!(p.state, PeerState::GuardDrop);
    assert_eq!(p.reason, Some(Reason::GuardDrop));
    assert!(p.healthy, "not for a whole window yet");
    assert!(none(&mut c, 10, 15).healthy);
    // Still dropping a window after the SA vanished.
    let p = none(&mut c, 14, 20);
    assert_eq!(p.state, PeerState::GuardDrop);
    assert!(!p.healthy);
    // The counter stops for a window: NoSA, still unhealthy (the episode
    // without SAs goes on).
    none(&mut c, 20, 20);
    let p = none(&mut c, 26, 20);
    assert_eq!(p.state, PeerState::NoSa);
    assert!(!p.healthy);
    // SAs back, traffic flows.
    let p = run(&mut c, &[(28, 1, 21, 20)]);
    assert_eq!(p.state, PeerState::Healthy);
    assert!(p.healthy);
}

#[test]
fn outbound_without_inbound_sa_is_no_sa() {
    let mut c = Classifier::new(WINDOW);
    let r = c.observe(at(0), &sample(vec![peer(&[sa(1, 5)], &[])], 0));
    assert_eq!(r.peers[0].state, PeerState::NoSa);
}

#[test]
fn a_rekeyed_sa_counts_as_movement() {
    let mut c = Classifier::new(WINDOW);
    run(&mut c, &[(0, 10, 10, 0), (2, 20, 20, 0)]);
    // At t=12 both directions were rekeyed: new SPIs with fewer packets
    // than the old ones had.
    let r = c.observe(at(12), &sample(vec![peer(&[sa(3, 2)], &[sa(4, 2)])], 0));
    assert_eq!(r.peers[0].state, PeerState::Healthy);
    // Sum of packets went down, still moving per SPI.
    let r = c.observe(at(14), &sample(vec![peer(&[sa(3, 4)], &[sa(4, 3)])], 0));
    assert_eq!(r.peers[0].state, PeerState::Healthy);
}

#[test]
fn nothing_moving_for_a_window_is_idle() {
    let mut c = Classifier::new(WINDOW);
    let p = run(&mut c, &[(0, 10, 10, 0), (5, 10, 10, 0), (11, 10, 10, 0)]);
    assert_eq!(p.state, PeerState::Idle);
    assert!(p.healthy);
}

#[test]
fn the_enable_window_runs_from_intent_to_the_first_outbound_packet() {
    let mut c = Classifier::new(WINDOW);
    let r = c.observe(at(0), &sample(vec![peer(&[], &[])], 0));
    assert_eq!(r.peers[0].state, PeerState::NoSa);
    assert!(c.window_open());
    c.observe(at(1), &sample(vec![peer(&[], &[])], 3));
    let r = c.observe(at(2), &sample(vec![peer(&[sa(1, 0)], &[sa(2, 0)])], 3));
    assert_eq!(
        r.peers[0].enable_window_millis, None,
        "no packet through it yet"
    );
    assert!(c.window_open());
    let r = c.observe(at(3), &sample(vec![peer(&[sa(1, 4)], &[sa(2, 4)])], 3));
    assert_eq!(r.peers[0].enable_window_millis, Some(3000));
    assert!(!c.window_open());
    assert_eq!(r.peers[0].state, PeerState::Healthy);
}

#[test]
fn traffic_already_flowing_at_first_sight_has_no_window() {
    let mut c = Classifier::new(WINDOW);
    let r = c.observe(at(0), &sample(vec![peer(&[sa(1, 4)], &[sa(2, 4)])], 0));
    assert_eq!(r.peers[0].enable_window_millis, None);
    assert!(!c.window_open());
    // Intent removed and given again: a new window.
    c.observe(at(1), &sample(vec![], 0));
    c.observe(at(2), &sample(vec![peer(&[], &[])], 0));
    assert!(c.window_open());
}

#[test]
fn the_mtu_is_checked_with_the_tunnels_encapsulation() {
    let mut c = Classifier::new(WINDOW);
    let mut s = sample(vec![peer(&[sa(1, 1)], &[sa(2, 1)])], 0);
    s.underlay_mtu = Some(1500);
    s.tunnel_mtu = Some(1442);
    let r = c.observe(at(0), &s);
    let mtu = r.mtu.unwrap();
    assert_eq!((mtu.max_tunnel, mtu.ok), (1408, false));
    assert!(!r.healthy());
    assert_eq!(r.reason(), Some(Reason::MtuTooSmall));
    s.peers[0].nat_traversal = true;
    s.tunnel_mtu = Some(1400);
    let r = c.observe(at(1), &s);
    assert_eq!(r.mtu.unwrap().max_tunnel, 1400);
    assert!(r.healthy());
    s.tunnel_mtu = None;
    assert_eq!(c.observe(at(2), &s).mtu, None);
}
