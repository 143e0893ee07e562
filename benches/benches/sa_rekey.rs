//! The SA rekey paths on a full kernel, with the real daemons and traffic
//! running: two nodes of the overlay (`ike_node::overlay_pair`: kernel
//! ESP, strongSwan, the patched ovs-monitor-ipsec, Geneve through OVS), a
//! ping stream from pod A to pod B every 20 ms, and one after another:
//!
//! - **negotiation** (the baseline): the pair's IKE_SA taken down and its
//!   two connections brought up by name, to every old SA gone, new ones in
//!   place and a reply — one IKE_SA and two CHILD_SAs negotiated;
//! - **CHILD_SA rekey** (`ipsec rekey <conn>{n}`), to its old SAs gone;
//! - **IKE_SA rekey** (`ipsec rekey <conn>[n]`), what replaces the
//!   periodic reauthentication (docs/decisions.md), to the old IKE_SA
//!   gone;
//! - **renewal**: node A's certificate renewed in OVSDB, to the monitor's
//!   configuration naming it — the established SAs are kept;
//! - **rebuild** (`tunnels/rebuild`, what a retired CA asks for): the kept
//!   connections replaced make-before-break, to their old SAs gone.
//!
//! Each prints its time, the echoes lost from its trigger to a second
//! after it completed, every XFRM error counter that grew on either node,
//! and its time as a ratio of the negotiation measured in the same run.
//!
//! Like `overlay_datapath`, a host without ESP, GENEVE or openvswitch
//! re-runs this binary in the TCG guest under `--bench`; `--quick` (one
//! round, what scripts/kernel-tests.sh runs) keeps it working in CI.

// Benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A bench measures real elapsed time against real daemons.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use harness::ike_node::{Node, Overlay, POD_B, overlay_pair, wait_for_pod_reply};
use testbed::netns::wait_for;
use testbed::overlay::xfrm_stats;
use testbed::probe::{ProbeStream, unix_now};

/// The probe stream's interval: fine enough to see a gap of tens of ms.
const PROBE: Duration = Duration::from_millis(20);

/// How long any one operation may take.
const LIMIT: Duration = Duration::from_secs(90);

/// One measured operation.
struct Measured {
    what: &'static str,
    took: Duration,
    lost: u32,
    sent: u32,
    grown: Vec<String>,
    note: String,
}

/// The ESP SPIs in `n`'s kernel.
fn spis(n: &Node) -> BTreeSet<String> {
    n.node.esp_spis(None).unwrap()
}

/// The installed CHILD_SAs of `n` as `name{n}`.
fn children(n: &Node) -> Vec<String> {
    let status = n.node.ipsec(&["status"]).unwrap_or_default();
    status
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim_start().split_once(':')?;
            (name.contains('{') && rest.trim_start().starts_with("INSTALLED"))
                .then(|| name.to_string())
        })
        .collect()
}

/// Whether `n` has a CHILD_SA installed for each direction of the pair's
/// tunnel (its `-in-` and its `-out-` connection).
fn both_directions(n: &Node) -> bool {
    let c = children(n);
    c.iter().any(|c| c.contains("-in-")) && c.iter().any(|c| c.contains("-out-"))
}

/// The ESP SPIs (`0x…`) of the CHILD_SA `name{n}` as `ipsec status` shows
/// it (`ESP SPIs: <in>_i <out>_o`).
fn child_spis(n: &Node, child: &str) -> Vec<String> {
    let status = n.node.ipsec(&["status"]).unwrap_or_default();
    status
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{child}:")))
        .and_then(|l| l.split_once("SPIs:"))
        .map(|(_, spis)| {
            spis.split_whitespace()
                .filter_map(|s| s.split('_').next())
                .map(|s| format!("0x{s}"))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `op` with the probe stream watching, waits for `done`, and says
/// what it cost.
fn measure(
    what: &'static str,
    o: &Overlay,
    stream: &ProbeStream,
    op: impl FnOnce(),
    mut done: impl FnMut() -> Option<String>,
) -> Measured {
    let before = [
        xfrm_stats(o.a.node.netns()).unwrap(),
        xfrm_stats(o.b.node.netns()).unwrap(),
    ];
    let t_from = unix_now();
    let t0 = Instant::now();
    op();
    let note = wait_for(LIMIT, Duration::from_millis(10), &mut done).unwrap_or_else(|| {
        panic!(
            "{what}: not done within {LIMIT:?}\n{}",
            o.a.node.diagnostics()
        )
    });
    let took = t0.elapsed();
    // Echoes sent up to here are judged once the stream has moved on.
    std::thread::sleep(Duration::from_secs(2));
    let t = stream.log().tally(t_from - 0.5, unix_now() - 1.0);
    let mut grown = Vec::new();
    for (name, n, b) in [("A", &o.a, &before[0]), ("B", &o.b, &before[1])] {
        for (counter, by) in xfrm_stats(n.node.netns()).unwrap().growth_since(b) {
            grown.push(format!("{name} {counter} +{by}"));
        }
    }
    Measured {
        what,
        took,
        lost: t.lost,
        sent: t.sent,
        grown,
        note,
    }
}

async fn rekey_paths(rounds: usize) {
    let script =
        testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    let o = overlay_pair("koi-srk", "kube-ovn-ipsec rekey bench CA", script).await;
    o.ovn.enable(&o.a, &o.b);
    wait_for_pod_reply(&o.a, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no encrypted pod reply:\n{}", o.a.node.diagnostics()));
    // Both CHILD_SAs of the pair up: the monitors bring a new tunnel's
    // connections up by name (docs/ovs-monitor-ipsec-patch.md).
    wait_for(LIMIT, Duration::from_millis(100), || {
        both_directions(&o.a).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "not both CHILD_SAs:\n{}\n{}",
            o.a.node.ipsec(&["statusall"]).unwrap_or_default(),
            o.b.node.ipsec(&["statusall"]).unwrap_or_default()
        )
    });
    let stream = ProbeStream::start(o.a.node.netns(), POD_B, PROBE).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let mut results: Vec<Measured> = Vec::new();
    for round in 0..rounds {
        // The baseline: one IKE_SA with its two CHILD_SAs negotiated.
        let conns: Vec<String> = {
            let mut c: Vec<String> = children(&o.a)
                .iter()
                .map(|n| n.split('{').next().unwrap_or(n).to_string())
                .collect();
            c.sort();
            c.dedup();
            c
        };
        let old = spis(&o.a);
        let ikes = o.a.node.ike_sas().unwrap();
        results.push(measure(
            "negotiation",
            &o,
            &stream,
            || {
                for sa in &ikes {
                    let _ = o.a.node.ipsec(&[
                        "stroke",
                        "down-nb",
                        &format!("{}[{}]", sa.conn, sa.unique_id),
                    ]);
                }
                for c in &conns {
                    let _ = o.a.node.ipsec(&["stroke", "up-nb", c]);
                }
            },
            || {
                // Not "as many SAs as before": both nodes may have
                // initiated the same CHILD_SA at the tunnel's bring-up,
                // and a renegotiation makes one of each.
                let now = spis(&o.a);
                if !now.is_disjoint(&old) || !both_directions(&o.a) {
                    return None;
                }
                let p =
                    testbed::overlay::ping(o.a.node.netns(), POD_B, 1, Duration::from_millis(100))
                        .ok()?;
                (p.received == 1)
                    .then(|| format!("{} new SAs ({} before), a reply", now.len(), old.len()))
            },
        ));
        std::thread::sleep(Duration::from_secs(2));

        // A CHILD_SA rekey: its two old SAs replaced by two new ones.
        let child = children(&o.a).into_iter().next().expect("a CHILD_SA");
        let conn = child.split('{').next().unwrap_or(&child).to_string();
        let old = child_spis(&o.a, &child);
        assert_eq!(old.len(), 2, "{child}: SPIs {old:?}");
        results.push(measure(
            "CHILD_SA rekey",
            &o,
            &stream,
            || {
                let _ = o.a.node.ipsec(&["stroke", "rekey", &child]);
            },
            || {
                let now = spis(&o.a);
                let again = children(&o.a)
                    .iter()
                    .any(|c| c.starts_with(&format!("{conn}{{")) && *c != child);
                (old.iter().all(|s| !now.contains(s)) && again)
                    .then(|| format!("{conn}: both SAs replaced"))
            },
        ));
        std::thread::sleep(Duration::from_secs(2));

        // An IKE_SA rekey: a new IKE_SA, the CHILD_SAs moved to it.
        let ike =
            o.a.node
                .ike_sas()
                .unwrap()
                .into_iter()
                .next()
                .expect("an IKE_SA");
        let old = spis(&o.a);
        results.push(measure(
            "IKE_SA rekey",
            &o,
            &stream,
            || {
                let _ = o.a.node.ipsec(&[
                    "stroke",
                    "rekey",
                    &format!("{}[{}]", ike.conn, ike.unique_id),
                ]);
            },
            || {
                let sas = o.a.node.ike_sas().ok()?;
                (!sas.iter().any(|s| s.unique_id == ike.unique_id)
                    && sas.iter().any(|s| s.state == "ESTABLISHED"))
                .then(|| {
                    format!(
                        "ESP SAs {}",
                        if spis(&o.a) == old {
                            "unchanged"
                        } else {
                            "changed"
                        }
                    )
                })
            },
        ));
        std::thread::sleep(Duration::from_secs(2));

        // A renewal: the monitor names the new certificate; the SAs stay.
        let renewed =
            o.ca.issue_as(o.a.node.chassis(), &format!("chass-a-r{round}"))
                .unwrap();
        let path = renewed.cert.display().to_string();
        let old = spis(&o.a);
        let conf = o.a.node.etc_path("ipsec.conf");
        results.push(measure(
            "renewal",
            &o,
            &stream,
            || {
                // What the agent's activation does: certificate and key
                // switched in one transaction.
                o.a.node
                    .vsctl(&[
                        "set",
                        "Open_vSwitch",
                        ".",
                        &format!("other_config:certificate={path}"),
                        &format!("other_config:private_key={}", renewed.key.display()),
                    ])
                    .unwrap();
            },
            || {
                std::fs::read_to_string(&conf)
                    .ok()?
                    .contains(&path)
                    .then(|| {
                        format!(
                            "ESP SAs {}",
                            if spis(&o.a) == old { "kept" } else { "changed" }
                        )
                    })
            },
        ));
        std::thread::sleep(Duration::from_secs(6));

        // The rebuild a retired CA asks for: every old SA replaced.
        let old = spis(&o.a);
        results.push(measure(
            "rebuild",
            &o,
            &stream,
            || {
                let _ = o.a.node.monitor_command("tunnels/rebuild");
            },
            || {
                let now = spis(&o.a);
                (!now.is_empty() && now.is_disjoint(&old) && both_directions(&o.a))
                    .then(|| format!("{} SAs, all new", now.len()))
            },
        ));
        std::thread::sleep(Duration::from_secs(2));
    }
    let negotiation: Vec<f64> = results
        .iter()
        .filter(|m| m.what == "negotiation")
        .map(|m| m.took.as_secs_f64())
        .collect();
    let baseline = negotiation.iter().sum::<f64>() / negotiation.len() as f64;
    for m in &results {
        println!(
            "sa_rekey: {:15} {:>7.0} ms (x{:.2} of the negotiation), lost {}/{} echoes at 20 ms, \
             counters grown: {}; {}",
            m.what,
            m.took.as_secs_f64() * 1000.0,
            m.took.as_secs_f64() / baseline,
            m.lost,
            m.sent,
            if m.grown.is_empty() {
                "none".to_string()
            } else {
                m.grown.join(", ")
            },
            m.note
        );
    }
    println!(
        "sa_rekey: baseline: one IKE_SA + 2 CHILD_SAs negotiated on the same pair, same run, mean \
         {:.0} ms over {} round(s)",
        baseline * 1000.0,
        negotiation.len()
    );
    for m in &results {
        if matches!(m.what, "CHILD_SA rekey" | "IKE_SA rekey" | "renewal") {
            assert_eq!(
                m.lost, 0,
                "{} lost echoes: {} of {}",
                m.what, m.lost, m.sent
            );
        }
    }
    drop(stream);
    o.ovn.disable(&o.a, &o.b);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds = if args.iter().any(|a| a == "--quick") {
        1
    } else {
        3
    };
    testbed::guest::bench_on_full_kernel(
        "sa_rekey",
        &args,
        Duration::from_secs(1200),
        rekey_paths(rounds),
        |_| {},
    )
    .unwrap();
}
