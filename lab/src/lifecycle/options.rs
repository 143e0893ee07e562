//! What a caller asks of a run and where the run sends its progress: the
//! lifecycle's whole interface to `up`. Kept in its own file so the steps
//! can read the options without reaching into the module that orders
//! them.

use std::path::PathBuf;
use std::time::Duration;

use kube_ovn_ipsec_api::rekeying::Rekeying;

use crate::summary::Summary;

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated nodes (at least 2).
    pub nodes: usize,
    /// The certificate lifetime the agents ask for, seconds (Kubernetes'
    /// floor is 600; renewal falls at 40–60 % of it).
    pub certificate_lifetime: u32,
    /// The probe streams' interval.
    pub probe_interval: Duration,
    /// Lifetimes and rekey timing every agent gets: short, so that
    /// CHILD_SAs and IKE_SAs are rekeyed while the probes run.
    pub rekeying: Rekeying,
    /// Which kernel runs the nodes, as printed.
    pub kernel: String,
    /// Where the lab's files go.
    pub dir: PathBuf,
    /// Where the operator finds the logs of a failed run: `dir`, or in the
    /// guest the host's lab directory they are copied to.
    pub logs: PathBuf,
    /// A patched ovn-controller binary to run on every node (`None`: the
    /// emulation plays its part).
    pub ovn_controller: Option<PathBuf>,
}

/// Where a run's progress goes.
pub trait Report {
    /// One progress line, as it happens.
    fn line(&mut self, line: &str);
    /// The summary so far (after every step).
    fn status(&mut self, summary: &Summary);
}
