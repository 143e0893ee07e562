//! The published output-protection lease as its consumer reads it: the
//! patched ovn-controller (`image/patches/ovn-controller-*.patch`) takes a
//! lease from the local `Open_vSwitch` row's `external_ids` only when all
//! four keys are there and the mark and reqid are ones the agent could have
//! allocated; anything else is no lease, with a reason for the log, and
//! while IPsec is on no tunnel is built without one (SPEC §4).
//!
//! These are the rules the patch's C implements, in one place on this side,
//! for whatever plays ovn-controller in the tests and the lab, and for the
//! tunnel options a lease turns into.

use std::collections::BTreeMap;
use std::fmt;

use crate::names::defaults::{MARK_MASK, REQID_MAX, REQID_MIN, RESERVED_MARK_BITS};
use crate::names::ovs::{
    EXTERNAL_ID_PROTECTION_MARK, EXTERNAL_ID_PROTECTION_REQID, OPTION_EGRESS_PKT_MARK,
    OPTION_IPSEC_MARK_OUT, OPTION_IPSEC_REQID, OPTION_REMOTE_NAME, PROTECTION_KEYS,
};

/// A usable lease: the mark a tunnel's packets carry and the reqid of the
/// node's IPsec policies and SAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishedLease {
    /// The output mark (never 0, never with [`RESERVED_MARK_BITS`]).
    pub mark: u32,
    /// The reqid, in `REQID_MIN..=REQID_MAX`.
    pub reqid: u32,
}

/// Why the published lease is not usable; its `Display` is the reason the
/// patched ovn-controller logs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseProblem {
    /// One of the four keys is absent or empty (never published, withdrawn,
    /// or half-written by hand).
    Missing(&'static str),
    /// The mark is not a non-zero 32-bit number.
    BadMark(String),
    /// The mark uses kube-proxy's bits.
    ReservedBits(u32),
    /// The reqid is not a number in `REQID_MIN..=REQID_MAX`.
    BadReqid(String),
}

impl fmt::Display for LeaseProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseProblem::Missing(key) => {
                write!(f, "no lease published (external_ids:{key} is missing)")
            }
            LeaseProblem::BadMark(v) => write!(
                f,
                "external_ids:{EXTERNAL_ID_PROTECTION_MARK}={v:?} is not a non-zero 32-bit mark"
            ),
            LeaseProblem::ReservedBits(m) => write!(
                f,
                "external_ids:{EXTERNAL_ID_PROTECTION_MARK}={m:#x} uses the reserved mark bits {RESERVED_MARK_BITS:#x}"
            ),
            LeaseProblem::BadReqid(v) => write!(
                f,
                "external_ids:{EXTERNAL_ID_PROTECTION_REQID}={v:?} is not a reqid in 1..{REQID_MAX}"
            ),
        }
    }
}

impl std::error::Error for LeaseProblem {}

impl PublishedLease {
    /// Reads the lease from `external_ids` as the patch does: the four keys
    /// present and non-empty, the mark non-zero and clear of the reserved
    /// bits, the reqid in `REQID_MIN..=REQID_MAX`.
    pub fn read(external_ids: &BTreeMap<String, String>) -> Result<Self, LeaseProblem> {
        for key in PROTECTION_KEYS {
            if external_ids.get(key).is_none_or(|v| v.is_empty()) {
                return Err(LeaseProblem::Missing(key));
            }
        }
        let value = |key: &str| external_ids.get(key).map(String::as_str).unwrap_or("");
        let mark_text = value(EXTERNAL_ID_PROTECTION_MARK);
        let mark = parse_u32(mark_text)
            .filter(|m| *m != 0)
            .ok_or_else(|| LeaseProblem::BadMark(mark_text.to_owned()))?;
        if mark & RESERVED_MARK_BITS != 0 {
            return Err(LeaseProblem::ReservedBits(mark));
        }
        let reqid_text = value(EXTERNAL_ID_PROTECTION_REQID);
        let reqid = parse_u32(reqid_text)
            .filter(|r| (REQID_MIN..=REQID_MAX).contains(r))
            .ok_or_else(|| LeaseProblem::BadReqid(reqid_text.to_owned()))?;
        Ok(PublishedLease { mark, reqid })
    }

    /// The four tunnel options of IPsec intent this lease gives a tunnel to
    /// `remote_name`, in [`crate::names::ovs::TUNNEL_PROTECTION_OPTIONS`]
    /// order. `egress_pkt_mark` is decimal: ovs-vswitchd parses it in base
    /// 10 only, so a hex mark would silently become 0 (plaintext).
    pub fn intent_options(&self, remote_name: &str) -> [(&'static str, String); 4] {
        [
            (OPTION_REMOTE_NAME, remote_name.to_owned()),
            (OPTION_EGRESS_PKT_MARK, self.mark.to_string()),
            (
                OPTION_IPSEC_MARK_OUT,
                format!("{}/{MARK_MASK:#x}", self.mark),
            ),
            (OPTION_IPSEC_REQID, self.reqid.to_string()),
        ]
    }
}

/// A mark or reqid as the agent writes it: decimal digits, or `0x` and
/// hexadecimal digits, at most 32 bits; signs, spaces, octal and trailing
/// text are refused.
fn parse_u32(s: &str) -> Option<u32> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ovs::{EXTERNAL_ID_PROTECTION_LEASE, EXTERNAL_ID_PROTECTION_NODE_UID};

    fn ids(mark: Option<&str>, reqid: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(EXTERNAL_ID_PROTECTION_NODE_UID.into(), "uid-1".into());
        m.insert(EXTERNAL_ID_PROTECTION_LEASE.into(), "lease-1".into());
        if let Some(v) = mark {
            m.insert(EXTERNAL_ID_PROTECTION_MARK.into(), v.into());
        }
        if let Some(v) = reqid {
            m.insert(EXTERNAL_ID_PROTECTION_REQID.into(), v.into());
        }
        m
    }

    #[test]
    fn a_whole_lease_reads_in_decimal_or_hex() {
        let want = PublishedLease {
            mark: 0x10001,
            reqid: 7,
        };
        assert_eq!(
            PublishedLease::read(&ids(Some("65537"), Some("7"))),
            Ok(want)
        );
        assert_eq!(
            PublishedLease::read(&ids(Some("0x10001"), Some("0x7"))),
            Ok(want)
        );
    }

    #[test]
    fn half_written_leases_are_missing_a_named_key() {
        assert_eq!(
            PublishedLease::read(&ids(Some("65537"), None)),
            Err(LeaseProblem::Missing(EXTERNAL_ID_PROTECTION_REQID))
        );
        assert_eq!(
            PublishedLease::read(&ids(Some(""), Some("1"))),
            Err(LeaseProblem::Missing(EXTERNAL_ID_PROTECTION_MARK))
        );
        let mut no_uid = ids(Some("65537"), Some("1"));
        no_uid.remove(EXTERNAL_ID_PROTECTION_NODE_UID);
        let problem = PublishedLease::read(&no_uid).unwrap_err();
        assert!(
            problem
                .to_string()
                .contains(EXTERNAL_ID_PROTECTION_NODE_UID)
        );
    }

    #[test]
    fn malformed_marks_are_refused_with_the_value() {
        for bad in [
            "abc",
            "-1",
            " 1",
            "1 ",
            "0",
            "0x",
            "4294967296",
            "0x1g",
            "+5",
        ] {
            let problem = PublishedLease::read(&ids(Some(bad), Some("1"))).unwrap_err();
            assert_eq!(problem, LeaseProblem::BadMark(bad.into()), "{bad:?}");
        }
        assert_eq!(
            PublishedLease::read(&ids(Some("0x14000"), Some("1"))),
            Err(LeaseProblem::ReservedBits(0x14000))
        );
    }

    #[test]
    fn reqids_outside_the_kernels_range_are_refused() {
        for bad in ["0", "2147483648", "0xffffffff", "x", ""] {
            let got = PublishedLease::read(&ids(Some("65537"), Some(bad)));
            if bad.is_empty() {
                assert_eq!(
                    got,
                    Err(LeaseProblem::Missing(EXTERNAL_ID_PROTECTION_REQID))
                );
            } else {
                assert_eq!(got, Err(LeaseProblem::BadReqid(bad.into())), "{bad:?}");
            }
        }
        assert!(PublishedLease::read(&ids(Some("65537"), Some("2147483647"))).is_ok());
    }

    #[test]
    fn intent_options_carry_the_mark_in_decimal() {
        let lease = PublishedLease {
            mark: 0x10001,
            reqid: 9,
        };
        assert_eq!(
            lease.intent_options("chassis-b"),
            [
                (OPTION_REMOTE_NAME, "chassis-b".to_owned()),
                (OPTION_EGRESS_PKT_MARK, "65537".to_owned()),
                (OPTION_IPSEC_MARK_OUT, "65537/0xffffffff".to_owned()),
                (OPTION_IPSEC_REQID, "9".to_owned()),
            ]
        );
    }
}
