//! The health policy the IKE and monitor actors share (SPEC §3): a started
//! process is probed quickly until its first successful probe (it may take
//! a moment to answer), then every `probe_period`; its exit is polled every
//! `exit_poll`. An exit, `probe_failures` failed probes in a row once it
//! was healthy, or no successful probe within `start_timeout` makes the
//! actor fail, so the supervisor restarts it on the 1–30 s schedule (one
//! backoff mechanism: [`crate::backoff`] in the supervisor).

use std::time::Duration;

use tokio::time::Instant;

use crate::ports::RunningProcess;

/// Probe and restart tuning of a runtime process actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessConfig {
    /// Between health probes once healthy.
    pub probe_period: Duration,
    /// Between probes until the first success.
    pub startup_probe_period: Duration,
    /// Between non-blocking exit checks.
    pub exit_poll: Duration,
    /// How long a fresh process may take to pass its first probe.
    pub start_timeout: Duration,
    /// Consecutive failed probes (after the first success) that fail the
    /// actor.
    pub probe_failures: u32,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        Self {
            probe_period: Duration::from_secs(5),
            startup_probe_period: Duration::from_millis(500),
            exit_poll: Duration::from_millis(250),
            start_timeout: Duration::from_secs(30),
            probe_failures: 2,
        }
    }
}

/// What a probe came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeVerdict {
    /// Healthy now.
    Healthy,
    /// Not (yet) healthy, keep going.
    NotYet(String),
    /// Give up: fail the actor with this reason.
    Fail(String),
}

/// The probe bookkeeping of one incarnation.
#[derive(Debug)]
pub(crate) struct Watch {
    config: ProcessConfig,
    started: Instant,
    healthy_once: bool,
    consecutive: u32,
}

impl Watch {
    pub(crate) fn new(config: ProcessConfig) -> Self {
        Self {
            config,
            started: Instant::now(),
            healthy_once: false,
            consecutive: 0,
        }
    }

    /// When to probe next.
    pub(crate) fn next_probe(&self) -> Duration {
        if self.healthy_once {
            self.config.probe_period
        } else {
            self.config.startup_probe_period
        }
    }

    /// Runs one probe and applies the policy.
    pub(crate) async fn probe<P: RunningProcess + ?Sized>(&mut self, p: &mut P) -> ProbeVerdict {
        if let Some(s) = p.try_exited() {
            return ProbeVerdict::Fail(format!("exited ({s})"));
        }
        match p.probe().await {
            Ok(()) => {
                self.healthy_once = true;
                self.consecutive = 0;
                ProbeVerdict::Healthy
            }
            Err(e) => {
                self.consecutive += 1;
                let why = e.to_string();
                if self.healthy_once && self.consecutive >= self.config.probe_failures {
                    ProbeVerdict::Fail(format!(
                        "{} failed probes in a row, last: {why}",
                        self.consecutive
                    ))
                } else if !self.healthy_once
                    && Instant::now().duration_since(self.started) >= self.config.start_timeout
                {
                    ProbeVerdict::Fail(format!(
                        "no successful probe within {:?}, last: {why}",
                        self.config.start_timeout
                    ))
                } else {
                    ProbeVerdict::NotYet(why)
                }
            }
        }
    }
}
