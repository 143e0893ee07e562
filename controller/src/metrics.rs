//! Prometheus metrics: CSRs by outcome and reason, signing latency, errors.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::error::{Error, Result};

/// Labels of `kube_ovn_ipsec_csr`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CsrLabels {
    /// `signed`, `denied` or `failed`.
    pub outcome: &'static str,
    /// The CamelCase reason (`Signed` for success).
    pub reason: &'static str,
}

/// Labels of `kube_ovn_ipsec_controller_errors`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// [`Error::metric_label`].
    pub error: &'static str,
}

/// The controller's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    csrs: Family<CsrLabels, Counter>,
    signing_seconds: Histogram,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics registered under the `kube_ovn_ipsec` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kube_ovn_ipsec");
        let csrs = Family::<CsrLabels, Counter>::default();
        // 100 µs .. ~3 s: in-process signing is sub-millisecond, cert-manager
        // round trips take seconds.
        let signing_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register("csr", "CSRs handled, by outcome and reason", csrs.clone());
        registry.register(
            "csr_signing_seconds",
            "Time from first seeing a CSR to writing its certificate",
            signing_seconds.clone(),
        );
        registry.register(
            "controller_errors",
            "Reconcile errors by kind",
            errors.clone(),
        );
        Self {
            registry,
            csrs,
            signing_seconds,
            errors,
        }
    }

    /// Counts a CSR outcome.
    pub fn csr(&self, outcome: &'static str, reason: &'static str) {
        self.csrs
            .get_or_create(&CsrLabels { outcome, reason })
            .inc();
    }

    /// Reads a CSR outcome counter (tests, benches).
    pub fn csr_count(&self, outcome: &'static str, reason: &'static str) -> u64 {
        self.csrs
            .get_or_create(&CsrLabels { outcome, reason })
            .get()
    }

    /// Records a signing latency.
    pub fn signing_latency(&self, seconds: f64) {
        self.signing_seconds.observe(seconds);
    }

    /// Counts a reconcile error.
    pub fn error(&self, e: &Error) {
        self.errors
            .get_or_create(&ErrorLabels {
                error: e.metric_label(),
            })
            .inc();
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> Result<String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
