//! The controller's logger: JSON lines, the level from `RUST_LOG` (default
//! `info`), and the guards of [`kube_ovn_ipsec_api::logsafe`] applied
//! whatever the level: kube-rs' body-echoing events never written, every
//! line redacted of PEM and tokens on its way out (docs/controller.md,
//! "Logs and secrets").

use std::io;

use kube_ovn_ipsec_api::logsafe;
use tracing::Subscriber;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::{Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The level filter from `RUST_LOG`, `info` when unset or unparsable.
pub fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// The JSON layer writing to what `make` returns, with `filter` and both
/// guards ([`logsafe::json_layer`], the agent's too).
pub fn layer<S, W, F>(filter: EnvFilter, make: F) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: io::Write,
    F: Fn() -> W + Send + Sync + 'static,
{
    logsafe::json_layer(filter, make)
}

/// Installs [`layer`] on stdout with [`env_filter`] as the process's
/// subscriber.
pub fn init() {
    tracing_subscriber::registry()
        .with(layer(env_filter(), io::stdout))
        .init();
}
