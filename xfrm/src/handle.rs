//! [`XfrmHandle`]: a blocking `NETLINK_XFRM` socket and the few requests
//! the agent makes through it, behind the [`Xfrm`] trait.
//!
//! Blocking on purpose: every request is one round trip of microseconds
//! (a 10,000-policy dump a few milliseconds), and a plain socket can be
//! opened in another network namespace from a short-lived thread (a netlink
//! socket belongs to the namespace it was created in, for its whole life).
//! An actor calls it from `spawn_blocking` or holds it in a dedicated task.

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_XFRM};

use crate::Error;
use crate::codec::{self, NLMSG_DONE, NLMSG_ERROR, XFRM_MSG_NEWPOLICY, XFRM_MSG_NEWSA};
use crate::model::{Policy, State};

/// Outcome of adding a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    /// Added; the kernel's policy as read back by selector (with its index).
    Added(Policy),
    /// A policy with the same key (selector, direction, mark, if_id)
    /// exists; nothing was changed.
    Exists,
}

/// The XFRM operations output protection needs. Implemented by
/// [`XfrmHandle`]; a fake can implement it for actor tests.
pub trait Xfrm: Send {
    /// Every policy of the namespace.
    fn dump_policies(&mut self) -> Result<Vec<Policy>, Error>;
    /// Every state (SA) of the namespace, without keys.
    fn dump_states(&mut self) -> Result<Vec<State>, Error>;
    /// The policy with `probe.index` (family, direction, mark and if_id from
    /// `probe`), or `None` when the kernel has none.
    fn get_policy_by_index(&mut self, probe: &Policy) -> Result<Option<Policy>, Error>;
    /// The policy with `probe`'s selector, direction, mark and if_id.
    fn get_policy_by_selector(&mut self, probe: &Policy) -> Result<Option<Policy>, Error>;
    /// Adds `policy` without ever replacing an existing one.
    fn add_policy(&mut self, policy: &Policy) -> Result<AddOutcome, Error>;
    /// Deletes the policy with `policy.index` (and its mark, direction);
    /// false when it was already gone.
    fn delete_policy(&mut self, policy: &Policy) -> Result<bool, Error>;
    /// Deletes the SA with `state`'s full identity (destination, SPI,
    /// protocol, family, source and mark); false when it was already gone.
    /// Only the cleanup path calls it, and only for SAs attributed to the
    /// node's own lease.
    fn delete_state(&mut self, state: &State) -> Result<bool, Error>;
}

/// The lowest SPI given to a larval state before its deletion (SPIs below
/// 256 are reserved by RFC 4303).
const LARVAL_SPI_MIN: u32 = 0x100;

/// A `NETLINK_XFRM` socket of one network namespace.
pub struct XfrmHandle {
    nl: Netlink,
}

impl std::fmt::Debug for XfrmHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XfrmHandle")
            .field("seq", &self.nl.seq)
            .finish()
    }
}

/// A blocking netlink socket with its request sequence and receive buffer:
/// what [`XfrmHandle`] and the `link` module's `LinkHandle` share.
pub(crate) struct Netlink {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn netlink_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Netlink { what, source }
}

impl XfrmHandle {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        Ok(Self {
            nl: Netlink::open(NETLINK_XFRM)?,
        })
    }

    /// Opens a socket in the named network namespace (`/run/netns/<name>`,
    /// as `ip netns add` creates them): a helper thread enters the namespace,
    /// opens the socket and exits; the socket stays in that namespace.
    pub fn in_netns(name: &str) -> Result<Self, Error> {
        crate::netns::run_in(name, XfrmHandle::open)
    }
}

impl Netlink {
    /// Opens a socket of `protocol` in the calling thread's namespace.
    pub(crate) fn open(protocol: isize) -> Result<Self, Error> {
        let mut socket = Socket::new(protocol).map_err(netlink_err("open netlink socket"))?;
        socket
            .bind_auto()
            .map_err(netlink_err("bind netlink socket"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(netlink_err("connect netlink socket"))?;
        // Dumps of many policies arrive in many datagrams; a larger receive
        // buffer avoids ENOBUFS when the reader is briefly descheduled.
        let _ = socket.set_rx_buf_sz(4 * 1024 * 1024);
        Ok(Self {
            socket,
            seq: 1,
            buf: vec![0u8; 64 * 1024],
        })
    }

    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    pub(crate) fn send(&self, what: &'static str, req: &[u8]) -> Result<(), Error> {
        self.socket.send(req, 0).map_err(netlink_err(what))?;
        Ok(())
    }

    /// Receives replies to `seq` until `done` says stop; `on_msg` sees each
    /// non-control message (type, body).
    pub(crate) fn receive(
        &mut self,
        what: &'static str,
        seq: u32,
        dump: bool,
        mut on_msg: impl FnMut(u16, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buf[..], 0)
                .map_err(netlink_err(what))?;
            let mut finished = false;
            let result = (|| {
                for m in codec::split_messages(&self.buf[..n]).map_err(Error::Codec)? {
                    if m.seq != seq {
                        continue; // a late reply to an earlier request
                    }
                    match m.message_type {
                        NLMSG_DONE => finished = true,
                        NLMSG_ERROR => {
                            let code = codec::error_code(m.body).map_err(Error::Codec)?;
                            finished = true;
                            if code != 0 {
                                return Err(Error::Netlink {
                                    what,
                                    source: io::Error::from_raw_os_error(code),
                                });
                            }
                        }
                        t => {
                            on_msg(t, m.body)?;
                            if !dump {
                                finished = true;
                            }
                        }
                    }
                }
                Ok(())
            })();
            // SA dumps carry keys: never leave them in the buffer.
            self.buf[..n].fill(0);
            result?;
            if finished {
                return Ok(());
            }
        }
    }
}

impl XfrmHandle {
    fn get_policy(&mut self, probe: &Policy, by_index: bool) -> Result<Option<Policy>, Error> {
        let seq = self.nl.next_seq();
        self.nl.send(
            "get policy",
            &codec::get_policy_request(probe, by_index, seq),
        )?;
        let mut found = None;
        match self.nl.receive("get policy", seq, false, |t, body| {
            if t == XFRM_MSG_NEWPOLICY {
                found = Some(codec::parse_policy(body).map_err(Error::Codec)?);
            }
            Ok(())
        }) {
            Ok(()) => Ok(found),
            Err(Error::Netlink { source, .. }) if source.raw_os_error() == Some(libc_enoent()) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

fn libc_enoent() -> i32 {
    nix::errno::Errno::ENOENT as i32
}

impl Xfrm for XfrmHandle {
    fn dump_policies(&mut self) -> Result<Vec<Policy>, Error> {
        let seq = self.nl.next_seq();
        self.nl.send(
            "dump policies",
            &codec::dump_request(codec::XFRM_MSG_GETPOLICY, seq),
        )?;
        let mut out = Vec::new();
        self.nl.receive("dump policies", seq, true, |t, body| {
            if t == XFRM_MSG_NEWPOLICY {
                out.push(codec::parse_policy(body).map_err(Error::Codec)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn dump_states(&mut self) -> Result<Vec<State>, Error> {
        let seq = self.nl.next_seq();
        self.nl.send(
            "dump states",
            &codec::dump_request(codec::XFRM_MSG_GETSA, seq),
        )?;
        let mut out = Vec::new();
        self.nl.receive("dump states", seq, true, |t, body| {
            if t == XFRM_MSG_NEWSA {
                out.push(codec::parse_state(body).map_err(Error::Codec)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn get_policy_by_index(&mut self, probe: &Policy) -> Result<Option<Policy>, Error> {
        self.get_policy(probe, true)
    }

    fn get_policy_by_selector(&mut self, probe: &Policy) -> Result<Option<Policy>, Error> {
        self.get_policy(probe, false)
    }

    fn add_policy(&mut self, policy: &Policy) -> Result<AddOutcome, Error> {
        let seq = self.nl.next_seq();
        self.nl
            .send("add policy", &codec::add_policy_request(policy, seq))?;
        match self.nl.receive("add policy", seq, false, |_, _| Ok(())) {
            Ok(()) => {}
            Err(Error::Netlink { source, .. })
                if source.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) =>
            {
                return Ok(AddOutcome::Exists);
            }
            Err(e) => return Err(e),
        }
        // The ACK carries no index: read the policy back by its key.
        self.get_policy(policy, false)?
            .map(AddOutcome::Added)
            .ok_or(Error::Netlink {
                what: "read back added policy",
                source: io::Error::from_raw_os_error(libc_enoent()),
            })
    }

    fn delete_policy(&mut self, policy: &Policy) -> Result<bool, Error> {
        let seq = self.nl.next_seq();
        self.nl
            .send("delete policy", &codec::delete_policy_request(policy, seq))?;
        self.acked_delete("delete policy", seq)
    }

    fn delete_state(&mut self, state: &State) -> Result<bool, Error> {
        let named = if state.is_larval() {
            // No SPI names a larval state: give it one first, as the IKE
            // daemon answering its acquire would (the kernel picks it in
            // this range), then delete it by that identity. A larval state
            // that expired meanwhile is re-created by the request and
            // deleted right after: nothing remains either way.
            let seq = self.nl.next_seq();
            self.nl.send(
                "allocate an SPI",
                &codec::alloc_spi_request(state, LARVAL_SPI_MIN, u32::MAX, seq),
            )?;
            let mut given = None;
            self.nl.receive("allocate an SPI", seq, false, |t, body| {
                if t == XFRM_MSG_NEWSA {
                    given = Some(codec::parse_state(body).map_err(Error::Codec)?);
                }
                Ok(())
            })?;
            match given {
                Some(s) => s,
                None => return Ok(false),
            }
        } else {
            state.clone()
        };
        let seq = self.nl.next_seq();
        self.nl
            .send("delete state", &codec::delete_state_request(&named, seq))?;
        self.acked_delete("delete state", seq)
    }
}

impl XfrmHandle {
    /// The ACK of a delete: true when something was deleted, false when
    /// the kernel had nothing to delete (`ENOENT`, e.g. it expired or a
    /// previous run already deleted it).
    fn acked_delete(&mut self, what: &'static str, seq: u32) -> Result<bool, Error> {
        match self.nl.receive(what, seq, false, |_, _| Ok(())) {
            Ok(()) => Ok(true),
            // ENOENT (policies) or ESRCH (SAs): nothing by that identity.
            Err(Error::Netlink { source, .. })
                if source.raw_os_error() == Some(libc_enoent())
                    || source.raw_os_error() == Some(nix::errno::Errno::ESRCH as i32) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
