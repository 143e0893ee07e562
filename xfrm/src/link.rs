//! Interface MTUs and addresses over netlink route (`RTM_GETLINK`,
//! `RTM_GETADDR` dumps): which interface carries a tunnel's local address
//! and what its MTU is, and the MTU of a named interface — what the MTU
//! check of the encrypted overlay compares (SPEC §10). Never an `ip`
//! subprocess, never `/sys` (which shows the namespace of whoever mounted
//! it, not the node's). The codec is pure and unit-tested below.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
use netlink_sys::protocols::NETLINK_ROUTE;

use crate::Error;
use crate::codec::CodecError;
use crate::handle::Netlink;

/// `RTM_NEWLINK` (each interface of a dump).
const RTM_NEWLINK: u16 = 16;
/// `RTM_GETLINK`.
const RTM_GETLINK: u16 = 18;
/// `RTM_NEWADDR` (each address of a dump).
const RTM_NEWADDR: u16 = 20;
/// `RTM_GETADDR`.
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;
/// `struct ifaddrmsg`.
const IFADDRMSG_LEN: usize = 8;
const NLMSG_HDRLEN: usize = 16;

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Its index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its MTU.
    pub mtu: u32,
}

/// One address of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkAddress {
    /// The interface's index.
    pub index: u32,
    /// The address.
    pub address: IpAddr,
}

/// A dump request of `message_type` with an all-zero family header of
/// `body_len` bytes (every family, every interface).
pub fn dump_request(message_type: u16, body_len: usize, seq: u32) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body_len;
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    buf.extend_from_slice(&message_type.to_ne_bytes());
    buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.resize(len, 0);
    buf
}

/// The attributes after a fixed header: `(type, value)`.
fn attributes(mut rest: &[u8]) -> Result<Vec<(u16, &[u8])>, CodecError> {
    let mut out = Vec::new();
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        if len < 4 || len > rest.len() {
            return Err(CodecError(format!("route attribute length {len}")));
        }
        out.push((kind, &rest[4..len]));
        rest = rest.get(len.div_ceil(4) * 4..).unwrap_or_default();
    }
    Ok(out)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
}

/// Parses the body of an `RTM_NEWLINK` message; `None` for an interface
/// without a name or MTU.
pub fn parse_link(body: &[u8]) -> Result<Option<Link>, CodecError> {
    let head = body
        .get(..IFINFOMSG_LEN)
        .ok_or_else(|| CodecError(format!("short ifinfomsg: {}", body.len())))?;
    let index = u32_at(head, 4).unwrap_or(0);
    let (mut name, mut mtu) = (None, None);
    for (kind, value) in attributes(&body[IFINFOMSG_LEN..])? {
        match kind {
            IFLA_IFNAME => {
                let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
                name = Some(String::from_utf8_lossy(&value[..end]).into_owned());
            }
            IFLA_MTU => mtu = u32_at(value, 0),
            _ => {}
        }
    }
    Ok(name.zip(mtu).map(|(name, mtu)| Link { index, name, mtu }))
}

/// Parses the body of an `RTM_NEWADDR` message: the local address
/// (`IFA_LOCAL`, else `IFA_ADDRESS`); `None` for a family other than IPv4
/// and IPv6.
pub fn parse_address(body: &[u8]) -> Result<Option<LinkAddress>, CodecError> {
    let head = body
        .get(..IFADDRMSG_LEN)
        .ok_or_else(|| CodecError(format!("short ifaddrmsg: {}", body.len())))?;
    let index = u32_at(head, 4).unwrap_or(0);
    let (mut local, mut address) = (None, None);
    for (kind, value) in attributes(&body[IFADDRMSG_LEN..])? {
        let ip = match value.len() {
            4 => Some(IpAddr::from([value[0], value[1], value[2], value[3]])),
            16 => <[u8; 16]>::try_from(value).ok().map(IpAddr::from),
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => address = ip,
            _ => {}
        }
    }
    Ok(local
        .or(address)
        .map(|address| LinkAddress { index, address }))
}

/// A `NETLINK_ROUTE` socket of one network namespace, for reading only.
pub struct LinkHandle {
    nl: Netlink,
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle").finish_non_exhaustive()
    }
}

impl LinkHandle {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        Ok(Self {
            nl: Netlink::open(NETLINK_ROUTE)?,
        })
    }

    /// Opens a socket in the named network namespace (see
    /// [`crate::netns::run_in`]).
    pub fn in_netns(name: &str) -> Result<Self, Error> {
        crate::netns::run_in(name, LinkHandle::open)
    }

    /// Dumps `request` (family header of `body_len` bytes) and parses each
    /// `reply`-typed message with `parse`.
    fn dump<T>(
        &mut self,
        what: &'static str,
        request: u16,
        body_len: usize,
        reply: u16,
        parse: fn(&[u8]) -> Result<Option<T>, CodecError>,
    ) -> Result<Vec<T>, Error> {
        let seq = self.nl.next_seq();
        self.nl.send(what, &dump_request(request, body_len, seq))?;
        let mut out = Vec::new();
        self.nl.receive(what, seq, true, |t, body| {
            if t == reply
                && let Some(v) = parse(body)?
            {
                out.push(v);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Every interface.
    pub fn links(&mut self) -> Result<Vec<Link>, Error> {
        self.dump(
            "dump links",
            RTM_GETLINK,
            IFINFOMSG_LEN,
            RTM_NEWLINK,
            parse_link,
        )
    }

    /// Every address of every interface.
    pub fn addresses(&mut self) -> Result<Vec<LinkAddress>, Error> {
        self.dump(
            "dump addresses",
            RTM_GETADDR,
            IFADDRMSG_LEN,
            RTM_NEWADDR,
            parse_address,
        )
    }

    /// The MTU of the interface holding `address`, if one does.
    pub fn mtu_of_address(&mut self, address: IpAddr) -> Result<Option<u32>, Error> {
        let Some(index) = self
            .addresses()?
            .into_iter()
            .find(|a| a.address == address)
            .map(|a| a.index)
        else {
            return Ok(None);
        };
        Ok(self
            .links()?
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| l.mtu))
    }

    /// The MTU of the interface named `name`, if it exists.
    pub fn mtu_of_name(&mut self, name: &str) -> Result<Option<u32>, Error> {
        Ok(self
            .links()?
            .into_iter()
            .find(|l| l.name == name)
            .map(|l| l.mtu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len();
        let mut out = Vec::new();
        out.extend_from_slice(&u16::try_from(len).unwrap().to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(len.div_ceil(4) * 4, 0);
        out
    }

    #[test]
    fn parses_a_link_and_an_address() {
        let mut body = vec![0u8; IFINFOMSG_LEN];
        body[4..8].copy_from_slice(&7u32.to_ne_bytes());
        body.extend(attr(IFLA_IFNAME, b"eth0\0"));
        body.extend(attr(IFLA_MTU, &1450u32.to_ne_bytes()));
        assert_eq!(
            parse_link(&body).unwrap(),
            Some(Link {
                index: 7,
                name: "eth0".into(),
                mtu: 1450
            })
        );
        let mut body = vec![0u8; IFADDRMSG_LEN];
        body[4..8].copy_from_slice(&7u32.to_ne_bytes());
        body.extend(attr(IFA_ADDRESS, &[192, 0, 2, 9]));
        body.extend(attr(IFA_LOCAL, &[192, 0, 2, 1]));
        let a = parse_address(&body).unwrap().unwrap();
        assert_eq!((a.index, a.address), (7, "192.0.2.1".parse().unwrap()));
        assert!(parse_link(&[0u8; 3]).is_err());
        assert!(parse_address(&[0u8; IFADDRMSG_LEN + 2]).is_ok());
        let mut bad = vec![0u8; IFADDRMSG_LEN];
        bad.extend_from_slice(&[200, 0, 1, 0]);
        assert!(parse_address(&bad).is_err());
    }

    #[test]
    fn reads_this_namespace_loopback() {
        let mut h = LinkHandle::open().unwrap();
        let lo = h.mtu_of_name("lo").unwrap();
        assert!(lo.is_some_and(|m| m >= 1500), "{lo:?}");
        assert_eq!(h.mtu_of_address("127.0.0.1".parse().unwrap()).unwrap(), lo);
    }
}
