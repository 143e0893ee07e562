//! The leftovers step, last: every node's XFRM dump byte-identical to the
//! one taken before its agent first ran (foreign policies and SAs kept,
//! nothing of the project's left), no protection keys in OVSDB, no IKE
//! daemon left. Disabling must hand the node back exactly as it was found.

use kube_ovn_ipsec_api::names::ovs;

use super::context::{Run, Step, fail};
use super::world::World;

/// Every node's XFRM byte-identical to before its agent first ran (the
/// foreign state kept, nothing of the project's left), no project keys in
/// OVSDB, no strongSwan or monitor left running.
pub(super) fn leftovers(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("leftovers");
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        let n = &w.nodes[i];
        let now = n.node.xfrm_dump()?;
        if now != w.before[i] {
            return fail(format!(
                "{name}: XFRM differs from before its agent first ran:\n--- before\n{}\n--- now\n{now}",
                w.before[i]
            ));
        }
        let ids = n
            .node
            .vsctl(&["get", "Open_vSwitch", ".", "external_ids"])?;
        if let Some(k) = ovs::PROTECTION_KEYS.iter().find(|k| ids.contains(*k)) {
            return fail(format!("{name}: OVSDB still has {k}: {ids}"));
        }
        if n.node.run_path("charon.pid").exists() || n.node.run_path("starter.charon.pid").exists()
        {
            return fail(format!(
                "{name}: strongSwan's pid files are left in its /run"
            ));
        }
        run.line(
            "leftovers",
            &name,
            "XFRM identical to before (foreign policies and SAs untouched), no lease in OVSDB, no IKE daemon",
        );
    }
    run.done("leftovers");
    Ok(())
}
