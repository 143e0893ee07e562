//! The datapath actor (SPEC §10): samples the node's encrypted data path
//! every `period` (every `fast_period` while a peer's enable window is
//! open), classifies each peer ([`classify`]), and reports what it found —
//! `/status` (`datapathHealthy`, `peers`, `mtu`), metrics, and on the bus
//! each peer that turns unhealthy and an MTU that does not fit (the
//! `runtime` crate raises rate-limited Kubernetes Events on the Node).
//!
//! It only reads: a failed sample is logged and retried at the next tick,
//! and changes nothing in the kernel. It is supervised like every actor; a
//! respawn starts with an empty history (one window to judge movement
//! again).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::clock::Clock;
use kube_ovn_ipsec_api::datapath::{DatapathReport, MtuReport, PeerState};
use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::Notify;

use crate::bus::Bus;
use crate::metrics::Metrics;
use crate::ports::DatapathPort;
use crate::status::StatusBoard;

pub mod classify;

pub use classify::Classifier;

/// Tuning of the datapath actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Between samples.
    pub period: Duration,
    /// Between samples while a peer's enable window is open.
    pub fast_period: Duration,
    /// How long inbound must stay flat under outbound traffic before a
    /// peer is `InboundMissing`; how long a peer may be without SAs before
    /// it counts against `datapathHealthy`.
    pub window: Duration,
}

impl Default for DatapathConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(2),
            fast_period: Duration::from_millis(250),
            window: Duration::from_secs(10),
        }
    }
}

/// Asks the datapath actor to sample now (`ipsec/refresh`); survives the
/// actor's respawns. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct RefreshSignal(Arc<Notify>);

impl RefreshSignal {
    /// Requests a sample now.
    pub fn request(&self) {
        self.0.notify_one();
    }

    async fn requested(&self) {
        self.0.notified().await;
    }
}

pub use crate::bus::DatapathEvent;

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct DatapathArgs {
    /// Reads the data path.
    pub port: Arc<dyn DatapathPort>,
    /// Where the report goes.
    pub board: StatusBoard,
    /// Per-peer and kernel counters.
    pub metrics: Arc<dyn Metrics>,
    /// Where unhealthy peers are published.
    pub bus: Bus,
    /// Wall clock (movement windows, `since`).
    pub clock: Arc<dyn Clock>,
    /// `ipsec/refresh`.
    pub refresh: RefreshSignal,
    /// Tuning.
    pub config: DatapathConfig,
}

/// Messages of the datapath actor.
#[derive(Debug)]
pub enum DatapathMsg {
    /// Sample now: the timer (`full: false`), or a refresh (`full: true`,
    /// everything re-read).
    Sample {
        /// Re-read what the port may cache.
        full: bool,
    },
}

/// The datapath actor's state.
#[derive(Debug)]
pub struct DatapathState {
    args: DatapathArgs,
    classifier: Classifier,
    /// Peers counted unhealthy at the last sample (published once per
    /// episode).
    unhealthy: BTreeMap<IpAddr, PeerState>,
    /// The last MTU problem published.
    mtu_reported: Option<MtuReport>,
    /// The last `xfrm_stat` reading (the metrics count growth).
    stats: BTreeMap<String, u64>,
    next: Option<JoinHandle<Result<(), ractor::MessagingErr<DatapathMsg>>>>,
    listener: Option<JoinHandle<()>>,
}

/// The datapath actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct DatapathActor;

/// Publishes what turned unhealthy since the last report.
fn publish(state: &mut DatapathState, report: &DatapathReport) {
    let now: BTreeMap<IpAddr, PeerState> = report
        .peers
        .iter()
        .filter(|p| !p.healthy)
        .map(|p| (p.peer, p.state))
        .collect();
    for p in report.peers.iter().filter(|p| !p.healthy) {
        if state.unhealthy.get(&p.peer) != Some(&p.state) {
            tracing::warn!(peer = %p.peer, chassis = ?p.chassis.as_ref().map(|c| c.as_str()), state = %p.state, out_packets = p.outbound.packets, in_packets = p.inbound.packets, hint = p.message().unwrap_or(""), "IPsec data path to a peer is unhealthy");
            state
                .args
                .bus
                .datapath
                .send(DatapathEvent::PeerUnhealthy(Box::new(p.clone())));
        }
    }
    for (peer, was) in &state.unhealthy {
        if !now.contains_key(peer) {
            tracing::info!(%peer, was = %was, "IPsec data path to a peer recovered");
        }
    }
    state.unhealthy = now;
    match report.mtu.filter(|m| !m.ok) {
        Some(m) if state.mtu_reported != Some(m) => {
            tracing::warn!(
                underlay = m.underlay,
                tunnel = m.tunnel,
                overhead = m.overhead,
                max_tunnel = m.max_tunnel,
                "{m}"
            );
            state.args.bus.datapath.send(DatapathEvent::MtuTooSmall(m));
            state.mtu_reported = Some(m);
        }
        Some(_) => {}
        None => state.mtu_reported = None,
    }
}

async fn sample(state: &mut DatapathState, full: bool) {
    match state.args.port.sample(full).await {
        Ok(Some(sample)) => {
            let now = state.args.clock.now();
            let report = state.classifier.observe(now, &sample);
            state.args.metrics.datapath(&report, &sample, &state.stats);
            state.stats = sample.xfrm_stat.clone();
            publish(state, &report);
            state.args.board.set_datapath(Some(report));
        }
        Ok(None) => state.args.board.set_datapath(None),
        Err(e) => {
            tracing::warn!(error = %e, "sampling the data path failed; retrying at the next tick");
            state.args.board.datapath_sample_failed();
        }
    }
}

impl Actor for DatapathActor {
    type Msg = DatapathMsg;
    type State = DatapathState;
    type Arguments = DatapathArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<DatapathMsg>,
        args: DatapathArgs,
    ) -> Result<DatapathState, ActorProcessingErr> {
        let refresh = args.refresh.clone();
        let me = myself.clone();
        let listener = tokio::spawn(async move {
            loop {
                refresh.requested().await;
                if me.cast(DatapathMsg::Sample { full: true }).is_err() {
                    break;
                }
            }
        });
        myself.send_message(DatapathMsg::Sample { full: true })?;
        Ok(DatapathState {
            classifier: Classifier::new(args.config.window),
            args,
            unhealthy: BTreeMap::new(),
            mtu_reported: None,
            stats: BTreeMap::new(),
            next: None,
            listener: Some(listener),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<DatapathMsg>,
        state: &mut DatapathState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(h) = state.next.take() {
            h.abort();
        }
        if let Some(h) = state.listener.take() {
            h.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<DatapathMsg>,
        msg: DatapathMsg,
        state: &mut DatapathState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DatapathMsg::Sample { full } => {
                sample(state, full).await;
                // One timer at a time: a refresh re-arms it.
                if let Some(h) = state.next.take() {
                    h.abort();
                }
                let config = state.args.config;
                let period = if state.classifier.window_open() {
                    config.fast_period
                } else {
                    config.period
                };
                state.next =
                    Some(myself.send_after(period, || DatapathMsg::Sample { full: false }));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
