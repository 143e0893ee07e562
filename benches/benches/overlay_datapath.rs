//! The encrypted overlay's cost on a full kernel: pod-to-pod ping RTT and
//! bulk TCP throughput through plaintext Geneve, then — on the same two
//! nodes in the same run — through Geneve encrypted by kernel ESP, with the
//! agent's guards armed, SAs negotiated by strongSwan and the patched
//! ovs-monitor-ipsec (the setup of `runtime/tests/overlay.rs`). Prints
//! `overlay_datapath: ...` lines and the ESP/plaintext ratios.
//!
//! Where the host kernel lacks ESP, GENEVE or openvswitch, `cargo bench`
//! (`--bench`) first times guest boots to a trivial command (TCG, then KVM
//! with a short limit: nested KVM is slow or stalls here — TESTBED.md), then
//! re-runs this binary inside a TCG guest. Absolute figures under TCG are
//! software emulation and mean little; the ratio is the figure.
//!
//! `--quick` (what scripts/kernel-tests.sh runs in its guest, so a bench
//! that no longer works fails CI) measures briefly. Under `cargo test` on a
//! host without the features it only says where it runs.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A bench measures real elapsed time against real daemons.
#![allow(clippy::disallowed_methods)]

use harness::ike_node;

use std::path::Path;
use std::time::{Duration, Instant};

use ike_node::{Node, Overlay, POD_B, overlay_pair, wait_for_pod_reply};
use testbed::guest::{GuestKernel, run_in_guest};
use testbed::netns::wait_for;
use testbed::overlay::{self, PingStats, Throughput};

const TCP_PORT: u16 = 5201;

/// What one pass over the data path measured.
#[derive(Debug)]
struct Figures {
    ping: PingStats,
    tcp: Vec<Throughput>,
}

impl Figures {
    fn mbit(&self) -> Vec<f64> {
        self.tcp.iter().map(Throughput::mbit_per_s).collect()
    }

    fn median_mbit(&self) -> f64 {
        let mut v = self.mbit();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

struct Sizes {
    pings: u32,
    tcp_runs: usize,
    tcp_for: Duration,
}

fn measure(a: &Node, b: &Node, sizes: &Sizes) -> Figures {
    let ping = overlay::ping(
        a.node.netns(),
        POD_B,
        sizes.pings,
        Duration::from_millis(50),
    )
    .unwrap();
    let tcp = (0..sizes.tcp_runs)
        .map(|i| {
            overlay::tcp_throughput(
                a.node.netns(),
                b.node.netns(),
                POD_B,
                TCP_PORT + i as u16,
                sizes.tcp_for,
            )
            .unwrap()
        })
        .collect();
    Figures { ping, tcp }
}

async fn datapath(sizes: Sizes) {
    let t0 = Instant::now();
    let script =
        testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let Overlay { ovn, a, b, ca: _ca } =
        overlay_pair("koi-ovb", "kube-ovn-ipsec overlay bench CA", script).await;
    wait_for_pod_reply(&a, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no pod reply:\n{}", a.node.diagnostics()));
    println!(
        "overlay_datapath: two nodes up after {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let plain = measure(&a, &b, &sizes);
    let t1 = Instant::now();
    ovn.enable(&a, &b);
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        (a.node.routed_conns().ok()?.len() >= 2 && b.node.routed_conns().ok()?.len() >= 2)
            .then_some(())
    })
    .expect("conns routed");
    wait_for_pod_reply(&a, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no encrypted pod reply:\n{}", a.node.diagnostics()));
    println!(
        "overlay_datapath: IPsec intent to the first encrypted pod reply: {:.1} s",
        t1.elapsed().as_secs_f64()
    );
    let esp = measure(&a, &b, &sizes);

    for (name, f) in [("plaintext geneve", &plain), ("ESP geneve", &esp)] {
        println!(
            "overlay_datapath: {name:17} ping {}/{} rtt avg {:.3} ms; TCP {:?} Mbit/s (median {:.1})",
            f.ping.received,
            f.ping.transmitted,
            f.ping.rtt_avg_ms.unwrap_or(f64::NAN),
            f.mbit()
                .iter()
                .map(|m| format!("{m:.1}"))
                .collect::<Vec<_>>(),
            f.median_mbit()
        );
    }
    let rtt = esp.ping.rtt_avg_ms.unwrap_or(f64::NAN) / plain.ping.rtt_avg_ms.unwrap_or(f64::NAN);
    let tput = esp.median_mbit() / plain.median_mbit();
    println!(
        "overlay_datapath: ESP/plaintext: RTT x{rtt:.2}, TCP throughput x{tput:.2} \
         (baseline: plaintext Geneve on the same nodes, same run)"
    );
    assert!(
        esp.ping.received * 10 >= esp.ping.transmitted * 9,
        "encrypted pings lost: {:?}",
        esp.ping
    );
    assert!(esp.tcp.iter().all(|t| t.bytes > 0), "{:?}", esp.tcp);
}

/// Boot-to-command time of `runs` guests (`true` as the command).
fn boot_times(kernel: &GuestKernel, kvm: bool, runs: usize, limit: Duration) -> Vec<String> {
    (0..runs)
        .map(|_| {
            let mut sink = std::io::sink();
            match run_in_guest(
                kernel,
                kvm,
                Path::new("/"),
                &["true".to_string()],
                &[],
                limit,
                &mut sink,
            ) {
                Ok(r) => format!("{:.1} s", r.boot.as_secs_f64()),
                Err(e) => format!("no boot within {limit:?} ({})", first_line(&e.to_string())),
            }
        })
        .collect()
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sizes = if quick {
        Sizes {
            pings: 20,
            tcp_runs: 1,
            tcp_for: Duration::from_secs(2),
        }
    } else {
        Sizes {
            pings: 100,
            tcp_runs: 3,
            tcp_for: Duration::from_secs(5),
        }
    };
    testbed::guest::bench_on_full_kernel(
        "overlay_datapath",
        &args,
        Duration::from_secs(900),
        datapath(sizes),
        |kernel| {
            println!(
                "overlay_datapath: guest boot to command, TCG: {:?}",
                boot_times(kernel, false, 3, Duration::from_secs(120))
            );
            let kvm = if Path::new("/dev/kvm").exists() {
                format!("{:?}", boot_times(kernel, true, 1, Duration::from_secs(60)))
            } else {
                "no /dev/kvm".to_string()
            };
            println!("overlay_datapath: guest boot to command, KVM: {kvm}");
        },
    )
    .unwrap();
}
