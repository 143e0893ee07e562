use super::*;
use crate::model::{PROTO_ESP, Policy, Template};

#[test]
fn add_request_round_trips_through_the_reply_parser() {
    // A NEWPOLICY request has the layout of the kernel's NEWPOLICY reply.
    let mut p = Policy::guard(Family::Ipv6, 0xdead_0001);
    p.templates = vec![Template {
        proto: PROTO_ESP,
        reqid: 77,
        mode: 0,
        family: 10,
        optional: false,
    }];
    p.if_id = 5;
    let bytes = add_policy_request(&p, 9);
    let msgs = split_messages(&bytes).unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!((msgs[0].message_type, msgs[0].seq), (XFRM_MSG_NEWPOLICY, 9));
    assert_eq!(parse_policy(msgs[0].body).unwrap(), p);
}

#[test]
fn dump_request_is_header_only() {
    let d = dump_request(XFRM_MSG_GETPOLICY, 3);
    assert_eq!(d.len(), 16);
    let m = split_messages(&d).unwrap();
    assert_eq!((m[0].message_type, m[0].seq, m[0].body.len()), (0x15, 3, 0));
}

#[test]
fn get_by_index_carries_family_mark_and_index() {
    let mut p = Policy::guard(Family::Ipv4, 0x42);
    p.index = 1234;
    let req = get_policy_request(&p, true, 1);
    let m = split_messages(&req).unwrap();
    let body = m[0].body;
    // xfrm_userpolicy_id: selector (56 bytes; family at 40), index, dir.
    assert_eq!(u16::from_ne_bytes([body[40], body[41]]), 2);
    assert_eq!(
        u32::from_ne_bytes([body[56], body[57], body[58], body[59]]),
        1234
    );
    assert_eq!(body[60], 1);
    // Followed by XFRMA_MARK {0x42, 0xffffffff}.
    assert_eq!(u16::from_ne_bytes([body[66], body[67]]), 21);
    assert_eq!(
        u32::from_ne_bytes([body[68], body[69], body[70], body[71]]),
        0x42
    );
}

#[test]
fn state_parser_reads_mark_and_skips_key_attributes() {
    let mut body = vec![0u8; USERSA_INFO_LEN];
    // xfrm_usersa_info: id.daddr at 56, id.spi (BE) at 72, proto at 76,
    // saddr at 80, curlft.bytes at 160, curlft.packets at 168, reqid at
    // 208, family at 212.
    body[56..60].copy_from_slice(&[10, 0, 0, 2]);
    body[160..168].copy_from_slice(&5_000u64.to_ne_bytes());
    body[168..176].copy_from_slice(&42u64.to_ne_bytes());
    body[72..76].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    body[76] = 108;
    body[80..84].copy_from_slice(&[10, 0, 0, 1]);
    body[208..212].copy_from_slice(&7u32.to_ne_bytes());
    body[212..214].copy_from_slice(&2u16.to_ne_bytes());
    // An XFRMA_ALG_AEAD (18) attribute with "key" bytes, then XFRMA_MARK.
    let key = [0xAAu8; 13];
    body.extend_from_slice(&((4 + key.len()) as u16).to_ne_bytes());
    body.extend_from_slice(&18u16.to_ne_bytes());
    body.extend_from_slice(&key);
    body.extend_from_slice(&[0; 3]);
    body.extend_from_slice(&12u16.to_ne_bytes());
    body.extend_from_slice(&21u16.to_ne_bytes());
    body.extend_from_slice(&0x99u32.to_ne_bytes());
    body.extend_from_slice(&u32::MAX.to_ne_bytes());
    let s = parse_state(&body).unwrap();
    assert_eq!(s.spi, 0x0102_0304);
    assert_eq!(s.reqid, 7);
    assert_eq!(s.proto, 108);
    assert_eq!((s.bytes, s.packets), (5_000, 42));
    assert_eq!(s.daddr, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(s.saddr, "10.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(
        s.mark,
        Some(Mark {
            value: 0x99,
            mask: u32::MAX
        })
    );
    assert!(parse_state(&body[..100]).is_err());
}

#[test]
fn error_and_truncation() {
    assert_eq!(error_code(&(-2i32).to_ne_bytes()).unwrap(), 2);
    assert!(split_messages(&[40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
}

#[test]
fn delete_state_names_the_sa_by_its_full_identity() {
    use crate::model::{Mark, Selector, State};
    let s = State {
        family: Some(Family::Ipv4),
        saddr: "10.0.0.1".parse().unwrap(),
        daddr: "10.0.0.2".parse().unwrap(),
        proto: PROTO_ESP,
        spi: 0xc0ff_ee01,
        reqid: 9,
        mode: 0,
        mark: Some(Mark::exact(0x77)),
        if_id: 0,
        selector: Selector::wildcard(Family::Ipv4),
        bytes: 0,
        packets: 0,
        seq: 0,
        encap: false,
    };
    let req = delete_state_request(&s, 4);
    let m = split_messages(&req).unwrap();
    assert_eq!((m[0].message_type, m[0].seq), (0x11, 4)); // XFRM_MSG_DELSA
    let body = m[0].body;
    // xfrm_usersa_id: daddr (16), spi (network order), family, proto.
    assert_eq!(&body[..4], &[10, 0, 0, 2]);
    assert_eq!(&body[16..20], &0xc0ff_ee01u32.to_be_bytes());
    assert_eq!(u16::from_ne_bytes([body[20], body[21]]), 2);
    assert_eq!(body[22], PROTO_ESP);
    // Then XFRMA_SRCADDR (type 13) and XFRMA_MARK (type 21).
    let attrs = &body[24..];
    assert_eq!(u16::from_ne_bytes([attrs[2], attrs[3]]), 13);
    assert_eq!(&attrs[4..8], &[10, 0, 0, 1]);
    let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
    let mark = &attrs[len.div_ceil(4) * 4..];
    assert_eq!(u16::from_ne_bytes([mark[2], mark[3]]), 21);
    assert_eq!(
        u32::from_ne_bytes([mark[4], mark[5], mark[6], mark[7]]),
        0x77
    );
    assert_eq!(
        u32::from_ne_bytes([mark[8], mark[9], mark[10], mark[11]]),
        u32::MAX
    );
}
