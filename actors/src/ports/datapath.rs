//! The datapath actor's port: one sample of the node's encrypted data path
//! — per peer the SA counters of each direction, the kernel's XFRM error
//! counters, the MTUs. The `runtime` crate reads it from netlink XFRM (SAs
//! attributed to the lease; keys never parsed), `/proc/net/xfrm_stat` of
//! the node's namespace, OVSDB's tunnel interfaces and netlink route.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::IpAddr;

use async_trait::async_trait;
use kube_ovn_ipsec_api::datapath::Encapsulation;

use crate::error::Result;

/// One SA's lifetime counters (no keys: the dump parser never reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaSample {
    /// The SPI: counters restart with every rekeyed SA, so movement is
    /// judged per SPI.
    pub spi: u32,
    /// Bytes carried.
    pub bytes: u64,
    /// Packets carried.
    pub packets: u64,
}

/// One tunnel with IPsec intent (`remote_name`) and its SAs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSample {
    /// The tunnel's `remote_ip`.
    pub peer: IpAddr,
    /// The tunnel's local address.
    pub local: IpAddr,
    /// The tunnel's `remote_name`, as OVSDB has it.
    pub chassis: Option<String>,
    /// The interface type, when it is one the MTU check knows.
    pub encapsulation: Option<Encapsulation>,
    /// This node's SAs to the peer (larval acquire states excluded).
    pub outbound: Vec<SaSample>,
    /// The peer's SAs to this node.
    pub inbound: Vec<SaSample>,
    /// Whether any of them is UDP-encapsulated (NAT-T).
    pub nat_traversal: bool,
}

/// One reading of the data path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatapathSample {
    /// Every tunnel with IPsec intent.
    pub peers: Vec<PeerSample>,
    /// `/proc/net/xfrm_stat` of the node's namespace, by counter name.
    pub xfrm_stat: BTreeMap<String, u64>,
    /// The MTU of the interface holding the tunnels' local address.
    pub underlay_mtu: Option<u32>,
    /// The tunnel (Pod) MTU: configured, or read from the interface
    /// Kube-OVN gives the Pod MTU (`ovn0`).
    pub tunnel_mtu: Option<u32>,
    /// Kernel SAs attributed to the lease.
    pub lease_sas: usize,
    /// Kernel policies attributed to the lease (guards included).
    pub lease_policies: usize,
}

/// Reads the data path.
#[async_trait]
pub trait DatapathPort: Send + Sync + Debug {
    /// One sample; `None` while the node holds no lease (nothing of its
    /// own to measure). `full`: also re-read what changes rarely (MTUs,
    /// the policy count), which an adapter may otherwise cache.
    async fn sample(&self, full: bool) -> Result<Option<DatapathSample>>;
}
