//! Allocation of an output-protection mark and reqid (SPEC §4): random
//! candidates, each rejected when it aliases an existing XFRM mark (under
//! its mask) or reqid or has reserved bits; refused while a bypass exists.
//!
//! Pure over the dumps it is given: the caller reads the kernel's policies
//! and states (one dump each) and persists what it allocates.

use crate::Error;
use crate::model::{CandidateRejection, Policy, State, check_candidate, find_bypass};

/// Candidates tried before allocation gives up. With random 32-bit marks
/// and 31-bit reqids a node would need millions of policies for 256
/// rejections in a row; reaching it means something systematic (a
/// wildcard-mask policy with a mark) that an operator must look at.
pub const MAX_CANDIDATES: u32 = 256;

/// Randomness for allocation (a trait so tests can force collisions).
pub trait RandomSource {
    /// A uniformly random 32-bit value.
    fn next_u32(&mut self) -> u32;
}

/// The operating system's CSPRNG (through `rand`).
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn next_u32(&mut self) -> u32 {
        rand::random()
    }
}

/// A mark and reqid that alias nothing in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The output mark (exact, `/0xffffffff`).
    pub mark: u32,
    /// The reqid (1..2^31-1).
    pub reqid: u32,
}

/// Draws candidates from `rng` until one passes [`check_candidate`] against
/// `policies` and `states`; refuses with [`Error::BypassPresent`] while a
/// bypass exists and with [`Error::LeaseExhausted`] after
/// [`MAX_CANDIDATES`] rejections.
pub fn allocate(
    policies: &[Policy],
    states: &[State],
    reserved_bits: u32,
    rng: &mut dyn RandomSource,
) -> Result<Allocation, Error> {
    let mut last: Option<CandidateRejection> = None;
    for _ in 0..MAX_CANDIDATES {
        let mark = rng.next_u32();
        let reqid = rng.next_u32() & 0x7fff_ffff;
        if let Err(r) = check_candidate(mark, reqid, reserved_bits, policies, states) {
            tracing::debug!(rejection = ?r, "lease candidate rejected");
            last = Some(r);
            continue;
        }
        // What remains matches every mark (a mark-specific bypass is an
        // alias above): no candidate could avoid it.
        if let Some(bypass) = find_bypass(mark, policies) {
            return Err(Error::BypassPresent {
                reason: bypass.to_string(),
            });
        }
        return Ok(Allocation { mark, reqid });
    }
    Err(Error::LeaseExhausted {
        attempts: MAX_CANDIDATES,
        last: last.map_or_else(String::new, |r| format!("{r:?}")),
    })
}
