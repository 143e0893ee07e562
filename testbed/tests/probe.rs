//! The probe stream against a real `ping` in a network namespace: echoes
//! to an address on the namespace's loopback, a blackhole route over it
//! for a while, then the route gone. Every loss falls in the outage.

// Real processes in real time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::Duration;

use testbed::netns::Netns;
use testbed::probe::{ProbeStream, unix_now};

#[test]
fn losses_fall_in_the_phase_they_happened_in() {
    testbed::require_program("ping").unwrap();
    let ns = Netns::create("koi-probe").unwrap();
    ns.ip(["link", "set", "lo", "up"]).unwrap();
    ns.ip(["addr", "add", "10.99.0.1/32", "dev", "lo"]).unwrap();
    let dst = Ipv4Addr::new(10, 99, 0, 1);
    let stream = ProbeStream::start(&ns, dst, Duration::from_millis(50)).unwrap();

    let before = unix_now();
    std::thread::sleep(Duration::from_millis(700));
    let outage = unix_now();
    ns.ip(["route", "add", "blackhole", "10.99.0.1/32"])
        .unwrap();
    ns.ip(["addr", "del", "10.99.0.1/32", "dev", "lo"]).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    ns.ip(["addr", "add", "10.99.0.1/32", "dev", "lo"]).unwrap();
    ns.ip(["route", "del", "blackhole", "10.99.0.1/32"])
        .unwrap();
    let after = unix_now();
    std::thread::sleep(Duration::from_millis(700));
    let log = stream.stop();

    // Echoes sent within a few ms of a route change can go either way:
    // they fall in the bands, which are not judged.
    let band = 0.03;
    let phases = [
        ("before", before),
        ("band", outage - band),
        ("outage", outage + band),
        ("band", after - band),
        ("after", after + band),
    ];
    let losses = log.losses(&phases);
    println!("{losses:?}");
    let [(_, b), _, (_, o), _, (_, a)] = losses[..] else {
        panic!("{losses:?}")
    };
    // ~12 echoes a phase at 50 ms; a loaded machine sends fewer.
    assert!(b.sent >= 5 && o.sent >= 5 && a.sent >= 5, "{losses:?}");
    assert_eq!(b.lost, 0, "{losses:?}");
    assert_eq!(o.lost, o.sent, "{losses:?}");
    assert_eq!(a.lost, 0, "{losses:?}");
}
