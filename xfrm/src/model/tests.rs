use super::*;

fn policy(dir: u8, action: u8, priority: u32, mark: Option<Mark>) -> Policy {
    Policy {
        selector: Selector::wildcard(Family::Ipv4),
        dir,
        action,
        priority,
        index: 8,
        mark,
        if_id: 0,
        ptype: 0,
        flags: 0,
        templates: vec![],
    }
}

fn esp(reqid: u32) -> Template {
    Template {
        proto: PROTO_ESP,
        reqid,
        mode: 0,
        family: 2,
        optional: false,
    }
}

fn state(reqid: u32, mark: Option<Mark>) -> State {
    State {
        family: Some(Family::Ipv4),
        saddr: "10.0.0.1".parse().unwrap(),
        daddr: "10.0.0.2".parse().unwrap(),
        proto: 108,
        spi: 0x1234,
        reqid,
        mode: 0,
        mark,
        if_id: 0,
        selector: Selector::wildcard(Family::Ipv4),
        bytes: 0,
        packets: 0,
        seq: 0,
        encap: false,
    }
}

const RESERVED: u32 = 0xc000;

/// (name, policies, states, mark, reqid, expected rejection prefix)
type Case = (
    &'static str,
    Vec<Policy>,
    Vec<State>,
    u32,
    u32,
    Option<&'static str>,
);

#[test]
fn candidate_table() {
    let m = 0x1234_0001;
    let cases: Vec<Case> = vec![
        ("clean", vec![], vec![], m, 7, None),
        ("zero mark", vec![], vec![], 0, 7, Some("ZeroMark")),
        (
            "kube-proxy bit",
            vec![],
            vec![],
            0x4001,
            7,
            Some("ReservedBits"),
        ),
        ("reqid 0", vec![], vec![], m, 0, Some("ReqidRange")),
        ("reqid 2^31", vec![], vec![], m, 1 << 31, Some("ReqidRange")),
        (
            "policy exact mark",
            vec![policy(DIR_OUT, ACTION_ALLOW, 0, Some(Mark::exact(m)))],
            vec![],
            m,
            7,
            Some("PolicyMarkAlias"),
        ),
        (
            "policy mark under mask",
            vec![policy(
                DIR_IN,
                ACTION_BLOCK,
                5,
                Some(Mark {
                    value: 0x1,
                    mask: 0xff,
                }),
            )],
            vec![],
            m,
            7,
            Some("PolicyMarkAlias"),
        ),
        (
            "policy similar mark, no alias",
            vec![policy(
                DIR_OUT,
                ACTION_BLOCK,
                GUARD_PRIORITY,
                Some(Mark::exact(m + 1)),
            )],
            vec![],
            m,
            7,
            None,
        ),
        (
            "unmarked inbound policy is no alias",
            vec![policy(DIR_IN, ACTION_ALLOW, 0, None)],
            vec![],
            m,
            7,
            None,
        ),
        (
            "policy reqid",
            vec![Policy {
                templates: vec![esp(7)],
                ..policy(DIR_OUT, ACTION_ALLOW, 0, Some(Mark::exact(5)))
            }],
            vec![],
            m,
            7,
            Some("PolicyReqid"),
        ),
        (
            "state mark",
            vec![],
            vec![state(
                9,
                Some(Mark {
                    value: m & 0xffff,
                    mask: 0xffff,
                }),
            )],
            m,
            7,
            Some("StateMarkAlias"),
        ),
        (
            "state reqid",
            vec![],
            vec![state(7, None)],
            m,
            7,
            Some("StateReqid"),
        ),
    ];
    for (name, policies, states, mark, reqid, want) in cases {
        let got = check_candidate(mark, reqid, RESERVED, &policies, &states);
        let got = got.err().map(|e| format!("{e:?}"));
        match want {
            None => assert_eq!(got, None, "{name}"),
            Some(w) => assert!(
                got.as_deref().is_some_and(|g| g.starts_with(w)),
                "{name}: {got:?}"
            ),
        }
    }
}

#[test]
fn bypass_table() {
    let m = 0x1234_0001;
    let udp_to = |port: u16| Selector {
        proto: PROTO_UDP,
        dport: port,
        dport_mask: 0xffff,
        ..Selector::wildcard(Family::Ipv6)
    };
    let cases: Vec<(&str, Policy, bool)> = vec![
        (
            "unmarked allow any",
            policy(DIR_OUT, ACTION_ALLOW, 100, None),
            true,
        ),
        (
            "allow with only a comp template",
            Policy {
                templates: vec![Template {
                    proto: 108,
                    ..esp(1)
                }],
                ..policy(DIR_OUT, ACTION_ALLOW, 100, None)
            },
            true,
        ),
        (
            "allow with ESP template",
            Policy {
                templates: vec![esp(1)],
                ..policy(DIR_OUT, ACTION_ALLOW, 100, None)
            },
            false,
        ),
        (
            "inbound allow",
            policy(DIR_IN, ACTION_ALLOW, 100, None),
            false,
        ),
        ("block", policy(DIR_OUT, ACTION_BLOCK, 100, None), false),
        (
            "other mark",
            policy(DIR_OUT, ACTION_ALLOW, 100, Some(Mark::exact(m + 1))),
            false,
        ),
        (
            "lower precedence than the guard",
            policy(DIR_OUT, ACTION_ALLOW, u32::MAX, None),
            false,
        ),
        (
            "udp 6081 only",
            Policy {
                selector: udp_to(6081),
                ..policy(DIR_OUT, ACTION_ALLOW, 1, None)
            },
            true,
        ),
        (
            "udp 53 only",
            Policy {
                selector: udp_to(53),
                ..policy(DIR_OUT, ACTION_ALLOW, 1, None)
            },
            false,
        ),
        (
            "tcp only",
            Policy {
                selector: Selector {
                    proto: 6,
                    ..Selector::wildcard(Family::Ipv4)
                },
                ..policy(DIR_OUT, ACTION_ALLOW, 1, None)
            },
            false,
        ),
        (
            "xfrm interface policy",
            Policy {
                if_id: 3,
                ..policy(DIR_OUT, ACTION_ALLOW, 1, None)
            },
            false,
        ),
    ];
    for (name, p, want) in cases {
        assert_eq!(find_bypass(m, &[p]).is_some(), want, "{name}");
    }
}

#[test]
fn guard_shape_and_comparison() {
    let g = Policy::guard(Family::Ipv6, 0x10);
    assert_eq!(g.priority, (1 << 31) - 1);
    assert_eq!(
        g.mark,
        Some(Mark {
            value: 0x10,
            mask: 0xffff_ffff
        })
    );
    assert_eq!(g.selector.daddr, "::".parse::<IpAddr>().unwrap());
    let mut read = g.clone();
    read.index = 99; // fetched by index: not a difference
    assert!(compare_guard(&g, &read).is_empty());
    read.action = ACTION_ALLOW;
    read.priority = 5;
    let diff = compare_guard(&g, &read);
    let fields: Vec<_> = diff.iter().map(|d| d.field).collect();
    assert_eq!(fields, ["action", "priority"]);
    assert!(g.same_kernel_key(&read));
    read.mark = Some(Mark::exact(0x11));
    assert!(!g.same_kernel_key(&read));
}

#[test]
fn bypass_is_described() {
    let b = find_bypass(1, &[policy(DIR_OUT, ACTION_ALLOW, 3, None)]).unwrap();
    assert_eq!(
        b.to_string(),
        "outbound allow policy without ESP template (index 8, family ipv4, priority 3, mark none)"
    );
}
