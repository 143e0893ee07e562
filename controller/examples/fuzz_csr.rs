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

use controller::fixtures::{mutate, passing, request};
use controller::pkcs10::{inspect_der, inspect_request};
use controller::validate::validate;
use kube_ovn_ipsec_api::pki::{PEM_CERTIFICATE_REQUEST, encode_pem, parse_pem};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

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
        .map(|p| parse_pem(p, PEM_CERTIFICATE_REQUEST).unwrap().remove(0))
        .collect();
    let (mut csr, live, policy) = passing(Vec::new());
    // The unmutated inputs must be accepted, or the mutations prove nothing.
    for (pem, der) in pems.iter().zip(&ders) {
        inspect_request(pem, &policy).unwrap();
        inspect_der(der, &policy).unwrap();
        csr.request = pem.clone();
        validate(&csr, &live, &policy).unwrap();
    }
    // A fuzz run reports its real elapsed time.
    #[allow(clippy::disallowed_methods)]
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
                        encode_pem(PEM_CERTIFICATE_REQUEST, &mutate(&ders[base], &ops)).as_bytes(),
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
