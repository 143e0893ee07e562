//! The plaintext-again step, after `Disabled`: pod traffic between every
//! pair is answered and the underlay carries plaintext Geneve only, no ESP
//! — disabling is checked on the wire, the same way enabling was.

use super::context::{Run, Step};
use super::wire::wire_check;
use super::world::World;

/// Every node's pod pings every other while its underlay is captured:
/// replies, plaintext Geneve on the wire, no ESP.
pub(super) fn plaintext_again(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("plaintext again");
    wire_check(run, w, "plaintext again", false)?;
    run.done("plaintext again");
    Ok(())
}
