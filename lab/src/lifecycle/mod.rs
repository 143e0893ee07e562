//! The lab's run: the whole IPsec lifecycle on simulated nodes, each step
//! printed as it happens and checked, the [`Summary`] rewritten after each.
//!
//! enable → identities issued → guards armed → runtime up → NB and SB true
//! → tunnels gain intent → IKE and CHILD SAs between every pair → pod
//! traffic encrypted (underlay: ESP only) → one IKE+CHILD negotiation
//! measured → a renewal while traffic runs → one agent actor's process
//! killed and recovered → every pair's IKE_SA rekeyed → the CA rotated
//! (every node renews onto the new CA) and the old one retired (every
//! node rebuilds its tunnels, a measured window) → disable → the
//! node-by-node cleanup rollout → `Disabled` → plaintext again → every namespace checked for leftover
//! project state (none) and foreign state (untouched) → the accounting:
//! no echo lost around an event, no plaintext while intent was on, no XFRM
//! error counter grown outside the windows. A probe stream per
//! pod pair runs from before enable to after `Disabled`.
//!
//! A step fails on what would be a fault in a cluster (no SA, plaintext on
//! the wire while enabled, not `Disabled`, state left behind); lost echoes
//! are reported per phase for the operator and the tests to judge.
//!
//! This file holds only the order: [`run`] and the list of steps. Each
//! step is its own submodule; what they share is in `context` (the run in
//! progress, how a step fails) and `world` (what the run keeps alive), so
//! the steps never import this file and this file only calls into them.

// The lab drives real processes in real time: blocking waits and
// wall-clock deadlines belong to the driver, outside any actor. The allow
// covers every step's submodule.
#![allow(clippy::disallowed_methods)]

mod accounting;
mod actor_kill;
mod ca_rotation;
mod cleanup;
mod context;
mod control_plane;
mod datapath;
mod disable;
mod enable;
mod encrypted;
mod evidence;
mod intent;
mod leftovers;
mod logs;
mod negotiation;
mod nodes;
mod options;
mod outcome;
mod plaintext;
mod plaintext_again;
mod pod;
mod readings;
mod rekeys;
mod renewal;
mod rows;
mod sas;
mod tally;
mod windows;
mod wire;
mod world;

pub use logs::logs_hint;
pub use options::{Options, Report};
pub use pod::pod_ip;

use context::{Run, Step, fail};
use world::World;

use crate::summary::Summary;
use harness::control_plane::Binaries;

/// Runs the lifecycle; the summary says how far it got and, if it
/// stopped, which step failed and why.
pub async fn run(opts: &Options, bins: &Binaries, report: &mut dyn Report) -> Summary {
    let mut run = Run::new(report, &opts.kernel);
    let mut world = None;
    let outcome = steps(&mut run, opts, bins, &mut world).await;
    if let Some(w) = &mut world {
        tally::tally(&mut run, w);
    }
    outcome::record(&mut run, outcome, opts, world.is_some());
    run.report.status(&run.summary);
    if let Some(w) = &world {
        logs::collect(w);
    }
    // Stop the probes before the nodes go.
    if let Some(w) = &mut world {
        for p in w.probes.drain(..) {
            p.stop();
        }
    }
    run.summary
}

/// The steps, in order; the first to fail ends the run. `world` is filled
/// in by the nodes step so the run's end can tally and collect logs even
/// after a later step failed.
async fn steps(
    run: &mut Run<'_>,
    opts: &Options,
    bins: &Binaries,
    world: &mut Option<World>,
) -> Step {
    if opts.nodes < 2 {
        return fail("the lab needs at least 2 nodes");
    }
    run.line("kernel", "-", &opts.kernel);
    let cp = control_plane::start(run, opts).await?;
    let w = nodes::bring_up(run, opts, bins, cp, world)?;
    plaintext::plaintext_overlay(run, w, opts.probe_interval)?;
    enable::enable(run, w).await?;
    let flipped = intent::intent(run, w)?;
    sas::sas(run, w, flipped).await?;
    encrypted::encrypted(run, w)?;
    datapath::datapath(run, w).await?;
    negotiation::negotiation(run, w)?;
    renewal::renewal(run, w).await?;
    actor_kill::actor_kill(run, w).await?;
    rekeys::rekeys(run, w).await?;
    ca_rotation::ca_rotation(run, w).await?;
    let intent_given = disable::disable(run, w).await?;
    cleanup::cleanup_rollout(run, w, intent_given).await?;
    plaintext_again::plaintext_again(run, w)?;
    leftovers::leftovers(run, w)?;
    accounting::accounting(run, w)?;
    Ok(())
}
