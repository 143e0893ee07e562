//! The encrypted step, once `Enabled`: pod traffic between every pair is
//! answered and the underlay carries ESP only, no plaintext Geneve — the
//! point of enabling IPsec, checked on the wire rather than taken from the
//! agents' word.

use super::context::{Run, Step};
use super::wire::wire_check;
use super::world::World;

/// Every node's pod pings every other while its underlay is captured:
/// replies, ESP on the wire, no plaintext Geneve.
pub(super) fn encrypted(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("encrypted");
    wire_check(run, w, "encrypted", true)?;
    run.done("encrypted");
    Ok(())
}
