//! The protection, data-path, IKE and monitor actors' ports over this
//! crate's adapters, one file per port:
//!
//! - [`protection`]: lease and guards ([`crate::lease`], [`xfrm::guard`]
//!   over netlink XFRM), the lease's publication and SA observation;
//! - [`datapath`]: the data-path sample (the lease's SAs per peer,
//!   `xfrm_stat`, link MTUs) through the same node, with the readers of
//!   the counters and MTUs in `datapath_readers` (the node owns them);
//! - [`ike`]: the IKE daemon ([`crate::ike`]), and the trust bundle
//!   installed into its CA directory one file per CA;
//! - [`monitor`]: the monitor ([`crate::monitor`], with the acknowledgement,
//!   which only reads).

use std::sync::{Mutex, MutexGuard};

pub mod datapath;
mod datapath_readers;
pub mod ike;
pub mod monitor;
pub mod protection;

pub use datapath::{DatapathReaders, TunnelMtu};
pub use ike::IkeAdapter;
pub use monitor::MonitorAdapter;
pub use protection::ProtectionAdapter;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn process_err(process: &'static str, e: crate::Error) -> actors::Error {
    actors::Error::Process {
        process,
        reason: e.to_string(),
    }
}
