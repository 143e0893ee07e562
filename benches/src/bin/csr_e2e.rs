//! 1,000 node CSRs approved and signed end to end: agents (1,000 Pod-bound
//! tokens) create CSRs on the embedded API server (RBAC on), the controller
//! validates against live Pods/Nodes/DaemonSet and writes approval and
//! certificate. Prints the wall time and compares it with what a client-go
//! controller at its default 5 QPS (2 writes per CSR, reads not counted)
//! would need. Target: < 5 s.

// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use harness::controller_cluster as common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams, PostParams};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let mut c = Cluster::start(n).await;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    // Create every CSR first (pending), then start the controller: the
    // measured time is the controller working through 1,000 pending CSRs.
    let mut creates = Vec::new();
    for node in &c.nodes {
        let csr = csr_object(
            &format!("ovn-ipsec-{}", node.name),
            node,
            &request_pem(&key, &node.chassis),
            7 * 86400,
        );
        let client = node.client.clone();
        creates.push(tokio::spawn(async move {
            let api: Api<CertificateSigningRequest> = Api::all(client);
            api.create(&PostParams::default(), &csr).await.unwrap();
        }));
    }
    for t in creates {
        t.await.unwrap();
    }
    // OVN_IPSEC_LIVE_CACHE / OVN_IPSEC_CONCURRENCY select the mode.
    let config = c.config();
    let (config_live_cache, config_concurrency) = (config.live_cache, config.concurrency);
    let started = Instant::now();
    c.start_controller(config).await;
    let api: Api<CertificateSigningRequest> = Api::all(c.admin.clone());
    let deadline = started + Duration::from_secs(120);
    loop {
        let issued = c.metrics.csr_count("signed", "Signed") as usize;
        if issued >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {issued}/{n} signed after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let list = api.list(&ListParams::default()).await.unwrap();
    let with_cert = list
        .items
        .iter()
        .filter(|c| matches!(outcome(c), Some(Outcome::Issued(_))))
        .count();
    assert_eq!(with_cert, n);
    let client_go = (2 * n) as f64 / 5.0;
    let secs = elapsed.as_secs_f64();
    let verdict = if n == 1000 {
        if secs < 5.0 {
            " (target < 5 s: met)"
        } else {
            " (target < 5 s: MISSED)"
        }
    } else {
        ""
    };
    println!(
        "csr_e2e: {n} node CSRs approved+signed end to end in {secs:.2} s ({:.0} CSRs/s){verdict}; \
         live cache {}, concurrency {}; includes controller start, CA creation, cache sync, initial list",
        n as f64 / secs,
        config_live_cache,
        config_concurrency,
    );
    println!(
        "baseline: client-go default QPS 5 => >= {client_go:.0} s for {n} CSRs (2 writes each); ratio {:.0}x",
        client_go / secs
    );
    c.stop().await;
}
