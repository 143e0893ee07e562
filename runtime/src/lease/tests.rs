use super::*;
use xfrm::alloc::{MAX_CANDIDATES, OsRandom};
use xfrm::model::{ACTION_ALLOW, DIR_OUT, Family, Mark, Selector};

/// Replays a fixed sequence, then counts up (never repeats a value).
struct Scripted(Vec<u32>, u32);

impl RandomSource for Scripted {
    fn next_u32(&mut self) -> u32 {
        if self.0.is_empty() {
            self.1 += 1;
            self.1
        } else {
            self.0.remove(0)
        }
    }
}

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

fn marked_policy(mark: u32) -> Policy {
    let mut p = Policy::guard(Family::Ipv4, mark);
    p.index = 42;
    p
}

#[test]
fn allocation_skips_aliases_and_reserved_bits() {
    // Candidates (mark, reqid): reserved bit, aliasing mark, then clean.
    let mut rng = Scripted(vec![0x4000, 5, 0x77, 6, 0x1_0000, 7], 100);
    let lease = allocate(
        &uid("u-1"),
        &[marked_policy(0x77)],
        &[],
        &AllocationConfig::default(),
        &mut rng,
    )
    .unwrap();
    assert_eq!((lease.mark, lease.reqid), (0x1_0000, 7));
    assert_eq!(lease.node_uid, "u-1");
    assert_eq!(
        uuid::Uuid::parse_str(&lease.lease_id)
            .unwrap()
            .get_version_num(),
        4
    );
}

#[test]
fn allocation_refuses_while_bypass_exists() {
    let bypass = Policy {
        selector: Selector::wildcard(Family::Ipv6),
        dir: DIR_OUT,
        action: ACTION_ALLOW,
        priority: 10,
        index: 9,
        mark: None,
        if_id: 0,
        ptype: 0,
        flags: 0,
        templates: vec![],
    };
    let err = allocate(
        &uid("u-1"),
        &[bypass],
        &[],
        &AllocationConfig::default(),
        &mut OsRandom,
    )
    .unwrap_err();
    assert_eq!(err.metric_label(), "bypass_present");
    assert!(err.to_string().contains("index 9"), "{err}");
}

#[test]
fn allocation_gives_up_on_a_systematic_alias() {
    // A mark of 0 under mask 0x1 aliases every even mark; the script only
    // offers even marks.
    let even = Policy {
        mark: Some(Mark { value: 0, mask: 1 }),
        ..marked_policy(0)
    };
    let mut rng = Scripted((0..2 * MAX_CANDIDATES).map(|i| (i + 1) * 2).collect(), 0);
    let err = allocate(
        &uid("u"),
        &[even],
        &[],
        &AllocationConfig::default(),
        &mut rng,
    )
    .unwrap_err();
    assert_eq!(err.metric_label(), "lease_exhausted");
}

#[test]
fn publication_has_the_four_contract_keys() {
    let lease = Lease {
        version: 1,
        lease_id: "l".into(),
        node_uid: "u".into(),
        mark: 0x1234,
        reqid: 9,
        guards: vec![],
    };
    let p = lease.publication();
    assert_eq!(p.len(), 4);
    assert_eq!(p[EXTERNAL_ID_PROTECTION_MARK], Some("4660".into()));
    assert!(withdrawal().values().all(Option::is_none));
    assert_eq!(withdrawal().len(), 4);
}

#[test]
fn store_round_trip_mode_and_foreign_uid() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let store = LeaseStore::new(dir.path());
    assert_eq!(store.load_for(&uid("a")).unwrap(), Loaded::None);
    let mut lease = allocate(
        &uid("a"),
        &[],
        &[],
        &AllocationConfig::default(),
        &mut OsRandom,
    )
    .unwrap();
    lease.record_guard(Family::Ipv6, 18);
    lease.record_guard(Family::Ipv4, 10);
    lease.record_guard(Family::Ipv4, 26);
    store.save(&lease).unwrap();
    let mode = std::fs::metadata(store.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        store.load_for(&uid("a")).unwrap(),
        Loaded::Mine(lease.clone())
    );
    assert_eq!(lease.guard(Family::Ipv4).unwrap().index, 26);
    assert_eq!(lease.guards.len(), 2);
    assert_eq!(
        store.load_for(&uid("b")).unwrap(),
        Loaded::Foreign(lease.clone())
    );
    let text = std::fs::read_to_string(store.path()).unwrap();
    assert!(text.contains("\"nodeUID\": \"a\""), "{text}");
    assert!(text.contains("\"leaseId\""), "{text}");
    // A lease file someone made world-readable is read and set back to 0600.
    std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(store.load_for(&uid("a")).unwrap(), Loaded::Mine(lease));
    let mode = std::fs::metadata(store.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "a 0644 lease file was left as it was");
}
