//! Whether the cleanup init container may withdraw this node's state now
//! (SPEC §8), as a pure function of what it holds and what it read live.
//! The shell reads; [`judge`] says proceed, wait, refuse, or leave.
//!
//! Waiting versus refusing: what the rollout itself will change (the
//! controller moving to `Release`, ovn-controller removing the tunnels'
//! IPsec options, the old Pod's IKE daemon exiting, the record catching up
//! with a new template) is waited on, within the shell's deadline. What no
//! amount of waiting fixes — another Node or Pod than the evidence names,
//! a record that does not decode, no identity to sign the release with —
//! is refused at once. Either way the guards stay armed and nothing is
//! withdrawn.

use std::collections::BTreeMap;

use actors::coordinator::plan::RecordView;
use actors::keydir::CsrBinding;
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::ovs;

use crate::lease::Lease;

/// What this node holds, from its own files.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    /// This Node's name.
    pub node_name: &'a str,
    /// This Pod's UID (downward API); the release receipt names it.
    pub pod_uid: &'a str,
    /// This Pod's template hash (downward API), if given.
    pub template_hash: Option<&'a str>,
    /// The persisted lease, if any.
    pub lease: Option<&'a Lease>,
    /// The CSR the active identity came from, if recorded.
    pub csr: Option<&'a CsrBinding>,
    /// Whether the node holds anything of this project (a lease, SA
    /// observations, published lease keys, identity paths).
    pub holds_state: bool,
    /// Where the coordination record is read (`<namespace>/<name>`), for
    /// reasons.
    pub record_name: &'a str,
}

/// One OVS interface as read: its name and `options`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceOptions {
    /// `Interface.name`.
    pub name: String,
    /// `Interface.options`.
    pub options: BTreeMap<String, String>,
}

/// What the cleanup read live in one pass.
#[derive(Debug, Clone)]
pub struct Live<'a> {
    /// The coordination record.
    pub record: &'a RecordView,
    /// The Node's UID now.
    pub node_uid: &'a str,
    /// Every OVS interface.
    pub interfaces: &'a [InterfaceOptions],
    /// Why the IKE daemon is not gone, if it is not (a live pidfile or an
    /// answering control socket).
    pub ike_alive: Option<String>,
}

/// What to do after one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every check passed: drain and withdraw.
    Proceed,
    /// Not yet: read again later (the reason says what is awaited).
    Wait(String),
    /// Never from this evidence: exit non-zero with the reason.
    Refuse(String),
    /// This node is not asked to release anything: exit 0.
    NotTarget(String),
    /// Not a target, yet it holds state (a joiner armed for an admission
    /// the disable did not see, a target some cohort dropped), the
    /// controller confirmed NB and SB off (the record is `Release`, or
    /// `Disabled` after a disable) and every local check passed: drain and
    /// withdraw on its own, so no stale state stays behind and no init
    /// container waits forever for a release nobody asks for.
    ReleaseUnasked(String),
}

/// The first interface that still carries IPsec intent or the lease's
/// protection options, described; `None` when the tunnels converged.
pub fn unconverged(interfaces: &[InterfaceOptions], lease: Option<&Lease>) -> Option<String> {
    for i in interfaces {
        for key in [
            ovs::OPTION_REMOTE_NAME,
            ovs::OPTION_IPSEC_MARK_OUT,
            ovs::OPTION_IPSEC_REQID,
        ] {
            if i.options.contains_key(key) {
                return Some(format!("interface {} still carries options:{key}", i.name));
            }
        }
        // egress_pkt_mark has other users; only the lease's value is ours.
        if let (Some(lease), Some(v)) = (lease, i.options.get(ovs::OPTION_EGRESS_PKT_MARK))
            && parse_mark(v) == Some(lease.mark)
        {
            return Some(format!(
                "interface {} still carries options:{}={v} (the lease's mark)",
                i.name,
                ovs::OPTION_EGRESS_PKT_MARK
            ));
        }
    }
    None
}

/// A mark as OVS options spell it: decimal, or hex with `0x`.
fn parse_mark(v: &str) -> Option<u32> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Judges one pass. Order: the record (is this node asked, in which
/// phase), whose evidence this is (Node, lease, Pod UID, signer), then what
/// the rollout is still changing (phase, template, tunnels, IKE daemon).
pub fn judge(local: &Local<'_>, live: &Live<'_>) -> Step {
    let record = match live.record {
        RecordView::Unknown => return Step::Wait("the coordination record is not read yet".into()),
        // No record and nothing held: IPsec was never enabled here. No
        // record while this node holds state cannot be "never enabled":
        // the record is looked for in the wrong namespace, or was deleted.
        // Leaving would strand the lease and its guards; withdrawing would
        // act without the controller's word that NB and SB are off.
        RecordView::Absent if local.holds_state => {
            return Step::Refuse(format!(
                "NoCoordinationRecord: this node holds IPsec state (a lease, guards or identity \
                 paths) but there is no coordination record {}: check --coordination-namespace \
                 (the controller's namespace); if the record was deleted, enable IPsec again so \
                 the controller writes one, then disable it",
                local.record_name
            ));
        }
        RecordView::Absent => {
            return Step::NotTarget(
                "there is no coordination record and this node holds no IPsec state \
                 (IPsec never enabled here)"
                    .into(),
            );
        }
        RecordView::Invalid(why) => {
            return Step::Refuse(format!("the coordination record is unusable: {why}"));
        }
        RecordView::Present(r) => r,
    };
    let Some(frozen) = record.targets.get(local.node_name) else {
        return not_a_target(local, live, record);
    };
    if record.phase == CoordinationPhase::Disabled {
        if local.holds_state {
            return not_a_target(local, live, record);
        }
        return Step::NotTarget("the coordination is Disabled: nothing is awaited".into());
    }
    if frozen.as_str() != live.node_uid {
        return Step::Refuse(format!(
            "NodeUIDChanged: the coordination froze {} with UID {frozen}, the Node now has {}",
            local.node_name, live.node_uid
        ));
    }
    if let Some(refusal) = lease_of_another_node(local, live) {
        return refusal;
    }
    // The Pod binding itself (live, on this node, of the frozen DaemonSet
    // and template, its init container's exit) is the controller's to
    // verify with its own reads: the node needs no permission on Pods.
    if Uid::new(local.pod_uid.to_owned()).is_err() {
        return Step::Refuse(format!(
            "PodUIDInvalid: POD_UID {:?} is not a UID (downward API metadata.uid)",
            local.pod_uid
        ));
    }
    let Some(template) = local.template_hash else {
        return Step::Refuse(
            "no template hash (POD_TEMPLATE_HASH from label controller-revision-hash): \
             the release receipt must name it"
                .into(),
        );
    };
    if local.csr.is_none() {
        return Step::Refuse(
            "the key directory records no CSR for the active identity: \
             the release receipt cannot name its signer"
                .into(),
        );
    }
    if !record.phase.is_disable_side() {
        return Step::Wait(format!(
            "the coordination is {}: waiting for the controller to start the disable",
            record.phase
        ));
    }
    if record.phase != CoordinationPhase::Release {
        return Step::Wait(format!(
            "the coordination is {}: withdrawal waits for Release",
            record.phase
        ));
    }
    if record.template_hash.as_deref() != Some(template) {
        return Step::Wait(format!(
            "this Pod's template {template} is not the one Release froze ({}): \
             the DaemonSet changed and the controller restarts the disable",
            record.template_hash.as_deref().unwrap_or("none")
        ));
    }
    match converged(live, local) {
        Some(wait) => wait,
        None => Step::Proceed,
    }
}

/// The refusal when the lease was granted to another Node UID (the Node
/// was re-created): its state cannot be attributed to this Node's release.
fn lease_of_another_node(local: &Local<'_>, live: &Live<'_>) -> Option<Step> {
    let lease = local.lease.filter(|l| l.node_uid != live.node_uid)?;
    Some(Step::Refuse(format!(
        "the lease {} belongs to Node UID {}, not {} (this Node's now)",
        lease.lease_id, lease.node_uid, live.node_uid
    )))
}

/// The wait while a tunnel still carries intent or the IKE daemon lives.
fn converged(live: &Live<'_>, local: &Local<'_>) -> Option<Step> {
    if let Some(why) = unconverged(live.interfaces, local.lease) {
        return Some(Step::Wait(format!("TunnelsNotConverged: {why}")));
    }
    live.ike_alive
        .as_ref()
        .map(|why| Step::Wait(format!("IkeDaemonRunning: {why}")))
}

/// A node the record does not ask for a release (or a `Disabled` record).
/// Without state there is nothing to do. With state it waits while the
/// switch may still be on (the record on the enable side, `Disabling`,
/// or `Cleanup` about to become `Release`), then releases on its own.
fn not_a_target(local: &Local<'_>, live: &Live<'_>, record: &CoordinationRecord) -> Step {
    let why = format!(
        "{} is not a target of the coordination (phase {})",
        local.node_name, record.phase
    );
    if !local.holds_state {
        return Step::NotTarget(why);
    }
    // `Release`, or `Disabled` reached through one (it keeps the disable's
    // challenge): NB and SB were read false before `Cleanup` was written.
    let confirmed_off = match record.phase {
        CoordinationPhase::Release => true,
        CoordinationPhase::Disabled => record.challenge.is_some(),
        _ => false,
    };
    if !confirmed_off {
        return Step::Wait(format!(
            "{why}, but it holds this project's state (lease, guards or identity paths): \
             waiting for the controller to confirm NB_Global.ipsec and SB_Global.ipsec off \
             (Release)"
        ));
    }
    if let Some(refusal) = lease_of_another_node(local, live) {
        return refusal;
    }
    match converged(live, local) {
        Some(wait) => wait,
        None => Step::ReleaseUnasked(format!("{why}; it holds state: releasing it on its own")),
    }
}

#[cfg(test)]
mod tests;
