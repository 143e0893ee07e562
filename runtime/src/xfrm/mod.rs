//! Kernel XFRM through netlink (never an `ip` subprocess).
//!
//! - [`model`]: pure types and checks — policies, states, the guard's
//!   shape, alias and bypass detection, field-by-field comparison.
//! - [`codec`]: pure request building and reply parsing (SA keys are never
//!   copied out of the receive buffer).
//! - [`handle`]: [`XfrmHandle`], a blocking netlink socket of one network
//!   namespace, behind the [`Xfrm`] trait.

pub mod codec;
pub mod handle;
pub mod model;

pub use handle::{AddOutcome, Xfrm, XfrmHandle};
