//! The process policy the IKE and monitor actors share (SPEC §3), so each
//! actor holds only what is specific to its process.
//!
//! A started process is probed quickly until its first successful probe
//! (it may take a moment to answer), then every `probe_period`; its exit is
//! polled every `exit_poll`. An exit, `probe_failures` failed probes in a
//! row once it was healthy, or no successful probe within `start_timeout`
//! stops the process group and fails the actor, so the supervisor restarts
//! it on the 1–30 s schedule (one backoff mechanism: [`kube_ovn_ipsec_api::backoff`] in
//! the supervisor). A successful probe resets the failure count. Every
//! verdict goes to the board as the component's part of `runtimeHealthy`.
//!
//! The start timeout doubles for each incarnation in a row that never
//! passed a probe, up to `start_timeout_max` ([`StartPatience`]): on an
//! overloaded node a daemon that needs 40 s to answer would otherwise be
//! killed at 30 s forever, and every kill and restart adds to the load
//! that made it slow. A crash (an exit) does not grow it; the first
//! successful probe resets it.
//!
//! The actor owns a [`ProcessWatch`] for its incarnation: it starts the
//! process in `pre_start`, forwards its own `ExitPoll` and `Probe`
//! messages to [`ProcessWatch::on_exit_poll`] and [`ProcessWatch::on_probe`],
//! and calls [`ProcessWatch::stop`] from `post_stop` (SIGTERM, then
//! SIGKILL, to the group; the guards are not touched, SPEC §4).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::{ActorProcessingErr, ActorRef, Message};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::ports::RunningProcess;
use crate::status::{RuntimeComponent, StatusBoard};

/// Probe and restart tuning of a process actor (IKE daemon, monitor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessConfig {
    /// Between health probes once healthy.
    pub probe_period: Duration,
    /// Between probes until the first success.
    pub startup_probe_period: Duration,
    /// Between non-blocking exit checks.
    pub exit_poll: Duration,
    /// How long a fresh process may take to pass its first probe, when the
    /// incarnation before it did pass one.
    pub start_timeout: Duration,
    /// The most the start timeout grows to after incarnations in a row
    /// that timed out at start ([`StartPatience`]).
    pub start_timeout_max: Duration,
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
            start_timeout_max: Duration::from_secs(240),
            probe_failures: 2,
        }
    }
}

/// How many incarnations of one process in a row timed out before their
/// first successful probe; shared by every incarnation of its actor (the
/// actor's arguments are cloned for each). It sets the next start timeout.
#[derive(Debug, Clone, Default)]
pub struct StartPatience(Arc<AtomicU32>);

impl StartPatience {
    /// The start timeout for the next incarnation: `start_timeout` doubled
    /// once per start timeout in a row, at most `start_timeout_max` (never
    /// less than `start_timeout`).
    pub fn timeout(&self, config: &ProcessConfig) -> Duration {
        kube_ovn_ipsec_api::backoff::BackoffPolicy {
            initial: config.start_timeout,
            max: config.start_timeout_max,
            reset_after: Duration::MAX,
        }
        .delay_after(self.0.load(Ordering::Relaxed))
    }

    fn timed_out(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn passed(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

/// What one process actor hands its watch: who it is, its tuning, where
/// health and failures go, and how to build its own tick messages.
#[derive(Debug)]
pub(crate) struct WatchArgs<M> {
    /// Name in logs, metrics and the actor's error (`ike`, `monitor`).
    pub(crate) name: &'static str,
    /// Its part of `runtimeHealthy`.
    pub(crate) component: RuntimeComponent,
    /// Probe tuning.
    pub(crate) config: ProcessConfig,
    /// Where its health goes.
    pub(crate) board: StatusBoard,
    /// Failure counter.
    pub(crate) metrics: Arc<dyn Metrics>,
    /// The actor's exit-check message.
    pub(crate) exit_poll: fn() -> M,
    /// The actor's probe message.
    pub(crate) probe: fn() -> M,
    /// Start timeouts in a row, across incarnations.
    pub(crate) patience: StartPatience,
}

/// What a probe came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProbeVerdict {
    /// Healthy now.
    Healthy,
    /// Not (yet) healthy, keep going.
    NotYet(String),
    /// Give up: fail the actor with this reason.
    Fail(String),
}

/// One incarnation of a foreground process, as its actor holds it: the
/// process, its probe bookkeeping and the exit-poll timer.
#[derive(Debug)]
pub(crate) struct ProcessWatch<P: ?Sized, M> {
    args: WatchArgs<M>,
    myself: ActorRef<M>,
    process: Box<P>,
    started: Instant,
    start_timeout: Duration,
    healthy_once: bool,
    consecutive: u32,
    healthy: bool,
    exit_poll: Option<JoinHandle<()>>,
}

impl<P, M> ProcessWatch<P, M>
where
    P: RunningProcess + ?Sized,
    M: Message,
{
    /// Marks the component unhealthy, starts the process with `start` and
    /// schedules the exit polls and the first probe on `myself`. A process
    /// that does not start fails the actor (counted as a process failure).
    pub(crate) async fn start(
        args: WatchArgs<M>,
        myself: &ActorRef<M>,
        start: impl Future<Output = Result<Box<P>>>,
    ) -> std::result::Result<Self, ActorProcessingErr> {
        args.board.set_runtime_health(args.component, false);
        let process = start.await.map_err(|e| {
            args.metrics.process_failure(args.name);
            Error::Process {
                process: args.name,
                reason: format!("start: {e}"),
            }
        })?;
        let exit_poll = Some(myself.send_interval(args.config.exit_poll, args.exit_poll));
        myself.send_after(args.config.startup_probe_period, args.probe);
        let start_timeout = args.patience.timeout(&args.config);
        Ok(Self {
            args,
            myself: myself.clone(),
            process,
            started: Instant::now(),
            start_timeout,
            healthy_once: false,
            consecutive: 0,
            healthy: false,
            exit_poll,
        })
    }

    /// Whether the process passed its last probe.
    pub(crate) fn healthy(&self) -> bool {
        self.healthy
    }

    /// Its PID (also its process group).
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The process itself, for what only its actor does with it.
    pub(crate) fn process(&mut self) -> &mut P {
        &mut self.process
    }

    /// The non-blocking exit check: an exited process fails the actor.
    pub(crate) async fn on_exit_poll(&mut self) -> std::result::Result<(), ActorProcessingErr> {
        match self.process.try_exited() {
            Some(s) => Err(self.fail(format!("exited ({s})")).await),
            None => Ok(()),
        }
    }

    /// Runs one probe, records the health and schedules the next probe;
    /// returns whether the process is healthy now. When the policy gives
    /// up, the process is stopped and the error fails the actor.
    pub(crate) async fn on_probe(&mut self) -> std::result::Result<bool, ActorProcessingErr> {
        let healthy = match self.probe().await {
            ProbeVerdict::Healthy => true,
            ProbeVerdict::NotYet(why) => {
                tracing::debug!(process = self.args.name, %why, "probe failed");
                false
            }
            ProbeVerdict::Fail(reason) => return Err(self.fail(reason).await),
        };
        if healthy != self.healthy {
            tracing::info!(process = self.args.name, healthy, "process health");
        }
        self.healthy = healthy;
        self.args
            .board
            .set_runtime_health(self.args.component, healthy);
        self.myself.send_after(self.next_probe(), self.args.probe);
        Ok(healthy)
    }

    /// The normal stop (`post_stop`): the exit poll ends, the component
    /// counts as unhealthy, and the process group gets SIGTERM, then
    /// SIGKILL.
    pub(crate) async fn stop(&mut self) {
        self.stop_exit_poll();
        self.args
            .board
            .set_runtime_health(self.args.component, false);
        if let Err(e) = self.process.stop().await {
            tracing::warn!(process = self.args.name, error = %e, "stopping the process on shutdown");
        }
    }

    /// When to probe next.
    fn next_probe(&self) -> Duration {
        if self.healthy_once {
            let period = self.args.config.probe_period;
            self.process
                .probe_again_within()
                .map_or(period, |soon| soon.min(period))
        } else {
            self.args.config.startup_probe_period
        }
    }

    /// Runs one probe and applies the policy.
    async fn probe(&mut self) -> ProbeVerdict {
        if let Some(s) = self.process.try_exited() {
            return ProbeVerdict::Fail(format!("exited ({s})"));
        }
        match self.process.probe().await {
            Ok(()) => {
                if !self.healthy_once {
                    self.args.patience.passed();
                }
                self.healthy_once = true;
                self.consecutive = 0;
                ProbeVerdict::Healthy
            }
            Err(e) => {
                self.consecutive += 1;
                let why = e.to_string();
                let config = &self.args.config;
                if self.healthy_once && self.consecutive >= config.probe_failures {
                    ProbeVerdict::Fail(format!(
                        "{} failed probes in a row, last: {why}",
                        self.consecutive
                    ))
                } else if !self.healthy_once
                    && Instant::now().duration_since(self.started) >= self.start_timeout
                {
                    self.args.patience.timed_out();
                    ProbeVerdict::Fail(format!(
                        "no successful probe within {:?}, last: {why}",
                        self.start_timeout
                    ))
                } else {
                    ProbeVerdict::NotYet(why)
                }
            }
        }
    }

    /// Stops the process and turns `reason` into the actor's failure.
    async fn fail(&mut self, reason: String) -> ActorProcessingErr {
        self.stop_exit_poll();
        let name = self.args.name;
        self.args
            .board
            .set_runtime_health(self.args.component, false);
        self.args.metrics.process_failure(name);
        tracing::warn!(process = name, pid = self.process.pid(), %reason, "process failed; stopping its group for a restart");
        if let Err(e) = self.process.stop().await {
            tracing::warn!(process = name, error = %e, "stopping the failed process");
        }
        Box::new(Error::Process {
            process: name,
            reason,
        })
    }

    fn stop_exit_poll(&mut self) {
        if let Some(h) = self.exit_poll.take() {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_patience_doubles_per_timeout_up_to_the_cap_and_resets() {
        let config = ProcessConfig::default();
        let p = StartPatience::default();
        let secs = |p: &StartPatience| p.timeout(&config).as_secs();
        assert_eq!(secs(&p), 30);
        let mut seen = vec![];
        for _ in 0..5 {
            p.timed_out();
            seen.push(secs(&p));
        }
        assert_eq!(seen, [60, 120, 240, 240, 240]);
        p.passed();
        assert_eq!(secs(&p), 30);
        // A cap below the base leaves the base.
        let tight = ProcessConfig {
            start_timeout_max: Duration::from_secs(10),
            ..config
        };
        p.timed_out();
        assert_eq!(p.timeout(&tight), Duration::from_secs(30));
        // Many timeouts do not overflow.
        for _ in 0..100 {
            p.timed_out();
        }
        assert_eq!(secs(&p), 240);
    }
}
