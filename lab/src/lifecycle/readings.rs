//! Read-only observations the steps wait on and the rows display: the NB
//! and SB ipsec flags, the ESP SAs of a node's lease in its kernel, the
//! newest receipt on a Node. They change nothing, so any step may poll
//! them as often as it needs.

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube_ovn_ipsec_api::coordination::{Receipt, ReleaseReceipt};
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::signed;

use harness::control_plane::ControlPlane;
use harness::node::SimNode;

/// The newest receipt on Node `name`, as far as its payload says (for
/// display only: the controller verifies them).
pub(super) async fn receipt_of(cp: &ControlPlane, name: &str) -> Option<String> {
    let node = Api::<Node>::all(cp.admin.clone()).get(name).await.ok()?;
    let ann = node.metadata.annotations?;
    if let Some(r) = ann.get(k8s::ANNOTATION_RELEASE_RECEIPT) {
        return signed::decode::<ReleaseReceipt>(r)
            .ok()
            .map(|r| format!("release e{}", r.peek().epoch));
    }
    let r = ann.get(k8s::ANNOTATION_RECEIPT)?;
    signed::decode::<Receipt>(r)
        .ok()
        .map(|r| r.peek().phase.as_str().to_string())
}

/// (NB_Global.ipsec, SB_Global.ipsec) as `ovn-nbctl`/`ovn-sbctl` read them.
pub(super) fn nb_sb(cp: &ControlPlane) -> (bool, bool) {
    let on = |out: Result<String, testbed::ovs::Error>| out.is_ok_and(|o| o.trim() == "true");
    (
        on(cp.central.nb.nbctl(&["get", "NB_Global", ".", "ipsec"])),
        on(cp.central.sb.sbctl(&["get", "SB_Global", ".", "ipsec"])),
    )
}

/// ESP SAs in `n`'s kernel attributed to its lease's reqid (none without
/// a lease).
pub(super) fn lease_sas(n: &SimNode) -> u32 {
    let Some((_, reqid)) = n.lease() else {
        return 0;
    };
    let Ok(dump) = n.node.netns().ip(["xfrm", "state", "list"]) else {
        return 0;
    };
    let needle = format!("reqid {reqid} ");
    let count = dump
        .lines()
        .filter(|l| l.trim_start().starts_with("proto esp") && l.contains(&needle))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The ESP SAs of its lease a node holds once every peer is up: one in,
/// one out per peer.
pub(super) fn lease_sas_want(nodes: usize) -> u32 {
    u32::try_from(2 * (nodes - 1)).unwrap_or(u32::MAX)
}
