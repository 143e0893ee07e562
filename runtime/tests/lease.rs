//! Lease allocation against real XFRM policies and states in a namespace:
//! every alias and bypass case, and a Node UID that never inherits.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use kube_ovn_ipsec_api::Uid;
use kube_ovn_ipsec_runtime::lease::{AllocationConfig, LeaseStore, Loaded};
use xfrm::Xfrm;
use xfrm::alloc::{OsRandom, RandomSource};
use xfrm::model::check_candidate;

/// Offers `script` first, then a clean candidate.
struct Scripted(Vec<u32>);

impl RandomSource for Scripted {
    fn next_u32(&mut self) -> u32 {
        if self.0.is_empty() {
            0x0123_0001
        } else {
            self.0.remove(0)
        }
    }
}

const CLEAN_MARK: u32 = 0x0123_0001;

#[test]
fn allocation_rejects_every_alias_of_real_policies_and_states() {
    // (name, ip xfrm commands, first candidate mark, reqid, expected rejection)
    let cases: &[(&str, &[&str], u32, u32, &str)] = &[
        (
            "policy exact mark",
            &[
                "policy add dir out src 10.1.0.0/16 dst 10.2.0.0/16 action block mark 0x11110000 mask 0xffffffff",
            ],
            0x1111_0000,
            5,
            "PolicyMarkAlias",
        ),
        (
            "policy mark under mask",
            &["policy add dir in src 10.1.0.0/16 dst 10.2.0.0/16 mark 0x00220000 mask 0x00ff0000"],
            0x3322_0001,
            5,
            "PolicyMarkAlias",
        ),
        (
            "policy template reqid",
            &[
                "policy add dir out src 10.1.0.1/32 dst 10.1.0.2/32 tmpl src 10.1.0.1 dst 10.1.0.2 proto esp reqid 4242 mode transport",
            ],
            0x0f00_0001,
            4242,
            "PolicyReqid",
        ),
        (
            "state mark under mask",
            &[
                "state allocspi src 10.1.0.1 dst 10.1.0.3 proto esp mode transport reqid 9 mark 0x00440000 mask 0x00ff0000",
            ],
            0x1244_0000,
            5,
            "StateMarkAlias",
        ),
        (
            "state reqid (IPv6)",
            &["state allocspi src fd00::1 dst fd00::3 proto esp mode transport reqid 4343"],
            0x0f00_0001,
            4343,
            "StateReqid",
        ),
        (
            "reserved kube-proxy bit",
            &[],
            0x0000_4001,
            5,
            "ReservedBits",
        ),
    ];
    for (name, cmds, mark, reqid, want) in cases {
        let (ns, mut handle) = netns("koi-rt-lease");
        for c in *cmds {
            ip_xfrm(&ns, c);
        }
        let (policies, states) = (
            handle.dump_policies().unwrap(),
            handle.dump_states().unwrap(),
        );
        let rejection = check_candidate(*mark, *reqid, 0xc000, &policies, &states).expect_err(name);
        assert!(
            format!("{rejection:?}").starts_with(want),
            "{name}: {rejection:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let (lease, fresh) = LeaseStore::new(dir.path())
            .obtain(
                &Uid::new("u-alias").unwrap(),
                &mut handle,
                &AllocationConfig::default(),
                &mut Scripted(vec![*mark, *reqid]),
            )
            .unwrap();
        assert!(fresh);
        // A reserved bit is never drawn: candidates come from the free bits,
        // so the scripted value is used with its reserved bits cleared.
        // Every other rejected candidate gives way to the clean one.
        let expected = if *want == "ReservedBits" {
            *mark & !0xc000
        } else {
            CLEAN_MARK
        };
        assert_eq!(lease.mark, expected, "{name}");
        println!(
            "{name}: candidate {mark:#x}/{reqid} rejected ({rejection:?}), got {:#x}",
            lease.mark
        );
    }
}

#[test]
fn allocation_refuses_while_a_bypass_exists() {
    let bypasses: &[(&str, &str)] = &[
        (
            "allow everything",
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action allow priority 1000",
        ),
        (
            "IPv6 geneve allow",
            "policy add dir out src ::/0 dst ::/0 proto udp dport 6081 action allow priority 5",
        ),
        (
            "vxlan allow, compression template only",
            "policy add dir out src 10.0.0.0/8 dst 10.0.0.0/8 proto udp dport 4789 priority 5 tmpl proto comp reqid 77 mode transport level use",
        ),
        (
            "allow at the guard's own priority",
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action allow priority 2147483647",
        ),
    ];
    for (name, cmd) in bypasses {
        let (ns, mut handle) = netns("koi-rt-bypass");
        ip_xfrm(&ns, cmd);
        let dir = tempfile::tempdir().unwrap();
        let store = LeaseStore::new(dir.path());
        let err = store
            .obtain(
                &Uid::new("u-bypass").unwrap(),
                &mut handle,
                &AllocationConfig::default(),
                &mut OsRandom,
            )
            .expect_err(name);
        assert_eq!(err.metric_label(), "bypass_present", "{name}: {err}");
        println!("{name}: {err}");
        assert!(
            !store.path().exists(),
            "{name}: a refused allocation persisted a lease"
        );
    }
    let harmless: &[(&str, &str)] = &[
        (
            "allow with ESP template",
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 priority 10 tmpl proto esp reqid 78 mode transport",
        ),
        (
            "inbound allow",
            "policy add dir in src 0.0.0.0/0 dst 0.0.0.0/0 action allow priority 10",
        ),
        (
            "allow below the guard",
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action allow priority 4294967295",
        ),
        (
            "DNS allow",
            "policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 proto udp dport 53 action allow priority 10",
        ),
    ];
    for (name, cmd) in harmless {
        let (ns, mut handle) = netns("koi-rt-bypass");
        ip_xfrm(&ns, cmd);
        let dir = tempfile::tempdir().unwrap();
        LeaseStore::new(dir.path())
            .obtain(
                &Uid::new("u-ok").unwrap(),
                &mut handle,
                &AllocationConfig::default(),
                &mut OsRandom,
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn a_different_node_uid_never_inherits_the_lease() {
    let (_ns, mut handle) = netns("koi-rt-uid");
    let dir = tempfile::tempdir().unwrap();
    let store = LeaseStore::new(dir.path());
    let (a, _) = store
        .obtain(
            &Uid::new("uid-a").unwrap(),
            &mut handle,
            &AllocationConfig::default(),
            &mut OsRandom,
        )
        .unwrap();
    let (again, fresh) = store
        .obtain(
            &Uid::new("uid-a").unwrap(),
            &mut handle,
            &AllocationConfig::default(),
            &mut OsRandom,
        )
        .unwrap();
    assert!(!fresh);
    assert_eq!(again, a);
    let b_uid = Uid::new("uid-b").unwrap();
    assert_eq!(store.load_for(&b_uid).unwrap(), Loaded::Foreign(a.clone()));
    let (b, fresh) = store
        .obtain(
            &b_uid,
            &mut handle,
            &AllocationConfig::default(),
            &mut OsRandom,
        )
        .unwrap();
    assert!(fresh);
    assert_ne!(b.lease_id, a.lease_id);
    assert_ne!((b.mark, b.reqid), (a.mark, a.reqid));
    assert_eq!(b.node_uid, "uid-b");
    assert_eq!(store.load_for(&b_uid).unwrap(), Loaded::Mine(b));
    // The foreign lease is kept aside as evidence, not deleted.
    let retired = dir.path().join("protection-lease.uid-a.foreign.json");
    assert!(retired.exists());
}
