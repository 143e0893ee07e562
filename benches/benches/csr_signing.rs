//! Validate + sign in-process, one core: the controller's pure core for a
//! P-256 and an RSA-2048 node CSR (parse, key checks, self-signature, subject
//! and SAN checks, leaf signing with the built-in P-256 CA). Target: ≥ 2,000
//! validated+signed P-256 CSRs/s. Baseline in the same run: a default
//! client-go controller is limited to 5 QPS (≥ 2 writes per CSR).

// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant, SystemTime};

use controller::fixtures::{passing, request};
use controller::policy::Policy;
use controller::signer::{CaKeyAlgorithm, CertificateAuthority};
use controller::validate::{CsrView, LiveContext, validate};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn fixture(key: &rcgen::KeyPair) -> (CsrView, LiveContext, Policy) {
    passing(request(key))
}

fn bench(c: &mut Criterion) {
    let ca = CertificateAuthority::generate(
        CaKeyAlgorithm::EcdsaP256,
        Duration::from_secs(86400 * 365),
        SystemTime::now(),
    )
    .unwrap();
    let mut g = c.benchmark_group("csr_validate_and_sign");
    g.throughput(Throughput::Elements(1));
    for (name, alg) in [
        ("p256", &rcgen::PKCS_ECDSA_P256_SHA256),
        ("rsa2048", &rcgen::PKCS_RSA_SHA256),
    ] {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let (csr, live, policy) = fixture(&key);
        g.bench_function(name, |b| {
            b.iter(|| {
                let v = validate(&csr, &live, &policy).unwrap();
                ca.sign(&v, SystemTime::now()).unwrap()
            })
        });
    }
    g.finish();

    // One summary line per key type, measured here with a plain timed loop
    // (criterion's estimate above is the precise one; this is the figure
    // next to the target and the baseline).
    const CLIENT_GO: f64 = 5.0 / 2.0; // 5 QPS, 2 writes per CSR
    for (name, alg, target) in [
        ("p256", &rcgen::PKCS_ECDSA_P256_SHA256, Some(2000.0)),
        ("rsa2048", &rcgen::PKCS_RSA_SHA256, None),
    ] {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let (csr, live, policy) = fixture(&key);
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_secs(2) {
            let v = validate(&csr, &live, &policy).unwrap();
            std::hint::black_box(ca.sign(&v, SystemTime::now()).unwrap());
            n += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let verdict = match target {
            Some(t) if rate >= t => format!(" (target >= {t:.0}: met)"),
            Some(t) => format!(" (target >= {t:.0}: MISSED)"),
            None => String::new(),
        };
        println!(
            "csr_signing: {name} {rate:.0} validated+signed CSRs/s on one core{verdict}; \
             baseline client-go default QPS 5 => 2.5 CSRs/s (2 writes each); ratio {:.0}x",
            rate / CLIENT_GO
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
