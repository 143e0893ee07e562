//! The ovn-controller side of the simulated nodes: who builds each node's
//! tunnels in its OVSDB. [`OvnController`] names the player; today there
//! is one, the **emulation** of the patched ovn-controller's tunnel
//! management (SPEC §11, not in this image), and nothing more than it:
//!
//! - While `SB_Global.ipsec` is false: a plain Geneve tunnel to every other
//!   chassis (no `remote_name`, no marks) and OVN-like forwarding between
//!   the pod port and the tunnels ([`OvnController::plain_mesh`]).
//! - When it turns true: every tunnel gains its intent — `remote_name` and
//!   the owning node's published lease as `ipsec_mark_out`/`ipsec_reqid`
//!   (and the packet mark) — in one transaction per tunnel; a chassis whose
//!   lease is not published gets no intent (the patch never builds a tunnel
//!   with intent but without protection) ([`OvnController::give_intent`],
//!   [`OvnController::connect`] and [`OvnController::reconnect`] for a
//!   pair).
//! - When it turns false: intent and marks are removed together
//!   ([`OvnController::take_intent`]).
//!
//! The version the agent's capability gate asks ovn-controller for is
//! answered by stand-ins the node writes
//! ([`crate::cluster::write_capability_standins`]).

use testbed::ipsec::{IpsecError, Tunnel};
use testbed::overlay;

use crate::node::SimNode;

pub use crate::node::POD_PORT;

/// Who plays ovn-controller on the simulated nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OvnController {
    /// The harness writes what the patched ovn-controller would, from the
    /// node list it is given (not from SB) and with hand-written forwarding
    /// (not OVN logical flows); Geneve only.
    #[default]
    Emulated,
}

impl OvnController {
    /// Plain tunnels from every node to every other, and forwarding between
    /// each pod port and its tunnels.
    pub fn plain_mesh(self, nodes: &[SimNode]) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for a in nodes {
                    let mut names = Vec::new();
                    for b in peers(nodes, a) {
                        let name = tunnel_name(b);
                        a.node.add_plain_tunnel(&name, b.node.ip())?;
                        names.push(name);
                    }
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    overlay::split_horizon(&a.node, POD_PORT, &names)?;
                }
                Ok(())
            }
        }
    }

    /// Gives every tunnel of `a` its intent with `a`'s published lease;
    /// `Ok(false)` (and nothing written) when `a` has no lease published.
    pub fn give_intent(self, nodes: &[SimNode], a: &SimNode) -> Result<bool, IpsecError> {
        match self {
            OvnController::Emulated => {
                let Some((mark, reqid)) = a.lease() else {
                    return Ok(false);
                };
                for b in peers(nodes, a) {
                    a.node.protect_tunnel(&Tunnel {
                        mark,
                        reqid,
                        ..Tunnel::to(&b.node, 0)
                    })?;
                }
                Ok(true)
            }
        }
    }

    /// Removes intent and marks from every tunnel of `a`, together.
    pub fn take_intent(self, nodes: &[SimNode], a: &SimNode) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for b in peers(nodes, a) {
                    a.node.unprotect_tunnel(&tunnel_name(b))?;
                }
                Ok(())
            }
        }
    }

    /// Adds each node's tunnel to the other, with intent and its published
    /// lease; an error when either has none (a tunnel with intent but
    /// without protection is what the patch never builds).
    pub fn connect(self, a: &SimNode, b: &SimNode) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.node.add_tunnel(tunnel))
    }

    /// Gives each node's existing tunnel to the other its intent again,
    /// with its (new) lease: what the patch does when `SB_Global.ipsec`
    /// turns true again.
    pub fn reconnect(self, a: &SimNode, b: &SimNode) -> Result<(), IpsecError> {
        self.each_way(a, b, |n, tunnel| n.node.protect_tunnel(tunnel))
    }

    /// `write`s each node's leased tunnel to the other, `a`'s first.
    fn each_way(
        self,
        a: &SimNode,
        b: &SimNode,
        write: impl Fn(&SimNode, &Tunnel) -> Result<(), IpsecError>,
    ) -> Result<(), IpsecError> {
        match self {
            OvnController::Emulated => {
                for (n, peer) in [(a, b), (b, a)] {
                    write(n, &leased_tunnel(n, peer)?)?;
                }
                Ok(())
            }
        }
    }
}

/// `n`'s tunnel to `peer` with `n`'s published lease as its marks.
fn leased_tunnel(n: &SimNode, peer: &SimNode) -> Result<Tunnel, IpsecError> {
    let (mark, reqid) = n.lease().ok_or_else(|| IpsecError::Failed {
        what: format!(
            "the tunnel from {} to {}",
            n.node.chassis(),
            peer.node.chassis()
        ),
        detail: "no lease published: a tunnel with intent needs its protection".into(),
    })?;
    Ok(Tunnel {
        mark,
        reqid,
        ..Tunnel::to(&peer.node, 0)
    })
}

/// The name ovn-controller gives a tunnel to `to`.
pub fn tunnel_name(to: &SimNode) -> String {
    Tunnel::to(&to.node, 0).name
}

/// The options of `a`'s tunnel to `b` as `ovs-vsctl` prints them.
pub fn tunnel_options(a: &SimNode, b: &SimNode) -> Result<String, IpsecError> {
    a.node
        .vsctl(&["get", "Interface", &tunnel_name(b), "options"])
        .map(|s| s.trim().to_string())
}

fn peers<'a>(nodes: &'a [SimNode], a: &'a SimNode) -> impl Iterator<Item = &'a SimNode> {
    nodes
        .iter()
        .filter(move |b| b.node.chassis() != a.node.chassis())
}
