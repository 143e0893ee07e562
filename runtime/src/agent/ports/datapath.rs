//! [`DatapathPort`] over the protection adapter's node: one sample reads
//! the lease's SAs per peer and `xfrm_stat` every time, the MTUs and the
//! policy count now and then.

use std::sync::Arc;

use actors::ports::{DatapathPort, DatapathSample, blocking};
use async_trait::async_trait;
use xfrm::Xfrm;

use super::lock;
use super::protection::{ProtectedNode, ProtectionAdapter, protection_err};
use crate::lease::Lease;
use crate::sa;

/// Where the tunnel (Pod) MTU of the MTU check comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelMtu {
    /// Configured (kube-ovn-cni's `--mtu`).
    Fixed(u32),
    /// The MTU of this interface of the node's namespace (`ovn0`, which
    /// kube-ovn-cni gives the Pod MTU).
    Interface(String),
}

/// What a data-path sample reads besides XFRM, opened once in the node's
/// network namespace: the kernel's XFRM counters and the link MTUs.
#[derive(Debug)]
pub struct DatapathReaders {
    stat: Option<xfrm::stat::StatFile>,
    links: xfrm::link::LinkHandle,
    tunnel_mtu: TunnelMtu,
    /// Samples taken.
    samples: u64,
    /// What changes rarely, re-read every [`SLOW_EVERY`] samples.
    slow: Option<SlowReadings>,
}

/// A sample reads the SAs and `xfrm_stat` every time — what movement is
/// judged by — and the MTUs and the policy dump (only counted) every this
/// many samples (a minute at the default period), on `ipsec/refresh`, or
/// when the tunnels' local address changes: the sample stays one SA dump, one OVSDB select
/// and one `/proc` read, which matters on nodes with many peers and under
/// emulation.
const SLOW_EVERY: u64 = 30;

/// The rarely changing part of a sample.
#[derive(Debug, Clone, Default)]
struct SlowReadings {
    /// The tunnels' local address they were read for.
    local: Option<std::net::IpAddr>,
    underlay_mtu: Option<u32>,
    tunnel_mtu: Option<u32>,
    lease_policies: usize,
}

impl DatapathReaders {
    /// Opens the readers in the named network namespace (`None`: this
    /// process's). Blocks briefly (a helper thread enters the namespace).
    pub fn open(netns: Option<&str>, tunnel_mtu: TunnelMtu) -> Result<Self, crate::Error> {
        let stat = xfrm::stat::StatFile::open(netns)?;
        if stat.is_none() {
            tracing::warn!(
                "this kernel keeps no XFRM statistics (/proc/net/xfrm_stat): GuardDrop cannot be told from NoSA"
            );
        }
        let links = match netns {
            Some(ns) => xfrm::link::LinkHandle::in_netns(ns)?,
            None => xfrm::link::LinkHandle::open()?,
        };
        Ok(Self {
            stat,
            links,
            tunnel_mtu,
            samples: 0,
            slow: None,
        })
    }
}

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
        let stale = full
            || readers
                .slow
                .as_ref()
                .is_none_or(|s| s.local != local || readers.samples.is_multiple_of(SLOW_EVERY));
        readers.samples += 1;
        let states = lock(&self.keeper)
            .xfrm()
            .dump_states()
            .map_err(protection_err)?;
        if stale {
            let policies = lock(&self.keeper)
                .xfrm()
                .dump_policies()
                .map_err(protection_err)?;
            let tunnels: Vec<sa::TunnelEndpoints> = peers.iter().map(|p| p.endpoints).collect();
            let lease_policies = sa::attribute(lease, &states, &policies, &tunnels)
                .policies
                .len();
            let underlay_mtu = match local {
                Some(a) => readers.links.mtu_of_address(a).map_err(protection_err)?,
                None => None,
            };
            let tunnel_mtu = match readers.tunnel_mtu.clone() {
                TunnelMtu::Fixed(m) => Some(m),
                TunnelMtu::Interface(name) => {
                    readers.links.mtu_of_name(&name).map_err(protection_err)?
                }
            };
            readers.slow = Some(SlowReadings {
                local,
                underlay_mtu,
                tunnel_mtu,
                lease_policies,
            });
        }
        let xfrm_stat = match readers.stat.as_mut() {
            Some(f) => f.read().map_err(protection_err)?.into_map(),
            None => Default::default(),
        };
        let slow = readers.slow.clone().unwrap_or_default();
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
