//! What a data-path sample reads besides XFRM: the kernel's XFRM counters
//! and the link MTUs, opened once in the node's network namespace. The
//! protection adapter's node owns the readers and the data-path port
//! samples through them, so they live below both.

use std::collections::BTreeMap;
use std::net::IpAddr;

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
/// when the tunnels' local address changes: the sample stays one SA dump,
/// one OVSDB select and one `/proc` read, which matters on nodes with many
/// peers and under emulation.
const SLOW_EVERY: u64 = 30;

/// The rarely changing part of a sample.
#[derive(Debug, Clone, Default)]
pub(super) struct SlowReadings {
    /// The tunnels' local address they were read for.
    local: Option<IpAddr>,
    /// The MTU of the link that holds the tunnels' local address.
    pub(super) underlay_mtu: Option<u32>,
    /// The tunnel (Pod) MTU.
    pub(super) tunnel_mtu: Option<u32>,
    /// The kernel policies attributed to the lease.
    pub(super) lease_policies: usize,
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

    /// Counts a sample of the tunnels at `local`; whether its slow part is
    /// due (`full` asks for it).
    pub(super) fn begin_sample(&mut self, local: Option<IpAddr>, full: bool) -> bool {
        let due = full
            || self
                .slow
                .as_ref()
                .is_none_or(|s| s.local != local || self.samples.is_multiple_of(SLOW_EVERY));
        self.samples += 1;
        due
    }

    /// Reads the MTUs for the tunnels at `local` (blocking: netlink) and
    /// keeps them, with the policy count, until the slow part is next due.
    pub(super) fn read_slow(
        &mut self,
        local: Option<IpAddr>,
        lease_policies: usize,
    ) -> Result<(), xfrm::Error> {
        let underlay_mtu = match local {
            Some(a) => self.links.mtu_of_address(a)?,
            None => None,
        };
        let tunnel_mtu = match self.tunnel_mtu.clone() {
            TunnelMtu::Fixed(m) => Some(m),
            TunnelMtu::Interface(name) => self.links.mtu_of_name(&name)?,
        };
        self.slow = Some(SlowReadings {
            local,
            underlay_mtu,
            tunnel_mtu,
            lease_policies,
        });
        Ok(())
    }

    /// The kernel's XFRM counters now (empty when the kernel keeps none).
    pub(super) fn read_stat(&mut self) -> Result<BTreeMap<String, u64>, xfrm::Error> {
        Ok(match self.stat.as_mut() {
            Some(f) => f.read()?.into_map(),
            None => Default::default(),
        })
    }

    /// The slow part as last read (empty before the first read).
    pub(super) fn slow(&self) -> SlowReadings {
        self.slow.clone().unwrap_or_default()
    }
}
