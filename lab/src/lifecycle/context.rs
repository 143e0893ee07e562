//! The run in progress as every step sees it: the clock its lines are
//! stamped with, the report they go to, the summary each step fills in and
//! the probe phases it opens; and how a step fails. One shared type so
//! every step prints, times and fails the same way.

use std::time::Instant;

use testbed::probe::unix_now;

use super::options::Report;
use crate::summary::{StepTime, Summary};

/// A failed step's reason.
#[derive(Debug)]
pub(super) struct Fail(pub(super) String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

/// What a step comes to: its value, or why it failed.
pub(super) type Step<T = ()> = Result<T, Fail>;

/// Fails the current step with `why`.
pub(super) fn fail<T>(why: impl Into<String>) -> Step<T> {
    Err(Fail(why.into()))
}

/// The run in progress: the clock, the report, the summary.
pub(super) struct Run<'a> {
    pub(super) t0: Instant,
    pub(super) report: &'a mut dyn Report,
    pub(super) summary: Summary,
    /// (phase, start as Unix seconds), in order.
    pub(super) phases: Vec<(String, f64)>,
}

impl<'a> Run<'a> {
    /// A run starting now on `kernel`, reporting to `report`.
    pub(super) fn new(report: &'a mut dyn Report, kernel: &str) -> Self {
        Run {
            t0: Instant::now(),
            report,
            summary: Summary {
                kernel: kernel.to_string(),
                ..Summary::default()
            },
            phases: Vec::new(),
        }
    }

    /// One progress line, stamped with the time since the run started.
    pub(super) fn line(&mut self, step: &str, node: &str, detail: impl std::fmt::Display) {
        let l = format!(
            "[{:>6.1}s] {step:<18} {node:<8} {detail}",
            self.t0.elapsed().as_secs_f64()
        );
        self.report.line(&l);
    }

    /// `step` starts: the summary says so.
    pub(super) fn begin(&mut self, step: &str) {
        self.summary.step = step.to_string();
        self.report.status(&self.summary);
    }

    /// `step` is done: its time goes into the summary.
    pub(super) fn done(&mut self, step: &str) {
        self.summary.steps.push(StepTime {
            step: step.to_string(),
            at_s: self.t0.elapsed().as_secs_f64(),
        });
        self.report.status(&self.summary);
    }

    /// A probe phase starts now: the echoes from here on are its own.
    pub(super) fn phase(&mut self, name: &str) {
        self.phase_at(name, unix_now());
    }

    /// A probe phase started at `at` (Unix seconds: the commit that began
    /// it, which the lab may see later); never before the previous phase.
    pub(super) fn phase_at(&mut self, name: &str, at: f64) {
        let at = self.phases.last().map_or(at, |(_, prev)| at.max(*prev));
        self.phases.push((name.to_string(), at));
    }

    /// When the run started, in Unix seconds (the probes' clock).
    pub(super) fn t0_unix(&self) -> f64 {
        unix_now() - self.t0.elapsed().as_secs_f64()
    }

    /// Seconds since the run started, to a tenth.
    pub(super) fn secs(&self) -> f64 {
        (self.t0.elapsed().as_secs_f64() * 10.0).round() / 10.0
    }
}

/// The [`Instant`] of `at` (Unix seconds, in the past), for the windows
/// timed from a commit the lab saw later.
pub(super) fn instant_of(at: f64) -> Instant {
    let ago = std::time::Duration::from_secs_f64((unix_now() - at).max(0.0));
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}
