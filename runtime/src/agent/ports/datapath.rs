//! [`DatapathPort`] over the protection adapter's node: one sample reads
//! the lease's SAs per peer and `xfrm_stat` every time, the MTUs and the
//! policy count now and then.

use std::sync::Arc;

use actors::ports::{DatapathPort, DatapathSample, blocking};
use async_trait::async_trait;
use xfrm::Xfrm;

// The readers keep their old path here.
pub use super::datapath_readers::{DatapathReaders, TunnelMtu};
use super::lock;
use super::protection::{ProtectedNode, ProtectionAdapter, protection_err};
use crate::lease::Lease;
use crate::sa;

impl ProtectedNode {
    /// One data-path sample of `lease` over `peers` (blocking: netlink
    /// dumps and a `/proc` read).
    fn sample_datapath(
        &self,
        lease: &Lease,
        peers: &[sa::PeerTunnel],
        full: bool,
    ) -> actors::Result<DatapathSample> {
        let mut readers = lock(&self.datapath);
        let local = peers.first().map(|p| p.endpoints.local);
        let slow_due = readers.begin_sample(local, full);
        let states = lock(&self.keeper)
            .xfrm()
            .dump_states()
            .map_err(protection_err)?;
        if slow_due {
            let policies = lock(&self.keeper)
                .xfrm()
                .dump_policies()
                .map_err(protection_err)?;
            let tunnels: Vec<sa::TunnelEndpoints> = peers.iter().map(|p| p.endpoints).collect();
            let lease_policies = sa::attribute(lease, &states, &policies, &tunnels)
                .policies
                .len();
            readers
                .read_slow(local, lease_policies)
                .map_err(protection_err)?;
        }
        let xfrm_stat = readers.read_stat().map_err(protection_err)?;
        let slow = readers.slow();
        let peers = sa::peer_samples(lease, &states, peers);
        let lease_sas = peers
            .iter()
            .map(|p| p.outbound.len() + p.inbound.len())
            .sum();
        Ok(DatapathSample {
            peers,
            xfrm_stat,
            underlay_mtu: slow.underlay_mtu,
            tunnel_mtu: slow.tunnel_mtu,
            lease_sas,
            lease_policies: slow.lease_policies,
        })
    }
}

#[async_trait]
impl DatapathPort for ProtectionAdapter {
    async fn sample(&self, full: bool) -> actors::Result<Option<DatapathSample>> {
        let Ok(lease) = self.node.current() else {
            return Ok(None);
        };
        let peers = sa::read_peers(&self.ovs, lease.reqid)
            .await
            .map_err(protection_err)?;
        let node = Arc::clone(&self.node);
        blocking(move || node.sample_datapath(&lease, &peers, full))
            .await
            .map(Some)
    }
}
