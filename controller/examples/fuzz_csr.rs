//! Fuzzes the CSR parser: `cargo run --release -p kube-ovn-ipsec-controller
//! --example fuzz_csr -- 1000000` runs that many proptest cases over DER and
//! PEM mutations of valid RSA and P-256 requests (bit flips, truncation,
//! insertion, deletion, overwrite) and random bytes, and prints the count.
//! A panic anywhere fails the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use controller::validate::{Policy, inspect_der, inspect_request};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn request(key: &rcgen::KeyPair) -> Vec<u8> {
    let mut p = rcgen::CertificateParams::new(vec!["chassis-1".to_owned()]).unwrap();
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
    let started = std::time::Instant::now();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..6);
    let strategy = (0u8..5, ops, proptest::collection::vec(any::<u8>(), 0..256));
    let ran = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&strategy, |(which, ops, random)| {
            ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match which {
                0 => drop(inspect_der(&mutate(&ders[0], &ops), &policy)),
                1 => drop(inspect_der(&mutate(&ders[1], &ops), &policy)),
                2 => drop(inspect_request(&mutate(&pems[0], &ops), &policy)),
                3 => drop(inspect_request(&mutate(&pems[1], &ops), &policy)),
                _ => drop(inspect_der(&random, &policy)),
            }
            Ok(())
        })
        .unwrap();
    let ran = ran.into_inner();
    println!(
        "fuzz_csr: {ran} cases without a panic in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
