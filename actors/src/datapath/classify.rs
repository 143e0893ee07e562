//! The datapath classifier: pure, fed one [`DatapathSample`] at a time
//! with the wall-clock instant it was taken, answering a
//! [`DatapathReport`]. Unit-tested here on synthetic samples and, in the
//! `runtime` crate, on captured netlink dumps and `xfrm_stat` snapshots.
//!
//! # The rules (per peer: a tunnel with IPsec intent)
//!
//! Movement is judged against a baseline: the newest sample at least one
//! window old (the oldest one while the history is shorter). A direction
//! *moved* when one of its SAs (by SPI: a rekeyed SA starts from zero)
//! counts more packets than at the baseline.
//!
//! 1. No outbound SA: `GuardDrop` when `XfrmOutPolBlock` grew since the
//!    baseline (the guards dropped marked traffic no IPsec policy claimed:
//!    the IKE daemon's policies are gone), else `NoSA`.
//! 2. An outbound SA but no inbound SA: `NoSA`.
//! 3. Inbound moved: `Healthy` (both directions, or only the peer's
//!    traffic: nothing of ours is being lost).
//! 4. Only outbound moved: `InboundMissing` once the history spans the
//!    window (what we send has gone unanswered for the whole window).
//! 5. Nothing moved over the whole window: `Idle`.
//!
//! With less than a window of history, 4 and 5 keep the state they had
//! (`Idle` for a new peer).
//!
//! # What counts against `datapathHealthy`
//!
//! `InboundMissing` at once (its evidence already spans the window);
//! `GuardDrop` and `NoSA` once the peer has been without SAs for a window:
//! every tunnel passes through them for a moment when it gains intent (the
//! enable window, SPEC §4) or its daemon restarts.
//!
//! # The enable window (SPEC §4)
//!
//! From the sample that first shows the tunnel with intent to the first
//! sample in which its outbound SA counted a packet. A tunnel whose
//! outbound SA already carried traffic when first seen (the agent
//! restarted) has no window to report. The actor samples faster while a
//! window is open, so its resolution is the fast period, except for the
//! start, which is only known to a normal period.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use kube_ovn_ipsec_api::datapath::{
    DatapathReport, MtuReport, OUT_POL_BLOCK, PeerHealth, PeerState, SaCounters, counter_growth,
};
use kube_ovn_ipsec_api::ident::Chassis;

use crate::ports::{DatapathSample, PeerSample, SaSample};
use crate::status::timestamp;

/// Packets per SPI of one direction.
type Spis = BTreeMap<u32, u64>;

fn spis(sas: &[SaSample]) -> Spis {
    sas.iter().map(|s| (s.spi, s.packets)).collect()
}

fn counters(sas: &[SaSample]) -> SaCounters {
    SaCounters {
        sas: u32::try_from(sas.len()).unwrap_or(u32::MAX),
        bytes: sas.iter().map(|s| s.bytes).sum(),
        packets: sas.iter().map(|s| s.packets).sum(),
    }
}

/// Whether any SA counts more packets now than at `base`.
fn moved(now: &Spis, base: &Spis) -> bool {
    now.iter()
        .any(|(spi, packets)| *packets > base.get(spi).copied().unwrap_or(0))
}

#[derive(Debug, Clone)]
struct Point {
    at: SystemTime,
    outbound: Spis,
    inbound: Spis,
}

#[derive(Debug, Clone)]
struct Track {
    history: VecDeque<Point>,
    state: PeerState,
    since: SystemTime,
    /// Since when the peer has been in a problem state without a break.
    problem_since: Option<SystemTime>,
    first_seen: SystemTime,
    /// `Some(None)`: open; `Some(Some(d))`: measured; `None`: not
    /// measurable (traffic already flowed when first seen).
    window: Option<Option<Duration>>,
}

/// The classifier's state: per peer a short history, and the node's
/// `xfrm_stat` history.
#[derive(Debug, Clone)]
pub struct Classifier {
    window: Duration,
    peers: BTreeMap<IpAddr, Track>,
    stats: VecDeque<(SystemTime, u64)>,
}

fn age(now: SystemTime, then: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or_default()
}

/// Drops history older than the baseline: keeps every entry younger than
/// `window` and the newest one older than that.
fn trim<T>(
    history: &mut VecDeque<T>,
    now: SystemTime,
    window: Duration,
    at: impl Fn(&T) -> SystemTime,
) {
    while history.len() >= 2 && age(now, at(&history[1])) >= window {
        history.pop_front();
    }
}

impl Classifier {
    /// A classifier judging movement over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            peers: BTreeMap::new(),
            stats: VecDeque::new(),
        }
    }

    /// Whether any peer's enable window is open (the actor samples faster
    /// meanwhile).
    pub fn window_open(&self) -> bool {
        self.peers.values().any(|t| t.window == Some(None))
    }

    /// Classifies `sample`, taken at `now`.
    pub fn observe(&mut self, now: SystemTime, sample: &DatapathSample) -> DatapathReport {
        let block = sample.xfrm_stat.get(OUT_POL_BLOCK).copied().unwrap_or(0);
        trim(&mut self.stats, now, self.window, |e| e.0);
        let block_base = self.stats.front().map_or(block, |e| e.1);
        let guard_drops = counter_growth(block_base, block) > 0;
        self.stats.push_back((now, block));

        self.peers
            .retain(|ip, _| sample.peers.iter().any(|p| p.peer == *ip));
        let window = self.window;
        let peers = sample
            .peers
            .iter()
            .map(|p| {
                let track = self.peers.entry(p.peer).or_insert_with(|| Track {
                    history: VecDeque::new(),
                    state: PeerState::Idle,
                    since: now,
                    problem_since: None,
                    first_seen: now,
                    window: p.outbound.iter().all(|s| s.packets == 0).then_some(None),
                });
                classify(track, now, window, p, guard_drops)
            })
            .collect();
        let mtu = match (sample.underlay_mtu, sample.tunnel_mtu) {
            (Some(underlay), Some(tunnel)) => {
                let first = sample.peers.iter().find(|p| p.encapsulation.is_some());
                first.and_then(|p| {
                    p.encapsulation.map(|encap| {
                        MtuReport::check(
                            underlay,
                            tunnel,
                            encap,
                            p.local.is_ipv6(),
                            sample.peers.iter().any(|p| p.nat_traversal),
                        )
                    })
                })
            }
            _ => None,
        };
        DatapathReport { peers, mtu }
    }
}

fn classify(
    track: &mut Track,
    now: SystemTime,
    window: Duration,
    p: &PeerSample,
    guard_drops: bool,
) -> PeerHealth {
    let point = Point {
        at: now,
        outbound: spis(&p.outbound),
        inbound: spis(&p.inbound),
    };
    trim(&mut track.history, now, window, |e| e.at);
    let (out_moved, in_moved, span) = match track.history.front() {
        Some(base) => (
            moved(&point.outbound, &base.outbound),
            moved(&point.inbound, &base.inbound),
            age(now, base.at),
        ),
        // First sight: what the SAs counted so far is all there is.
        None => (
            moved(&point.outbound, &Spis::new()),
            moved(&point.inbound, &Spis::new()),
            Duration::ZERO,
        ),
    };
    track.history.push_back(point);
    let full = span >= window;
    let state = if p.outbound.is_empty() {
        if guard_drops {
            PeerState::GuardDrop
        } else {
            PeerState::NoSa
        }
    } else if p.inbound.is_empty() {
        PeerState::NoSa
    } else if in_moved {
        PeerState::Healthy
    } else if out_moved && full {
        PeerState::InboundMissing
    } else if !out_moved && full {
        PeerState::Idle
    } else if matches!(track.state, PeerState::GuardDrop | PeerState::NoSa) {
        // SAs just appeared: not enough history to say more.
        PeerState::Idle
    } else {
        track.state
    };
    if state != track.state {
        track.state = state;
        track.since = now;
    }
    let problem = state.reason().is_some();
    match (problem, track.problem_since) {
        (true, None) => track.problem_since = Some(now),
        (false, Some(_)) => track.problem_since = None,
        _ => {}
    }
    let unhealthy = state == PeerState::InboundMissing
        || track
            .problem_since
            .is_some_and(|since| age(now, since) >= window);
    if track.window == Some(None) && p.outbound.iter().any(|s| s.packets > 0) {
        track.window = Some(Some(age(now, track.first_seen)));
    }
    PeerHealth {
        peer: p.peer,
        chassis: p.chassis.as_deref().and_then(|c| Chassis::new(c).ok()),
        state,
        reason: state.reason(),
        healthy: !unhealthy,
        since: timestamp(track.since),
        outbound: counters(&p.outbound),
        inbound: counters(&p.inbound),
        nat_traversal: p.nat_traversal,
        enable_window_millis: track
            .window
            .flatten()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests;
