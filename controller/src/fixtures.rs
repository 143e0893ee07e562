//! Fixtures shared by the controller's tests, its fuzz example and the
//! benches (feature `test-util`): a valid node CSR, a CSR view and live
//! context that pass every identity check, and the byte mutations the fuzz
//! and the proptest apply to requests.

#![allow(clippy::expect_used)] // test support: a panic is a test failure

use std::collections::BTreeMap;

use rcgen::{CertificateParams, DnType, KeyPair};

use crate::policy::Policy;
use crate::validate::{CsrView, DaemonSetView, LiveContext, NodeView, PodView};

/// The chassis the fixtures' requests and contexts name.
pub const CHASSIS: &str = "chassis-1";

/// A PEM request for [`CHASSIS`] (O=kube-ovn, CN and DNS SAN the chassis),
/// after `tweak` edits the parameters.
pub fn request_with(key: &KeyPair, tweak: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
    let mut params = CertificateParams::new(vec![CHASSIS.to_owned()]).expect("fixture parameters");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "kube-ovn");
    params.distinguished_name.push(DnType::CommonName, CHASSIS);
    tweak(&mut params);
    params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .expect("fixture request")
        .into_bytes()
}

/// A valid PEM request for [`CHASSIS`].
pub fn request(key: &KeyPair) -> Vec<u8> {
    request_with(key, |_| {})
}

/// A CSR (carrying `request`) and a live context that pass every identity
/// check under the default policy, so the request bytes decide the outcome.
pub fn passing(request: Vec<u8>) -> (CsrView, LiveContext, Policy) {
    let policy = Policy::default();
    let extra = |k: &str, v: &str| (format!("authentication.kubernetes.io/{k}"), vec![v.into()]);
    let csr = CsrView {
        name: "ovn-ipsec-node-1".into(),
        signer_name: "kubeovn.io/signer".into(),
        username: policy.requester(),
        extra: BTreeMap::from([
            extra("pod-uid", "pod-uid"),
            extra("pod-name", "cni-1"),
            extra("node-name", "node-1"),
        ]),
        usages: vec!["ipsec tunnel".into()],
        expiration_seconds: Some(7 * 86400),
        annotations: BTreeMap::from([
            ("kube-ovn.io/ipsec-node".into(), "node-1".into()),
            ("kube-ovn.io/ipsec-node-uid".into(), "node-uid".into()),
            ("kube-ovn.io/ipsec-chassis".into(), CHASSIS.into()),
        ]),
        request,
    };
    let live = LiveContext {
        pod: Some(PodView {
            name: "cni-1".into(),
            uid: "pod-uid".into(),
            node_name: "node-1".into(),
            owner_daemon_set_uid: Some("ds".into()),
            template_hash: Some("h".into()),
            terminating: false,
            finished: false,
        }),
        node: Some(NodeView {
            name: "node-1".into(),
            uid: "node-uid".into(),
            chassis: Some(CHASSIS.into()),
        }),
        daemon_set: Some(DaemonSetView {
            uid: "ds".into(),
            current_template_hash: Some("h".into()),
        }),
    };
    (csr, live, policy)
}

/// `base` after `ops`, each `(op, position, byte)`: flip bits, truncate,
/// insert, delete or overwrite — the shapes an attacker or a bug produces.
pub fn mutate(base: &[u8], ops: &[(u8, usize, u8)]) -> Vec<u8> {
    let mut out = base.to_vec();
    for &(op, pos, byte) in ops {
        if out.is_empty() {
            out.push(byte);
            continue;
        }
        let i = pos % out.len();
        match op % 5 {
            0 => out[i] ^= byte | 1,
            1 => out.truncate(i),
            2 => out.insert(i, byte),
            3 => {
                out.remove(i);
            }
            _ => out[i] = byte,
        }
    }
    out
}
