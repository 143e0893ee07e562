//! Guard read-back (SPEC §4) with 0, 1,000 and 10,000 foreign XFRM
//! policies in a dedicated namespace: netlink GETPOLICY by index (the
//! agent's way) next to `ip xfrm policy list` plus text matching of the two
//! guards (the baseline). Also lease allocation — dumps of policies and
//! states plus the alias/bypass scan — at 10,000 policies.
//!
//! Prints `guard_readback: ...` summary lines with medians and the ratio.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kube_ovn_ipsec_api::names::defaults::RESERVED_MARK_BITS;
use testbed::netns::Netns;
use xfrm::alloc::{self, OsRandom};
use xfrm::guard::{GuardKeeper, Guards};
use xfrm::model::{ACTION_BLOCK, DIR_OUT, Family, Mark, Policy, Selector};
use xfrm::{Xfrm, XfrmHandle};

/// Installs `n` foreign outbound policies via netlink (fast): distinct
/// /32 destinations, marks that never alias the lease's.
fn install_foreign(h: &mut XfrmHandle, from: usize, to: usize) {
    for i in from..to {
        let i = i as u32;
        let p = Policy {
            selector: Selector {
                daddr: std::net::IpAddr::from((0x0a00_0000u32 | i).to_be_bytes()),
                prefixlen_d: 32,
                ..Selector::wildcard(Family::Ipv4)
            },
            dir: DIR_OUT,
            action: ACTION_BLOCK,
            priority: 1000 + (i % 7),
            index: 0,
            mark: Some(Mark {
                value: 0x7000_0000 | i,
                mask: 0xffff_ffff,
            }),
            if_id: 0,
            ptype: 0,
            flags: 0,
            templates: vec![],
        };
        h.add_policy(&p).expect("add foreign policy");
    }
}

fn ip_route(ns: &Netns, mark: u32) -> usize {
    let out = std::process::Command::new("ip")
        .args(["-n", ns.name(), "xfrm", "policy", "list"])
        .output()
        .expect("ip xfrm policy list");
    let text = String::from_utf8_lossy(&out.stdout);
    let needle = format!("mark 0x{mark:x}/0xffffffff");
    let mut found = 0;
    let mut stanza = String::new();
    for line in text.lines().chain(std::iter::once("END")) {
        if !line.starts_with(char::is_whitespace) {
            if stanza.contains(&needle)
                && stanza.contains("action block")
                && stanza.contains("priority 2147483647")
            {
                found += 1;
            }
            stanza.clear();
        }
        stanza.push_str(line);
        stanza.push('\n');
    }
    assert_eq!(found, 2, "ip route did not find both guards");
    found
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench(c: &mut Criterion) {
    for p in ["ip", "nsenter", "sh", "mount", "sleep"] {
        testbed::require_program(p).expect("program");
    }
    let ns = Netns::create("koi-bench-guard").expect("netns");
    let mut setup = XfrmHandle::in_netns(ns.name()).expect("xfrm socket");
    let allocation = alloc::allocate(&[], &[], RESERVED_MARK_BITS, &mut OsRandom).expect("lease");
    let mut lease = Guards::new(allocation.mark);
    let mut keeper = GuardKeeper::new(XfrmHandle::in_netns(ns.name()).expect("xfrm socket"));
    assert!(keeper.arm(&mut lease).expect("arm").armed);

    let mut installed = 0;
    let mut group = c.benchmark_group("guard_readback");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut summary = Vec::new();
    for n in [0usize, 1_000, 10_000] {
        let t = Instant::now();
        install_foreign(&mut setup, installed, n);
        installed = n;
        eprintln!(
            "installed {n} foreign policies via netlink in {:?}",
            t.elapsed()
        );
        group.bench_function(format!("netlink_by_index/{n}"), |b| {
            b.iter(|| assert!(keeper.evaluate(&mut lease).expect("evaluate").armed))
        });
        group.bench_function(format!("ip_xfrm_list/{n}"), |b| {
            b.iter(|| ip_route(&ns, lease.mark))
        });
        // Our own medians for the summary line (criterion's are in its report).
        let ours = median(
            (0..30)
                .map(|_| {
                    let t = Instant::now();
                    keeper.evaluate(&mut lease).expect("evaluate");
                    t.elapsed()
                })
                .collect(),
        );
        let ip = median(
            (0..(if n >= 10_000 { 7 } else { 15 }))
                .map(|_| {
                    let t = Instant::now();
                    ip_route(&ns, lease.mark);
                    t.elapsed()
                })
                .collect(),
        );
        summary.push((n, ours, ip));
    }
    // Allocation with its conflict scan at 10,000 policies.
    group.bench_function("lease_allocation/10000", |b| {
        b.iter(|| {
            let policies = keeper.xfrm().dump_policies().expect("dump");
            let states = keeper.xfrm().dump_states().expect("dump");
            assert!(policies.len() >= 10_000);
            alloc::allocate(&policies, &states, RESERVED_MARK_BITS, &mut OsRandom)
                .expect("allocate")
        })
    });
    group.finish();
    let allocation_median = median(
        (0..10)
            .map(|_| {
                let t = Instant::now();
                let p = keeper.xfrm().dump_policies().expect("dump");
                let s = keeper.xfrm().dump_states().expect("dump");
                alloc::allocate(&p, &s, RESERVED_MARK_BITS, &mut OsRandom).expect("allocate");
                t.elapsed()
            })
            .collect(),
    );
    for (n, ours, ip) in summary {
        println!(
            "guard_readback: {n} foreign policies: netlink read-back by index {ours:?} (median), ip xfrm policy list + match {ip:?}, ratio {:.0}x",
            ip.as_secs_f64() / ours.as_secs_f64()
        );
    }
    println!(
        "guard_readback: lease allocation (dump policies + states, alias/bypass scan) at 10000 policies: {allocation_median:?} (median)"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
