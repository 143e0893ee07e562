//! The lab's pod addresses: one pod per node on a single overlay /24, so
//! any step can name a peer's pod from the node's index alone.

use std::net::Ipv4Addr;

/// Pod `i`'s address.
pub fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, u8::try_from(i + 1).unwrap_or(u8::MAX))
}
