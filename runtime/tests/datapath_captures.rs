//! The datapath classifier on captures from the full kernel: SA dumps as
//! the agent's netlink parser read them (keys never read) and
//! `/proc/net/xfrm_stat`, taken by `datapath_health` under
//! `KOI_DATAPATH_CAPTURE=1` at its steps (`fixtures/datapath/*.jsonl`, one
//! capture per line, in order). Each scenario is replayed through the
//! agent's own attribution (`sa::peer_samples`) and classifier with the
//! window the agents ran with, at the captures' own times.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actors::datapath::Classifier;
use actors::ports::DatapathSample;
use kube_ovn_ipsec_api::datapath::{DatapathReport, OUT_POL_BLOCK, PeerState};
use kube_ovn_ipsec_runtime::lease::Lease;
use kube_ovn_ipsec_runtime::sa::{self, PeerTunnel, TunnelEndpoints};
use serde::Deserialize;
use xfrm::model::State;

/// `datapath_health`'s `--datapath-window`.
const WINDOW: Duration = Duration::from_secs(6);

#[derive(Debug, Deserialize)]
struct Tunnel {
    local: std::net::IpAddr,
    remote: std::net::IpAddr,
    chassis: String,
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Capture {
    scenario: String,
    secs: f64,
    lease: Lease,
    tunnel: Tunnel,
    states: Vec<State>,
    xfrm_stat: BTreeMap<String, u64>,
}

fn load(scenario: &str) -> Vec<Capture> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/datapath")
        .join(format!("{scenario}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap();
    let caps: Vec<Capture> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        caps.len() >= 2,
        "{}: fewer than two captures",
        path.display()
    );
    assert!(caps.iter().all(|c| c.scenario == scenario));
    caps
}

fn sample(c: &Capture) -> DatapathSample {
    let peer = PeerTunnel {
        endpoints: TunnelEndpoints {
            local: c.tunnel.local,
            remote: c.tunnel.remote,
        },
        chassis: Some(c.tunnel.chassis.clone()),
        kind: c.tunnel.kind.clone(),
    };
    DatapathSample {
        peers: sa::peer_samples(&c.lease, &c.states, &[peer]),
        xfrm_stat: c.xfrm_stat.clone(),
        ..DatapathSample::default()
    }
}

/// Replays the captures at their own times; the report of each.
fn replay(caps: &[Capture]) -> Vec<DatapathReport> {
    let base = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let at = |secs: f64| -> SystemTime { base + Duration::from_secs_f64(secs) };
    let mut c = Classifier::new(WINDOW);
    caps.iter()
        .map(|cap| c.observe(at(cap.secs), &sample(cap)))
        .collect()
}

#[test]
fn captured_pod_traffic_is_healthy_with_both_directions_attributed() {
    let caps = load("healthy");
    let reports = replay(&caps);
    let last = &reports.last().unwrap().peers[0];
    assert_eq!(last.state, PeerState::Healthy);
    assert!(last.outbound.sas >= 1 && last.inbound.sas >= 1, "{last:?}");
    assert!(last.outbound.packets > 0 && last.inbound.packets > 0);
    // Foreign SAs in the same dump are not attributed: only the lease's.
    let c = &caps[0];
    let own: usize = reports[0]
        .peers
        .iter()
        .map(|p| (p.outbound.sas + p.inbound.sas) as usize)
        .sum();
    assert!(own <= c.states.iter().filter(|s| s.reqid == c.lease.reqid).count());
}

#[test]
fn captured_esp_drop_is_inbound_missing_once_a_window_passed() {
    let caps = load("inbound_missing");
    let reports = replay(&caps);
    assert_ne!(reports[0].peers[0].state, PeerState::InboundMissing);
    let last = &reports.last().unwrap().peers[0];
    assert_eq!(last.state, PeerState::InboundMissing, "{last:?}");
    assert!(!last.healthy);
    assert!(caps.last().unwrap().secs - caps[0].secs >= WINDOW.as_secs_f64());
}

#[test]
fn captured_ike_stop_is_guard_drop_with_the_counter_moving() {
    let caps = load("guard_drop");
    let reports = replay(&caps);
    assert_eq!(
        reports[0].peers[0].state,
        PeerState::Healthy,
        "before the stop"
    );
    let last = &reports.last().unwrap().peers[0];
    assert_eq!(last.state, PeerState::GuardDrop, "{last:?}");
    assert_eq!(last.outbound.sas, 0);
    let block = |c: &Capture| c.xfrm_stat.get(OUT_POL_BLOCK).copied().unwrap_or(0);
    assert!(block(caps.last().unwrap()) > block(&caps[0]));
}

#[test]
fn the_captures_hold_no_key_material() {
    for scenario in ["healthy", "inbound_missing", "guard_drop"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/datapath")
            .join(format!("{scenario}.jsonl"));
        let text = std::fs::read_to_string(path).unwrap();
        for word in ["aead", "rfc4106", "key", "BEGIN"] {
            assert!(!text.contains(word), "{scenario}: {word}");
        }
    }
}
