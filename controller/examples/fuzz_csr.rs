//! Fuzzes the CSR parser: `cargo run --release -p kube-ovn-ipsec-controller
//! --example fuzz_csr -- 1000000` runs that many proptest cases over DER and
//! PEM mutations of valid RSA-2048 and P-256 requests (bit flips, truncation,
//! insertion, deletion, overwrite) and random bytes, and prints the count,
//! the wall time and how far the inputs got (the outcome of each case: the
//! denial reason, or `accepted`), so a run that only ever exercises the first
//! length check is visible. A fifth of the cases go through the whole
//! [`validate`] (identity checks against a matching live context, then the
//! request) the way the controller calls it. A panic anywhere fails the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use controller::validate::{
    CsrView, DaemonSetView, LiveContext, NodeView, PodView, Policy, inspect_der, inspect_request,
    validate,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn request(key: &rcgen::KeyPair) -> Vec<u8> {
    let mut p = rcgen::CertificateParams::new(vec!["chassis-1".to_owned()]).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "kube-ovn");
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "chassis-1");
    p.serialize_request(key)
        .unwrap()
        .pem()
        .unwrap()
        .into_bytes()
}

/// A CSR and live context that pass every identity check, so the request
/// bytes decide the outcome.
fn identity(policy: &Policy) -> (CsrView, LiveContext) {
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
            ("kube-ovn.io/ipsec-chassis".into(), "chassis-1".into()),
        ]),
        request: Vec::new(),
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
            chassis: Some("chassis-1".into()),
        }),
        daemon_set: Some(DaemonSetView {
            uid: "ds".into(),
            current_template_hash: Some("h".into()),
        }),
    };
    (csr, live)
}

fn mutate(base: &[u8], ops: &[(u8, usize, u8)]) -> Vec<u8> {
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

fn main() {
    let cases: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let rsa = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let pems = [request(&p256), request(&rsa)];
    let ders: Vec<Vec<u8>> = pems
        .iter()
        .map(|p| pem::parse(p).unwrap().into_contents())
        .collect();
    let policy = Policy::default();
    let (mut csr, live) = identity(&policy);
    // The unmutated inputs must be accepted, or the mutations prove nothing.
    for (pem, der) in pems.iter().zip(&ders) {
        inspect_request(pem, &policy).unwrap();
        inspect_der(der, &policy).unwrap();
        csr.request = pem.clone();
        validate(&csr, &live, &policy).unwrap();
    }
    let started = std::time::Instant::now();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..6);
    let strategy = (
        0u8..5,
        any::<bool>(),
        ops,
        proptest::collection::vec(any::<u8>(), 0..256),
    );
    let outcomes: Mutex<BTreeMap<(&str, &str), u64>> = Mutex::new(BTreeMap::new());
    runner
        .run(&strategy, |(which, rsa, ops, random)| {
            let base = usize::from(rsa);
            let (path, result) = match which {
                0 => (
                    "der",
                    inspect_der(&mutate(&ders[base], &ops), &policy).map(drop),
                ),
                1 => (
                    "pem",
                    inspect_request(&mutate(&pems[base], &ops), &policy).map(drop),
                ),
                // A mutated body inside an intact PEM envelope reaches the
                // DER parser more often than a mutated PEM text does.
                2 => (
                    "pem(der)",
                    inspect_request(
                        pem::encode(&pem::Pem::new(
                            "CERTIFICATE REQUEST",
                            mutate(&ders[base], &ops),
                        ))
                        .as_bytes(),
                        &policy,
                    )
                    .map(drop),
                ),
                3 => {
                    let mut csr = csr.clone();
                    csr.request = mutate(&pems[base], &ops);
                    ("validate", validate(&csr, &live, &policy).map(drop))
                }
                _ => ("random", inspect_der(&random, &policy).map(drop)),
            };
            let outcome = match &result {
                Ok(()) => "accepted",
                Err(d) => d.reason(),
            };
            *outcomes.lock().unwrap().entry((path, outcome)).or_default() += 1;
            Ok(())
        })
        .unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let outcomes = outcomes.into_inner().unwrap();
    let ran: u64 = outcomes.values().sum();
    for ((path, outcome), n) in &outcomes {
        println!("  {path:<9} {outcome:<30} {n}");
    }
    println!(
        "fuzz_csr: {ran} cases (requested {cases}) through the parser/validator without a panic in {elapsed:.1} s ({:.0} cases/s)",
        ran as f64 / elapsed
    );
    assert_eq!(ran, u64::from(cases), "every requested case must have run");
}
