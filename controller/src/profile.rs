//! The leaf profile: what a certificate this project issues looks like
//! (SPEC §6), in one place for the built-in signer, which writes it, and the
//! cert-manager result check, which holds an external issuer to it.
//!
//! - subject `O=kube-ovn, CN=<chassis>`, one SAN `DNS:<chassis>`;
//! - `NotBefore = now − 5 min` ([`BACKDATE`], clock skew between nodes),
//!   `NotAfter = now + lifetime`, capped at the CA's own `NotAfter` so no
//!   leaf outlives its issuer; an issued leaf may exceed the requested
//!   lifetime by at most the backdate and [`LIFETIME_SLACK`];
//! - key usage `digitalSignature`, plus `keyEncipherment` for RSA keys;
//! - extended key usage `id-kp-ipsecTunnel` (api's
//!   [`IPSEC_TUNNEL_EKU`](kube_ovn_ipsec_api::pki::IPSEC_TUNNEL_EKU)): the
//!   X.509 meaning of the Kubernetes usage `ipsec tunnel`, as Kubernetes'
//!   own signers map it. strongSwan and libreswan do not require an EKU for
//!   IKE, and do not reject this one;
//! - `basicConstraints CA:FALSE`.
//!
//! The numbers are api's ([`kube_ovn_ipsec_api::pki::LEAF_BACKDATE`],
//! [`kube_ovn_ipsec_api::pki::LEAF_LIFETIME_SLACK`]), which the agent's own
//! check of an issued leaf uses too.

use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::clock::unix_seconds;
use kube_ovn_ipsec_api::pki::{IPSEC_TUNNEL_EKU, LEAF_BACKDATE, LEAF_LIFETIME_SLACK};
use rcgen::{ExtendedKeyUsagePurpose, KeyUsagePurpose};

use crate::pkcs10::KeyKind;

/// How far `NotBefore` is backdated to tolerate clock skew between nodes.
pub const BACKDATE: Duration = LEAF_BACKDATE;

/// Slack allowed on a returned lifetime beyond the request (issuer clocks
/// and rounding).
pub const LIFETIME_SLACK: Duration = LEAF_LIFETIME_SLACK;

/// The leaf's key usages for a subject key of `kind`.
pub fn key_usages(kind: KeyKind) -> Vec<KeyUsagePurpose> {
    match kind {
        KeyKind::Rsa(_) => vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ],
        KeyKind::EcdsaP256 => vec![KeyUsagePurpose::DigitalSignature],
    }
}

/// The leaf's extended key usages: `id-kp-ipsecTunnel` only.
pub fn extended_key_usages() -> Vec<ExtendedKeyUsagePurpose> {
    vec![ExtendedKeyUsagePurpose::Other(IPSEC_TUNNEL_EKU.to_vec())]
}

/// The validity a leaf signed at `now` for `lifetime` gets, in Unix
/// seconds: backdated by [`BACKDATE`], ending at `now + lifetime` or at the
/// CA's `NotAfter` (`ca_not_after`), whichever is first.
pub fn leaf_validity(now: SystemTime, lifetime: Duration, ca_not_after: i64) -> (i64, i64) {
    let now_s = unix_seconds(now);
    let back = i64::try_from(BACKDATE.as_secs()).unwrap_or(i64::MAX);
    let life = i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX);
    (
        now_s.saturating_sub(back),
        now_s.saturating_add(life).min(ca_not_after),
    )
}

/// Checks an issued leaf's validity (`not_before`, `not_after`, Unix
/// seconds) at `now` against the `requested` lifetime: valid now (allowing
/// [`LIFETIME_SLACK`] of issuer clock skew on `NotBefore`), and neither its
/// whole window nor what remains of it longer than the request plus
/// [`BACKDATE`] and [`LIFETIME_SLACK`]. The error says which.
pub fn check_lifetime(
    not_before: i64,
    not_after: i64,
    now: SystemTime,
    requested: Duration,
) -> Result<(), String> {
    let now_s = unix_seconds(now);
    let slack = i64::try_from(LIFETIME_SLACK.as_secs()).unwrap_or(i64::MAX);
    let allowed = (requested + BACKDATE + LIFETIME_SLACK).as_secs();
    let allowed = i64::try_from(allowed).unwrap_or(i64::MAX);
    if not_after <= now_s || not_before > now_s.saturating_add(slack) {
        return Err("certificate is not valid now".into());
    }
    let window = not_after.saturating_sub(not_before);
    if window > allowed || not_after.saturating_sub(now_s) > allowed {
        return Err(format!(
            "validity {window}s exceeds the requested {}s",
            requested.as_secs()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_validity_is_backdated_and_capped_at_the_ca() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let week = Duration::from_secs(7 * 86400);
        assert_eq!(
            leaf_validity(now, week, i64::MAX),
            (1_000_000 - 300, 1_000_000 + 7 * 86400)
        );
        assert_eq!(leaf_validity(now, week, 1_000_100).1, 1_000_100);
    }

    #[test]
    fn lifetime_check_allows_backdate_and_slack_only() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let day = Duration::from_secs(86400);
        let (nb, na) = leaf_validity(now, day, i64::MAX);
        check_lifetime(nb, na, now, day).unwrap();
        check_lifetime(nb, na + 60, now, day).unwrap();
        assert!(check_lifetime(nb, na + 61, now, day).is_err());
        assert!(check_lifetime(nb, 999_999, now, day).is_err(), "expired");
        assert!(check_lifetime(1_000_061, na, now, day).is_err(), "future");
    }
}
