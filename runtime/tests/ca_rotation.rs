//! A whole CA rotation, driven by the controller, on two simulated nodes:
//! the embedded API server with RBAC on, the real controller (built-in CA),
//! and per node an agent process with its Pod-bound token, its own
//! ovsdb-server, real strongSwan and the patched ovs-monitor-ipsec in the
//! node's namespaces, and a tunnel to the other node.
//!
//! 1. Both nodes run leaves from the first CA; IKE_SAs come up both ways.
//! 2. `ca rotate` (the CLI's own function, as the operator): the bundle
//!    becomes [old, new], the controller switches and announces the new CA;
//!    each agent renews onto it within its rotation spread and
//!    acknowledges the two-CA bundle.
//! 3. `ca retire` with the digest the nodes acknowledged: the bundle is
//!    [new]; each agent installs it and drops only its file of the old CA.
//!
//! IKE_SAs are re-established both ways after each step, and neither
//! charon logs an authentication failure at any point. The kernel here has
//! no ESP, so CHILD_SAs fail; only IKE_SAs are asserted.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::agent_node;

use std::time::{Duration, Instant};

use agent_node::{both_ways_establish, connect, no_auth_failures, prerequisites, start_node};
use apiserver::{ADMIN_TOKEN, ApiServer};
use harness::controller_cluster as cc;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube_ovn_ipsec_api::clock::SystemClock;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use kube_ovn_ipsec_runtime::ike::CA_FILE_PREFIX;
use testbed::ipsec::IpsecNode;
use testbed::netns::wait_for;

/// The CA file name the agent installs for `ca`.
fn ca_file(ca: &Certificate) -> String {
    format!("{CA_FILE_PREFIX}{}.pem", &ca.digest().to_hex()[..16])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_driven_rotation_moves_every_node_without_an_authentication_failure() {
    harness::use_agent_binary!();
    let script = prerequisites(&[]);
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let api = ApiServer::builder().rbac(true).start().await.unwrap();
    let admin = api.client(ADMIN_TOKEN).await.unwrap();
    let (fxs, _) = cc::populate(&api, &admin, 2).await;
    let (controller, first_pem) =
        harness::cluster::start_controller(&api, &admin, &["--ca-reload", "1s"]).await;
    let old = TrustBundle::from_pem(first_pem.as_bytes())
        .unwrap()
        .certificates()[0]
        .clone();

    let (na, nb) = IpsecNode::pair("koi-rot", &fxs[0].chassis, &fxs[1].chassis).unwrap();
    let spread = ["--rotation-spread", "4"];
    let a = start_node(na, &fxs[0], &api, dir.path(), script, &spread);
    let b = start_node(nb, &fxs[1], &api, dir.path(), script, &spread);
    for n in [&a, &b] {
        n.wait("active and ready", Duration::from_secs(60), |s| {
            s["generation"].as_u64().unwrap_or(0) >= 1
        })
        .await;
        n.leaf().verify_issued_by(&old).unwrap();
    }
    println!("both nodes active on the first CA after {:?}", t0.elapsed());
    connect(&a, &b);
    both_ways_establish(&a, &b, "first CA");

    // The operator rotates (what `kube-ovn-ipsec-controller ca rotate` runs).
    let settings = controller::ca::CaSettings {
        namespace: cc::NS.into(),
        algorithm: controller::signer::CaKeyAlgorithm::EcdsaP256,
        lifetime: Duration::from_secs(3650 * 86400),
    };
    let rotated_at = Instant::now();
    let both = controller::ca::rotate_ca(&admin, &settings, &SystemClock)
        .await
        .unwrap();
    let new = both
        .certificates()
        .iter()
        .find(|c| c.der() != old.der())
        .unwrap()
        .clone();
    assert_eq!(both.certificates().len(), 2);
    // The running controller switches and announces the new CA.
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), cc::NS);
    let fingerprint = new.digest().to_hex();
    wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let cm = futures::executor::block_on(maps.get(k8s::TRUST_CONFIGMAP)).ok()?;
        (cm.metadata.annotations?.get(k8s::SIGNING_CA_ANNOTATION)? == &fingerprint).then_some(())
    })
    .expect("the controller announces the new signing CA");
    let both_digest = both.digest().to_hex();
    for n in [&a, &b] {
        n.wait(
            "renewed onto the new CA with the two-CA bundle acknowledged",
            Duration::from_secs(60),
            |s| {
                s["trustDigest"].as_str() == Some(both_digest.as_str())
                    && s["configurationApplied"] == true
            },
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while n.leaf().verify_issued_by(&new).is_err() {
            assert!(
                Instant::now() < deadline,
                "{}: still on the old CA:\n{}",
                n.node.chassis(),
                n.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        n.wait("ready on the new leaf", Duration::from_secs(30), |s| {
            s["configurationApplied"] == true
        })
        .await;
        assert_eq!(n.own_ca_files(), {
            let mut v = vec![ca_file(&old), ca_file(&new)];
            v.sort();
            v
        });
        assert!(
            n.logs()
                .contains("CA rotation: renewing onto the signing CA"),
            "{}: the renewal was not the rotation's",
            n.node.chassis()
        );
    }
    println!(
        "both nodes on the new CA {:?} after the rotation",
        rotated_at.elapsed()
    );
    both_ways_establish(&a, &b, "new CA, bundle [old, new]");

    // The operator retires the old CA with the digest every node reports.
    let retired = controller::ca::retire_old_cas(&admin, cc::NS, &both_digest)
        .await
        .unwrap();
    let retired_digest = retired.digest().to_hex();
    for n in [&a, &b] {
        n.wait(
            "the retired bundle acknowledged",
            Duration::from_secs(60),
            |s| {
                s["trustDigest"].as_str() == Some(retired_digest.as_str())
                    && s["configurationApplied"] == true
            },
        )
        .await;
        assert_eq!(n.own_ca_files(), vec![ca_file(&new)]);
    }
    both_ways_establish(&a, &b, "bundle [new]");
    no_auth_failures(&[&a, &b]);
    assert!(a.key_dir.exists() && b.key_dir.exists());
    println!("whole rotation done after {:?}", t0.elapsed());
    controller.abort();
}
