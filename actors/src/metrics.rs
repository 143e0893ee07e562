//! Metrics hooks. The actors call a small [`Metrics`] trait; the runtime
//! serves a [`PrometheusMetrics`] registered in its `prometheus-client`
//! [`Registry`] at `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use kube_ovn_ipsec_api::datapath::{DatapathReport, PeerState};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::ports::DatapathSample;

/// What the actors report.
pub trait Metrics: Send + Sync + Debug + 'static {
    /// A renewal attempt ended: `result` is `"success"` or an error's
    /// [`crate::Error::metric_label`].
    fn renewal(&self, result: &str);
    /// Seconds from requesting an activation to its confirmed OVSDB commit.
    fn activation_latency(&self, seconds: f64);
    /// The supervisor respawned `actor`.
    fn actor_restart(&self, actor: &str);
    /// Seconds until the active certificate expires (negative once expired).
    fn seconds_to_expiry(&self, seconds: f64);
    /// Something happened to a guard: `kind` is a
    /// [`crate::ports::GuardChange::kind`] (`readded`, `conflict`, ...).
    fn guard_event(&self, kind: &str) {
        let _ = kind;
    }
    /// A runtime process (`ike`, `monitor`) exited or failed its probe.
    fn process_failure(&self, process: &str) {
        let _ = process;
    }
    /// Keys the agent publishes in OVSDB had drifted and were restored:
    /// `what` is `lease` or `identity`.
    fn ovsdb_drift(&self, what: &str) {
        let _ = what;
    }
    /// A data-path sample was classified: `report` per peer, `sample`'s
    /// kernel counters, `previous` the `xfrm_stat` reading before it (the
    /// counters grow by the difference).
    fn datapath(
        &self,
        report: &DatapathReport,
        sample: &DatapathSample,
        previous: &BTreeMap<String, u64>,
    ) {
        let _ = (report, sample, previous);
    }
}

/// Metrics that go nowhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopMetrics;

impl Metrics for NoopMetrics {
    fn renewal(&self, _: &str) {}
    fn activation_latency(&self, _: f64) {}
    fn actor_restart(&self, _: &str) {}
    fn seconds_to_expiry(&self, _: f64) {}
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActorLabel {
    actor: String,
}

/// Prometheus-backed metrics.
#[derive(Debug, Clone)]
pub struct PrometheusMetrics {
    renewals: Family<ResultLabel, Counter>,
    activation_latency: Histogram,
    restarts: Family<ActorLabel, Counter>,
    expiry: Gauge<f64, AtomicU64>,
    guard_events: Family<KindLabel, Counter>,
    process_failures: Family<ProcessLabel, Counter>,
    ovsdb_drift: Family<WhatLabel, Counter>,
    datapath: DatapathMetrics,
}

/// The data-path families (SPEC §10).
#[derive(Debug, Clone, Default)]
struct DatapathMetrics {
    peer_state: Family<PeerStateLabel, Gauge>,
    peer_packets: Family<PeerDirectionLabel, Gauge>,
    peer_bytes: Family<PeerDirectionLabel, Gauge>,
    enable_window: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    healthy: Gauge,
    xfrm_stat: Family<CounterLabel, Counter>,
    lease_sas: Gauge,
    lease_policies: Gauge,
    mtu: Family<KindLabel, Gauge>,
    /// The peers with series, so a peer whose tunnel lost intent loses
    /// its series too.
    peers: std::sync::Arc<Mutex<BTreeSet<String>>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerStateLabel {
    peer: String,
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerDirectionLabel {
    peer: String,
    direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabel {
    counter: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhatLabel {
    what: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabel {
    process: String,
}

impl PrometheusMetrics {
    /// Creates the metrics and registers them under `registry` with the
    /// prefix `kube_ovn_ipsec`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = PrometheusMetrics {
            renewals: Family::default(),
            activation_latency: Histogram::new([0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
            restarts: Family::default(),
            expiry: Gauge::default(),
            guard_events: Family::default(),
            process_failures: Family::default(),
            ovsdb_drift: Family::default(),
            datapath: DatapathMetrics::default(),
        };
        let r = registry.sub_registry_with_prefix("kube_ovn_ipsec");
        r.register(
            "identity_renewals",
            "Identity renewal attempts by result",
            m.renewals.clone(),
        );
        r.register(
            "activation_latency_seconds",
            "Seconds from activation request to confirmed OVSDB commit",
            m.activation_latency.clone(),
        );
        r.register(
            "actor_restarts",
            "Supervised actor respawns by actor",
            m.restarts.clone(),
        );
        r.register(
            "certificate_seconds_to_expiry",
            "Seconds until the active certificate expires",
            m.expiry.clone(),
        );
        r.register(
            "guard_events",
            "XFRM guard events by kind (armed, readded, adopted, conflict)",
            m.guard_events.clone(),
        );
        r.register(
            "process_failures",
            "Runtime process exits and failed health probes by process",
            m.process_failures.clone(),
        );
        r.register(
            "ovsdb_drift_restored",
            "The agent's OVSDB keys found changed by someone else and restored, by what (lease, identity)",
            m.ovsdb_drift.clone(),
        );
        let d = &m.datapath;
        r.register(
            "peer_state",
            "Data-path state per peer (1 for the current state, 0 for the others): Healthy, InboundMissing, GuardDrop, NoSA, Idle",
            d.peer_state.clone(),
        );
        r.register(
            "peer_sa_packets",
            "Packets counted by the SAs to (out) and from (in) a peer, installed ones summed (restart at rekey)",
            d.peer_packets.clone(),
        );
        r.register(
            "peer_sa_bytes",
            "Bytes counted by the SAs to (out) and from (in) a peer, installed ones summed (restart at rekey)",
            d.peer_bytes.clone(),
        );
        r.register(
            "peer_enable_window_seconds",
            "Seconds from a tunnel's IPsec intent to the first packet through its outbound SA",
            d.enable_window.clone(),
        );
        r.register(
            "datapath_healthy",
            "1 when no peer is unhealthy and the tunnel MTU fits ESP",
            d.healthy.clone(),
        );
        r.register(
            "xfrm_stat",
            "The kernel's XFRM error counters (/proc/net/xfrm_stat of the node), each one that is not zero",
            d.xfrm_stat.clone(),
        );
        r.register(
            "lease_sas",
            "Kernel SAs attributed to the node's lease",
            d.lease_sas.clone(),
        );
        r.register(
            "lease_policies",
            "Kernel XFRM policies attributed to the node's lease, guards included",
            d.lease_policies.clone(),
        );
        r.register(
            "mtu_bytes",
            "MTUs of the encrypted overlay by kind: underlay, tunnel, max_tunnel (the largest tunnel MTU ESP leaves room for)",
            d.mtu.clone(),
        );
        m
    }
}

impl Metrics for PrometheusMetrics {
    fn renewal(&self, result: &str) {
        self.renewals
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
    }
    fn activation_latency(&self, seconds: f64) {
        self.activation_latency.observe(seconds);
    }
    fn actor_restart(&self, actor: &str) {
        self.restarts
            .get_or_create(&ActorLabel {
                actor: actor.to_owned(),
            })
            .inc();
    }
    fn seconds_to_expiry(&self, seconds: f64) {
        self.expiry.set(seconds);
    }
    fn guard_event(&self, kind: &str) {
        self.guard_events
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }
    fn process_failure(&self, process: &str) {
        self.process_failures
            .get_or_create(&ProcessLabel {
                process: process.to_owned(),
            })
            .inc();
    }
    fn ovsdb_drift(&self, what: &str) {
        self.ovsdb_drift
            .get_or_create(&WhatLabel {
                what: what.to_owned(),
            })
            .inc();
    }
    fn datapath(
        &self,
        report: &DatapathReport,
        sample: &DatapathSample,
        previous: &BTreeMap<String, u64>,
    ) {
        self.datapath.record(report, sample, previous);
    }
}

impl DatapathMetrics {
    fn forget(&self, peer: &str) {
        for state in PeerState::ALL {
            self.peer_state.remove(&PeerStateLabel {
                peer: peer.to_owned(),
                state: state.as_str().to_owned(),
            });
        }
        for direction in ["out", "in"] {
            let l = PeerDirectionLabel {
                peer: peer.to_owned(),
                direction: direction.to_owned(),
            };
            self.peer_packets.remove(&l);
            self.peer_bytes.remove(&l);
        }
        self.enable_window.remove(&PeerLabel {
            peer: peer.to_owned(),
        });
    }

    fn record(
        &self,
        report: &DatapathReport,
        sample: &DatapathSample,
        previous: &BTreeMap<String, u64>,
    ) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut known = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let current: BTreeSet<String> = report.peers.iter().map(|p| p.peer.to_string()).collect();
        for gone in known.difference(&current) {
            self.forget(gone);
        }
        *known = current;
        drop(known);
        for p in &report.peers {
            let peer = p.peer.to_string();
            for state in PeerState::ALL {
                self.peer_state
                    .get_or_create(&PeerStateLabel {
                        peer: peer.clone(),
                        state: state.as_str().to_owned(),
                    })
                    .set(i64::from(state == p.state));
            }
            for (direction, c) in [("out", p.outbound), ("in", p.inbound)] {
                let l = PeerDirectionLabel {
                    peer: peer.clone(),
                    direction: direction.to_owned(),
                };
                self.peer_packets.get_or_create(&l).set(gauge(c.packets));
                self.peer_bytes.get_or_create(&l).set(gauge(c.bytes));
            }
            if let Some(ms) = p.enable_window_millis {
                self.enable_window
                    .get_or_create(&PeerLabel { peer })
                    .set(ms as f64 / 1000.0);
            }
        }
        self.healthy.set(i64::from(report.healthy()));
        for (name, value) in &sample.xfrm_stat {
            let before = previous.get(name).copied().unwrap_or(0);
            let grew = kube_ovn_ipsec_api::datapath::counter_growth(before, *value);
            if *value > 0 {
                self.xfrm_stat
                    .get_or_create(&CounterLabel {
                        counter: name.clone(),
                    })
                    .inc_by(grew);
            }
        }
        self.lease_sas
            .set(gauge(u64::try_from(sample.lease_sas).unwrap_or(u64::MAX)));
        self.lease_policies.set(gauge(
            u64::try_from(sample.lease_policies).unwrap_or(u64::MAX),
        ));
        if let Some(m) = report.mtu {
            for (kind, v) in [
                ("underlay", m.underlay),
                ("tunnel", m.tunnel),
                ("max_tunnel", m.max_tunnel),
            ] {
                self.mtu
                    .get_or_create(&KindLabel {
                        kind: kind.to_owned(),
                    })
                    .set(i64::from(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_all_families() {
        let mut reg = Registry::default();
        let m = PrometheusMetrics::register(&mut reg);
        m.renewal("success");
        m.renewal("csr_denied");
        m.activation_latency(0.2);
        m.actor_restart("identity");
        m.seconds_to_expiry(3600.0);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("kube_ovn_ipsec_identity_renewals_total{result=\"csr_denied\"} 1"));
        assert!(out.contains("kube_ovn_ipsec_actor_restarts_total{actor=\"identity\"} 1"));
        assert!(out.contains("kube_ovn_ipsec_certificate_seconds_to_expiry 3600"));
        assert!(out.contains("kube_ovn_ipsec_activation_latency_seconds_count 1"));
    }
}
