//! Kernel XFRM through netlink (never an `ip` subprocess), and the
//! output-protection guards built on it (SPEC §4).
//!
//! # Layout
//!
//! - [`model`]: pure types and checks — policies, states, the guard's
//!   shape, alias and bypass detection, field-by-field comparison.
//! - [`codec`]: pure request building and reply parsing (SA keys are never
//!   copied out of the receive buffer).
//! - [`handle`]: [`XfrmHandle`], a blocking netlink socket of one network
//!   namespace, behind the [`Xfrm`] trait. Every call blocks (microseconds
//!   per request, milliseconds for a large dump): async callers run it on a
//!   blocking thread.
//! - [`guard`]: [`guard::GuardKeeper`] — arming, read-back by index,
//!   re-adding a vanished guard, withdrawal of exactly a lease's guards.
//! - [`alloc`]: a mark and reqid that alias nothing in the kernel.
//! - [`stat`]: the kernel's XFRM error counters (`/proc/net/xfrm_stat`),
//!   parsed, and the file kept open in a namespace.
//! - [`link`]: interface MTUs and addresses over netlink route — what the
//!   MTU check of the encrypted overlay needs (not XFRM, but the same
//!   socket machinery and namespace handling).
//! - [`netns`]: opening a socket or file inside another network namespace.
//! - [`Error`]: the crate's one error type.
//!
//! What a lease *is* (its id, its Node UID, its file and its OVSDB
//! publication) belongs to the agent (`runtime::lease`); this crate only
//! needs its mark and its guards' indexes ([`guard::GuardSet`]).

pub mod alloc;
pub mod codec;
mod error;
pub mod guard;
pub mod handle;
pub mod link;
pub mod model;
pub mod netns;
pub mod stat;

pub use error::Error;
pub use handle::{AddOutcome, Xfrm, XfrmHandle};
