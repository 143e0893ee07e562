//! The XFRM guards in a real network namespace: arming, blocking of marked
//! tunnel traffic, foreign policies untouched across arm / re-arm / restart,
//! re-adding a vanished guard, conflicts, and exact withdrawal.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube_ovn_ipsec_api::Uid;
use kube_ovn_ipsec_runtime::lease::{AllocationConfig, LeaseStore};
use xfrm::XfrmHandle;
use xfrm::alloc::OsRandom;
use xfrm::guard::GuardSet as _;
use xfrm::guard::{GuardEvent, GuardKeeper, GuardStatus};
use xfrm::model::Family;

fn foreign_policies(ns: &testbed::netns::Netns, mark: u32) {
    // Same priority and selector as the guards, similar marks, an ESP
    // policy, an inbound one: none of them may ever change.
    let near = [mark ^ 1, mark ^ 0x8000_0000];
    for m in near {
        ip_xfrm(
            ns,
            &format!(
                "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark {m:#x} mask 0xffffffff"
            ),
        );
        ip_xfrm(
            ns,
            &format!(
                "policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark {m:#x} mask 0xffffffff"
            ),
        );
    }
    ip_xfrm(
        ns,
        &format!(
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark {:#x} mask 0xffff0000",
            mark & 0xffff_0000
        ),
    );
    ip_xfrm(
        ns,
        "policy add dir out src 10.98.0.1/32 dst 10.98.0.7/32 proto udp dport 6081 priority 100 mark 0x5 mask 0xff tmpl src 10.98.0.1 dst 10.98.0.7 proto esp reqid 3 mode transport",
    );
    ip_xfrm(
        ns,
        "policy add dir in src 10.98.0.7/32 dst 10.98.0.1/32 priority 100",
    );
}

#[test]
fn guards_block_marked_tunnel_traffic_and_leave_foreign_policies_alone() {
    let (ns, handle) = netns("koi-rt-guard");
    addresses(&ns);
    let dir = tempfile::tempdir().unwrap();
    let store = LeaseStore::new(dir.path());
    let uid = Uid::new("node-uid-guard").unwrap();
    let mut keeper = GuardKeeper::new(handle);
    let (mut lease, fresh) = store
        .obtain(
            &uid,
            keeper.xfrm(),
            &AllocationConfig::default(),
            &mut OsRandom,
        )
        .unwrap();
    assert!(fresh);
    foreign_policies(&ns, lease.mark);
    let before = foreign_policy_dump(&ns, lease.mark);
    assert_eq!(before.len(), 7, "{before:#?}");

    // Arm: both guards installed and read back.
    let t = Instant::now();
    let eval = keeper.arm(&mut lease).unwrap();
    println!("arm took {:?}", t.elapsed());
    assert!(eval.armed, "{eval:?}");
    assert!(eval.lease_changed);
    assert!(
        matches!(
            eval.events[..],
            [
                GuardEvent::Armed {
                    family: Family::Ipv4,
                    ..
                },
                GuardEvent::Armed {
                    family: Family::Ipv6,
                    ..
                }
            ]
        ),
        "{eval:?}"
    );
    store.save(&lease).unwrap();
    assert_eq!(guard_count(&ns, lease.mark), 2);
    assert_eq!(foreign_policy_dump(&ns, lease.mark), before);

    // Marked tunnel traffic is dropped (the kernel answers EPERM from
    // sendto), unmarked passes, both families.
    for dst in ["10.98.0.2", "fd98::2"] {
        let dst = dst.parse().unwrap();
        for port in [6081, 4789] {
            let marked = send_udp(&ns, dst, port, Some(lease.mark));
            let err = marked.expect_err("marked send must be blocked");
            println!("marked UDP to {dst}:{port}: {err}");
            assert_eq!(err.raw_os_error(), Some(nix::libc::EPERM), "{err}");
            send_udp(&ns, dst, port, None).expect("unmarked send passes");
            send_udp(&ns, dst, port, Some(lease.mark ^ 0x0100_0000)).expect("other mark passes");
        }
    }

    // Re-arm is a pure read-back: nothing changes.
    let eval = keeper.evaluate(&mut lease).unwrap();
    assert!(
        eval.armed && eval.events.is_empty() && !eval.lease_changed,
        "{eval:?}"
    );
    assert_eq!(foreign_policy_dump(&ns, lease.mark), before);

    // Agent restart: a new socket, the lease from disk; guards kept as is.
    drop(keeper);
    assert_eq!(
        guard_count(&ns, lease.mark),
        2,
        "dropping the keeper removed guards"
    );
    let mut keeper = GuardKeeper::new(XfrmHandle::in_netns(ns.name()).unwrap());
    let (mut lease2, fresh) = store
        .obtain(
            &uid,
            keeper.xfrm(),
            &AllocationConfig::default(),
            &mut OsRandom,
        )
        .unwrap();
    assert!(!fresh);
    assert_eq!(lease2, lease);
    let eval = keeper.evaluate(&mut lease2).unwrap();
    assert!(eval.armed && eval.events.is_empty(), "{eval:?}");
    assert_eq!(foreign_policy_dump(&ns, lease.mark), before);

    // An externally deleted guard is back after one read-back period.
    let v4 = lease2.guard(Family::Ipv4).unwrap().index;
    ip_xfrm(
        &ns,
        &format!(
            "policy delete dir out index {v4} mark {:#x} mask 0xffffffff",
            lease.mark
        ),
    );
    assert_eq!(guard_count(&ns, lease.mark), 1);
    let period = Duration::from_millis(200);
    let deleted_at = Instant::now();
    std::thread::sleep(period / 2);
    let eval = keeper.evaluate(&mut lease2).unwrap();
    let back_after = deleted_at.elapsed();
    assert!(eval.armed && eval.lease_changed, "{eval:?}");
    assert!(
        matches!(eval.events[..], [GuardEvent::Readded { family: Family::Ipv4, old_index, .. }] if old_index == v4),
        "{eval:?}"
    );
    assert_eq!(keeper.readds_total(), 1);
    assert_eq!(guard_count(&ns, lease.mark), 2);
    assert!(back_after < period, "{back_after:?}");
    println!("guard back {back_after:?} after external deletion (read-back period {period:?})");
    assert_eq!(foreign_policy_dump(&ns, lease.mark), before);

    // A different policy at the guard's place: conflict, nothing touched.
    let v6 = lease2.guard(Family::Ipv6).unwrap().index;
    ip_xfrm(
        &ns,
        &format!(
            "policy delete dir out index {v6} mark {:#x} mask 0xffffffff",
            lease.mark
        ),
    );
    ip_xfrm(
        &ns,
        &format!(
            "policy add dir out src ::/0 dst ::/0 action allow priority 2147483647 mark {:#x} mask 0xffffffff",
            lease.mark
        ),
    );
    let squatter = ip_xfrm(&ns, "policy list");
    let eval = keeper.evaluate(&mut lease2).unwrap();
    assert!(!eval.armed, "{eval:?}");
    assert!(
        matches!(eval.guards[1], (Family::Ipv6, GuardStatus::Conflict { .. })),
        "{eval:?}"
    );
    assert!(
        matches!(&eval.events[..], [GuardEvent::Conflict { family: Family::Ipv6, mismatches, .. }] if mismatches[0].field == "action"),
        "{eval:?}"
    );
    assert_eq!(ip_xfrm(&ns, "policy list"), squatter);
    assert_eq!(keeper.conflicts_total(), 1);

    // Withdrawal (cleanup path) deletes exactly the lease's guard, refuses
    // the squatter, leaves every foreign policy.
    let w = keeper.withdraw(&lease2).unwrap();
    assert_eq!(w.removed.len(), 1, "{w:?}");
    assert_eq!(w.refused.len(), 1, "{w:?}");
    assert_eq!(guard_count(&ns, lease.mark), 0);
    let after = foreign_policy_dump(&ns, lease.mark);
    assert_eq!(
        after.len(),
        before.len() + 1,
        "the squatter and every foreign policy stay"
    );
    assert!(before.iter().all(|s| after.contains(s)));
}
