//! **Emulation** of the patched ovn-controller's tunnel management (SPEC
//! §11), which is not in this image: what the lab driver does in each
//! node's OVSDB in its place, and nothing more.
//!
//! - While `SB_Global.ipsec` is false: a plain Geneve tunnel to every other
//!   chassis (no `remote_name`, no marks) and OVN-like forwarding between
//!   the pod port and the tunnels.
//! - When it turns true: every tunnel gains its intent — `remote_name` and
//!   the owning node's published lease as `ipsec_mark_out`/`ipsec_reqid`
//!   (and the packet mark) — in one transaction per tunnel; a chassis whose
//!   lease is not published gets no intent (the patch never builds a tunnel
//!   with intent but without protection).
//! - When it turns false: intent and marks are removed together.

use testbed::ipsec::{IpsecError, Tunnel};
use testbed::overlay;

use crate::node::SimNode;

pub use crate::node::POD_PORT;

/// The name ovn-controller gives `from`'s tunnel to `to`.
pub fn tunnel_name(to: &SimNode) -> String {
    Tunnel::to(&to.node, 0).name
}

/// Plain tunnels from every node to every other, and forwarding between
/// each pod port and its tunnels.
pub fn plain_mesh(nodes: &[SimNode]) -> Result<(), IpsecError> {
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

/// Gives every tunnel of `a` its intent with `a`'s published lease; `Ok(false)`
/// (and nothing written) when `a` has no lease published.
pub fn give_intent(nodes: &[SimNode], a: &SimNode) -> Result<bool, IpsecError> {
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

/// Removes intent and marks from every tunnel of `a`, together.
pub fn take_intent(nodes: &[SimNode], a: &SimNode) -> Result<(), IpsecError> {
    for b in peers(nodes, a) {
        a.node.unprotect_tunnel(&tunnel_name(b))?;
    }
    Ok(())
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
