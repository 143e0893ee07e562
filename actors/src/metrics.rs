//! Metrics hooks. The actors call a small [`Metrics`] trait; the runtime
//! serves a [`PrometheusMetrics`] registered in its `prometheus-client`
//! [`Registry`] at `/metrics`.

use std::fmt::Debug;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
