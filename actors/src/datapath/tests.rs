//! The datapath actor under paused time with a scripted port: reports
//! reach the board and the metrics, a peer that turns unhealthy is
//! published once per episode, a refresh samples at once, a failed sample
//! keeps the last report, and the fast period runs while a window is open.

use super::*;
use crate::clock::TokioClock;
use crate::metrics::PrometheusMetrics;
use crate::ports::{DatapathSample, PeerSample, SaSample};
use kube_ovn_ipsec_api::datapath::{Encapsulation, OUT_POL_BLOCK};
use kube_ovn_ipsec_api::status::{Phase, Reason};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::UNIX_EPOCH;

/// Answers the scripted samples in turn, then the last one forever;
/// counts the calls.
#[derive(Debug, Default)]
struct Script {
    queue: Mutex<VecDeque<crate::Result<Option<DatapathSample>>>>,
    last: Mutex<Option<DatapathSample>>,
    calls: Mutex<u32>,
    /// The `full` flag of every call.
    full: Mutex<Vec<bool>>,
}

#[async_trait::async_trait]
impl DatapathPort for Script {
    async fn sample(&self, full: bool) -> crate::Result<Option<DatapathSample>> {
        *self.calls.lock().unwrap() += 1;
        self.full.lock().unwrap().push(full);
        let next = self.queue.lock().unwrap().pop_front();
        match next {
            Some(Ok(s)) => {
                self.last.lock().unwrap().clone_from(&s);
                Ok(s)
            }
            Some(Err(e)) => Err(e),
            None => Ok(self.last.lock().unwrap().clone()),
        }
    }
}

impl Script {
    fn push(&self, s: crate::Result<Option<DatapathSample>>) {
        self.queue.lock().unwrap().push_back(s);
    }
    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }
}

fn sample(out: u64, inb: u64, block: u64) -> DatapathSample {
    DatapathSample {
        peers: vec![PeerSample {
            peer: "192.0.2.2".parse().unwrap(),
            local: "192.0.2.1".parse().unwrap(),
            chassis: Some("node-2".into()),
            encapsulation: Some(Encapsulation::Geneve),
            outbound: vec![SaSample {
                spi: 1,
                bytes: out * 100,
                packets: out,
            }],
            inbound: vec![SaSample {
                spi: 2,
                bytes: inb * 100,
                packets: inb,
            }],
            nat_traversal: false,
        }],
        xfrm_stat: [(OUT_POL_BLOCK.to_string(), block)].into_iter().collect(),
        underlay_mtu: Some(1500),
        tunnel_mtu: Some(1400),
        lease_sas: 2,
        lease_policies: 4,
    }
}

struct Harness {
    script: Arc<Script>,
    board: StatusBoard,
    refresh: RefreshSignal,
    events: Arc<Mutex<Vec<DatapathEvent>>>,
    registry: prometheus_client::registry::Registry,
    actor: ActorRef<DatapathMsg>,
}

/// Collects the bus's data-path events.
struct Collector(Arc<Mutex<Vec<DatapathEvent>>>);

impl Actor for Collector {
    type Msg = DatapathEvent;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<DatapathEvent>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
    async fn handle(
        &self,
        _: ActorRef<DatapathEvent>,
        e: DatapathEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        self.0.lock().unwrap().push(e);
        Ok(())
    }
}

async fn harness(first: Vec<crate::Result<Option<DatapathSample>>>) -> Harness {
    let clock = Arc::new(TokioClock::starting_at(
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    ));
    let script = Arc::new(Script::default());
    for s in first {
        script.push(s);
    }
    let board = StatusBoard::new(clock.clone());
    let bus = Bus::default();
    let events = Arc::new(Mutex::new(Vec::new()));
    let (collector, _) = Actor::spawn(None, Collector(events.clone()), ())
        .await
        .unwrap();
    bus.datapath.subscribe(collector, Some);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(PrometheusMetrics::register(&mut registry));
    let refresh = RefreshSignal::default();
    let (actor, _) = Actor::spawn(
        None,
        DatapathActor,
        DatapathArgs {
            port: script.clone(),
            board: board.clone(),
            metrics,
            bus,
            clock,
            refresh: refresh.clone(),
            config: DatapathConfig::default(),
        },
    )
    .await
    .unwrap();
    Harness {
        script,
        board,
        refresh,
        events,
        registry,
        actor,
    }
}

fn metrics_text(h: &Harness) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &h.registry).unwrap();
    out
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn reports_reach_the_board_and_the_metrics() {
    let h = harness(vec![
        Ok(Some(sample(10, 10, 0))),
        Ok(Some(sample(20, 20, 0))),
    ])
    .await;
    settle().await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let s = h.board.snapshot();
    assert_eq!(s.datapath_healthy, Some(true));
    assert_eq!(s.peers.len(), 1);
    assert_eq!(s.peers[0].state, PeerState::Healthy);
    assert_eq!(s.mtu.unwrap().max_tunnel, 1408);
    let text = metrics_text(&h);
    for line in [
        "kube_ovn_ipsec_peer_state{peer=\"192.0.2.2\",state=\"Healthy\"} 1",
        "kube_ovn_ipsec_peer_state{peer=\"192.0.2.2\",state=\"InboundMissing\"} 0",
        "kube_ovn_ipsec_peer_sa_packets{peer=\"192.0.2.2\",direction=\"out\"} 20",
        "kube_ovn_ipsec_datapath_healthy 1",
        "kube_ovn_ipsec_lease_sas 2",
        "kube_ovn_ipsec_mtu_bytes{kind=\"max_tunnel\"} 1408",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    assert!(
        !text.contains("xfrm_stat_total{"),
        "zero counters are not exported"
    );
    h.actor.stop(None);
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_peer_is_published_once_and_degrades_the_node() {
    // Inbound flat from the start, outbound growing every 2 s.
    let mut first = Vec::new();
    for i in 0..12 {
        first.push(Ok(Some(sample(10 + i * 10, 10, 7))));
    }
    let h = harness(first).await;
    settle().await;
    tokio::time::sleep(Duration::from_secs(16)).await;
    let s = h.board.snapshot();
    assert_eq!(s.datapath_healthy, Some(false));
    assert_eq!(s.peers[0].state, PeerState::InboundMissing);
    let events = h.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        matches!(&events[0], DatapathEvent::PeerUnhealthy(p) if p.state == PeerState::InboundMissing)
    );
    // The node: active otherwise? Not here (no identity), but the reason
    // and the counters are in the document and the metrics.
    let text = metrics_text(&h);
    assert!(
        text.contains("kube_ovn_ipsec_xfrm_stat_total{counter=\"XfrmOutPolBlock\"} 7"),
        "{text}"
    );
    assert!(text.contains("kube_ovn_ipsec_datapath_healthy 0"), "{text}");
    h.actor.stop(None);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_samples_at_once_and_a_failure_keeps_the_last_report() {
    let h = harness(vec![Ok(Some(sample(10, 10, 0)))]).await;
    settle().await;
    let calls = h.script.calls();
    let (n, _) = h.board.datapath_samples();
    h.script.push(Err(crate::Error::Protection {
        reason: Reason::DatapathUnmeasured,
        detail: "netlink dump failed".into(),
    }));
    h.refresh.request();
    settle().await;
    assert_eq!(
        h.script.calls(),
        calls + 1,
        "sampled without waiting for the period"
    );
    assert_eq!(h.board.datapath_samples(), (n + 1, true));
    assert_eq!(h.board.snapshot().peers.len(), 1, "the last report stays");
    h.actor.stop(None);
}

#[tokio::test(start_paused = true)]
async fn samples_fast_while_an_enable_window_is_open_then_slow() {
    let mut waiting = sample(0, 0, 0);
    waiting.peers[0].outbound.clear();
    waiting.peers[0].inbound.clear();
    let h = harness(vec![Ok(Some(waiting.clone())), Ok(Some(waiting))]).await;
    settle().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        h.script.calls() >= 3,
        "fast period while the window is open"
    );
    h.script.push(Ok(Some(sample(5, 5, 0))));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = h.board.snapshot();
    assert!(
        s.peers[0].enable_window_millis.is_some(),
        "{:?}",
        s.peers[0]
    );
    let calls = h.script.calls();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.script.calls(), calls, "back to the normal period");
    let full = h.script.full.lock().unwrap().clone();
    assert!(
        full[1..].iter().all(|f| !f),
        "timer samples may use the cache: {full:?}"
    );
    h.actor.stop(None);
}

#[tokio::test(start_paused = true)]
async fn no_lease_means_nothing_measured() {
    let h = harness(vec![Ok(None)]).await;
    settle().await;
    let s = h.board.snapshot();
    assert_eq!(s.datapath_healthy, None);
    assert!(s.peers.is_empty());
    assert_eq!(s.phase, Phase::Starting);
    h.actor.stop(None);
}
