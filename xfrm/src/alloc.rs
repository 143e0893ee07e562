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

/// Refuses a reserved-bits mask that leaves no mark to allocate: every
/// candidate would be reserved or zero, so allocation could only fail, on
/// every retry, for ever. Checked where the mask is configured, so the
/// agent refuses to start with the reason instead.
pub fn check_reserved_bits(reserved_bits: u32) -> Result<(), String> {
    if !reserved_bits == 0 {
        return Err(format!(
            "reserved mark bits {reserved_bits:#010x} leave no bit for the output-protection \
             mark: reserve only the bits other programs on the node set (kube-proxy: 0xc000)"
        ));
    }
    Ok(())
}

/// Draws candidates from `rng` until one passes [`check_candidate`] against
/// `policies` and `states`; refuses with [`Error::BypassPresent`] while a
/// bypass exists and with [`Error::LeaseExhausted`] after
/// [`MAX_CANDIDATES`] rejections.
///
/// Candidates are drawn from the unreserved bits only: a wide reserved
/// mask would otherwise reject nearly every random mark and exhaust the
/// attempts although usable marks exist.
pub fn allocate(
    policies: &[Policy],
    states: &[State],
    reserved_bits: u32,
    rng: &mut dyn RandomSource,
) -> Result<Allocation, Error> {
    let mut last: Option<CandidateRejection> = None;
    for _ in 0..MAX_CANDIDATES {
        let mark = rng.next_u32() & !reserved_bits;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Random values in a fixed order.
    struct Scripted(std::vec::IntoIter<u32>);

    impl RandomSource for Scripted {
        fn next_u32(&mut self) -> u32 {
            self.0.next().unwrap_or(0)
        }
    }

    #[test]
    fn a_mask_with_no_free_bit_is_refused() {
        let e = check_reserved_bits(u32::MAX).unwrap_err();
        assert!(e.contains("0xffffffff"), "{e}");
        assert!(check_reserved_bits(0xffff_fffe).is_ok());
        assert!(check_reserved_bits(0).is_ok());
    }

    #[test]
    fn candidates_come_from_the_free_bits_only() {
        // One free bit: every random value lands on that mark, where
        // unmasked draws would have been rejected nearly always.
        let mut rng = Scripted(vec![0xdead_beef, 7].into_iter());
        let a = allocate(&[], &[], 0xffff_fffe, &mut rng).unwrap();
        assert_eq!((a.mark, a.reqid), (1, 7));
        // A draw that masks to zero is skipped, not used.
        let mut rng = Scripted(vec![0xffff_0000, 7, 0x0000_00f0, 8].into_iter());
        let a = allocate(&[], &[], 0xffff_0000, &mut rng).unwrap();
        assert_eq!((a.mark, a.reqid), (0xf0, 8));
    }
}
