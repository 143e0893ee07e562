//! Identity activation latency (SPEC §2 "Activation").
//!
//! The agent's activation exactly as its OVSDB writer makes it: one
//! `OvsdbIdentityAdapter::activate` (runtime), i.e. one guarded three-key
//! `other_config` write (`private_key`, `certificate`, `ca_cert` set
//! together, guarded by a `wait` on the map as the adapter last read or
//! wrote it) through the `ovsdb` crate's `MapWriter`, against a real
//! `ovsdb-server`; and in the same run the equivalent `ovs-vsctl set
//! Open_vSwitch . other_config:...` subprocess. Prints both medians and
//! their ratio:
//!
//! `ovsdb_activation: client p50=…ms ovs-vsctl p50=…ms ratio=…x`
//!
//! Target: client p50 ≤ 0.25 ms and ≥ 20× faster than ovs-vsctl.

// A bench measures real elapsed time.
#![allow(clippy::disallowed_methods)]
// A bench is a test-like binary: a panic is the failure report we want.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::cell::RefCell;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actors::ports::{OvsdbIdentity, OvsdbIdentityKeys};
use criterion::Criterion;
use kube_ovn_ipsec_runtime::agent::ovsdb_identity::OvsdbIdentityAdapter;
use ovsdb::Client;
use testbed::ovs::OvsdbServer;

/// The three keys pointing at generation `n`'s files.
fn generation(n: u64) -> OvsdbIdentityKeys {
    let path = |k: &str| Some(format!("/etc/origin/ovs_ipsec_keys/gen-{n}/{k}.pem"));
    OvsdbIdentityKeys {
        private_key: path("private_key"),
        certificate: path("certificate"),
        ca_cert: path("ca_cert"),
    }
}

/// The same change as `ovs-vsctl` arguments.
fn vsctl_args(keys: &OvsdbIdentityKeys) -> Vec<String> {
    [
        ("private_key", &keys.private_key),
        ("certificate", &keys.certificate),
        ("ca_cert", &keys.ca_cert),
    ]
    .into_iter()
    .map(|(k, v)| format!("other_config:{k}={}", v.as_deref().unwrap_or_default()))
    .collect()
}

fn next(counter: &RefCell<u64>) -> u64 {
    let mut c = counter.borrow_mut();
    *c += 1;
    *c
}

/// Runs `iters` activations of fresh generations, timing each alone into
/// `samples`; returns their total for criterion.
async fn timed<F, Fut>(
    iters: u64,
    counter: &RefCell<u64>,
    samples: &RefCell<Vec<Duration>>,
    mut activate: F,
) -> Duration
where
    F: FnMut(OvsdbIdentityKeys) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let keys = generation(next(counter));
        let t = Instant::now();
        activate(keys).await;
        let e = t.elapsed();
        samples.borrow_mut().push(e);
        total += e;
    }
    total
}

fn median(samples: &[Duration]) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .sample_size(30)
        .configure_from_args();

    let dir = tempfile::tempdir().unwrap();
    let server = OvsdbServer::start_vswitch(dir.path()).unwrap();
    server
        .vsctl(&["set", "Open_vSwitch", ".", "other_config:unrelated=keep"])
        .unwrap();
    let vsctl = testbed::require_program("ovs-vsctl").unwrap();
    // One thread for the caller and the connection task, as in the rekey
    // bench: the figure is the round trip itself. The agent runs on tokio's
    // multi-thread runtime, where the writer and the connection task may sit
    // on different workers; that wake-up is not in this figure.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(Client::connect_str(&server.address())).unwrap();
    // The agent builds one adapter at start-up and activates every
    // generation through it, so its view of other_config is the map it
    // last wrote; before the first activation, the identity actor's
    // recovery has read the keys through it.
    let agent = &OvsdbIdentityAdapter::new(client.clone());
    rt.block_on(agent.read()).unwrap();

    let counter = Rc::new(RefCell::new(0u64));
    let cold = Rc::new(RefCell::new(Vec::new()));
    let warm = Rc::new(RefCell::new(Vec::new()));
    let subprocess = Rc::new(RefCell::new(Vec::new()));

    let mut group = c.benchmark_group("ovsdb_activation");
    // What the agent's OVSDB writer calls: `activate` on its adapter, one
    // round trip (`wait` on the map as last written + `mutate` of the three
    // keys, one transaction).
    group.bench_function("activate", |b| {
        b.iter_custom(|iters| {
            rt.block_on(timed(iters, &counter, &warm, |keys| async move {
                agent.activate(&keys).await.unwrap();
            }))
        })
    });
    // Cold: an adapter without a view reads other_config, then makes the
    // same guarded transaction (two round trips), as an activation whose
    // writer has not read or written the map yet.
    group.bench_function("activate_without_view", |b| {
        b.iter_custom(|iters| {
            rt.block_on(timed(iters, &counter, &cold, |keys| {
                let adapter = OvsdbIdentityAdapter::new(client.clone());
                async move { adapter.activate(&keys).await.unwrap() }
            }))
        })
    });
    let db = format!("--db={}", server.address());
    group.bench_function("ovs-vsctl", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let args = vsctl_args(&generation(next(&counter)));
                let t = Instant::now();
                // --no-wait: no ovs-vswitchd runs here to acknowledge.
                let st = Command::new(&vsctl)
                    .args([db.as_str(), "--no-wait", "set", "Open_vSwitch", "."])
                    .args(&args)
                    .status()
                    .unwrap();
                let e = t.elapsed();
                assert!(st.success());
                subprocess.borrow_mut().push(e);
                total += e;
            }
            total
        })
    });
    group.finish();
    c.final_summary();

    // The unrelated key survived every activation.
    let kept = server
        .vsctl(&["get", "Open_vSwitch", ".", "other_config:unrelated"])
        .unwrap();
    assert_eq!(kept.trim(), "keep");

    let cold_p50 = median(&cold.borrow());
    let warm_p50 = median(&warm.borrow());
    let vsctl_p50 = median(&subprocess.borrow());
    let ratio = |c: Duration| vsctl_p50.as_secs_f64() / c.as_secs_f64().max(1e-9);
    println!(
        "ovsdb_activation: client p50={:.3}ms ovs-vsctl p50={:.3}ms ratio={:.0}x (the agent's activate: one guarded transaction; {} samples vs {} ovs-vsctl runs)",
        ms(warm_p50),
        ms(vsctl_p50),
        ratio(warm_p50),
        warm.borrow().len(),
        subprocess.borrow().len(),
    );
    println!(
        "ovsdb_activation: client cold read+guarded write p50={:.3}ms ratio={:.0}x (two round trips)",
        ms(cold_p50),
        ratio(cold_p50),
    );
    println!("ovsdb_activation: target client p50 <= 0.250ms and ratio >= 20x");
    if subprocess.borrow().len() < 10 {
        // `cargo test` runs each bench once as a smoke test.
        println!(
            "ovsdb_activation: smoke run (single samples, debug build): figures are not meaningful; use cargo bench"
        );
    }
}
