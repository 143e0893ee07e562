//! The intent step, right after the flip: ovn-controller (real or
//! emulated) gives every node's tunnels their IPsec intent (remote name,
//! outbound mark, reqid from the node's published lease), and each tunnel
//! is checked
//! to carry all three. A node without a lease at the flip fails the step:
//! the controller flipped before that node was ready.

use std::time::Instant;

use kube_ovn_ipsec_api::names::ovs;

use super::context::{Run, Step, fail, instant_of};
use super::world::World;

/// Waits for every tunnel's intent; returns when SB flipped (SB's own
/// monitor's stamp), which the SAs step reads the windows and `Enabled`
/// against.
pub(super) fn intent(run: &mut Run<'_>, w: &mut World) -> Step<Instant> {
    run.begin("intent");
    let flipped = w.sb_turned(true).map_or_else(Instant::now, instant_of);
    let n = w.nodes.len();
    for i in 0..n {
        if !w.ovn.give_intent(&w.nodes, &w.nodes[i])? {
            return fail(format!(
                "{} has no lease published at the flip",
                w.cp.nodes[i].name
            ));
        }
    }
    for i in 0..n {
        let j = (i + 1) % n;
        let opts = w.ovn.tunnel_options(&w.nodes[i], &w.nodes[j])?;
        for key in [
            ovs::OPTION_REMOTE_NAME,
            ovs::OPTION_IPSEC_MARK_OUT,
            ovs::OPTION_IPSEC_REQID,
        ] {
            if !opts.contains(key) {
                return fail(format!(
                    "{}'s tunnel {} lacks {key}: {opts}",
                    w.cp.nodes[i].name,
                    w.ovn.tunnel_name(&w.nodes[i], &w.nodes[j])?
                ));
            }
        }
        run.line(
            "tunnels",
            &w.cp.nodes[i].name.clone(),
            format!("{} gave intent: {opts}", w.ovn.name()),
        );
    }
    run.done("intent");
    Ok(flipped)
}
