//! The controller's logger: JSON lines, the level from `RUST_LOG` (default
//! `info`), and the guards of [`kube_ovn_ipsec_api::logsafe`] applied
//! whatever the level: kube-rs' body-echoing events never written, every
//! line redacted of PEM and tokens on its way out (docs/controller.md,
//! "Logs and secrets").

use std::io;

use kube_ovn_ipsec_api::logsafe::{self, RedactingWriter};
use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, filter_fn};
use tracing_subscriber::layer::{Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The level filter from `RUST_LOG`, `info` when unset or unparsable.
pub fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// The JSON layer writing to what `make` returns (one writer per event),
/// with `filter` and both guards. The guards sit outside `filter`, so no
/// `RUST_LOG` directive lets a dropped target through or skips redaction.
pub fn layer<S, W, F>(filter: EnvFilter, make: F) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: io::Write,
    F: Fn() -> W + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_writer(move || RedactingWriter::new(make()))
        .with_filter(filter)
        .with_filter(filter_fn(|meta| !logsafe::drops_target(meta.target())))
}

/// Installs [`layer`] on stdout with [`env_filter`] as the process's
/// subscriber.
pub fn init() {
    tracing_subscriber::registry()
        .with(layer(env_filter(), io::stdout))
        .init();
}
