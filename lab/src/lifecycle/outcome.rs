//! How a run's end goes into its summary: finished, or the step that
//! failed with its reason printed and, when the lab got as far as its
//! nodes, the operator pointed to the logs. Kept apart from the steps so a
//! failure anywhere is reported one way.

use super::context::{Fail, Run, Step};
use super::options::Options;
use crate::summary::Failure;

/// Records `outcome` in the summary (`world`: the nodes were brought up,
/// so there are logs to point to).
pub(super) fn record(run: &mut Run<'_>, outcome: Step, opts: &Options, world: bool) {
    match outcome {
        Ok(()) => {
            run.summary.finished = true;
            run.summary.step = "done".into();
        }
        Err(Fail(reason)) => {
            let step = run.summary.step.clone();
            run.line(&step, "-", format!("FAILED: {reason}"));
            if world {
                run.line(
                    &step,
                    "-",
                    format!("logs and diagnostics under {}", opts.logs.display()),
                );
            }
            run.summary.failed = Some(Failure { step, reason });
        }
    }
}
