//! What this node does for a coordination record (SPEC §7), as a pure
//! function: whether it may arm, which receipt it owes, and why it waits.
//!
//! | record | this node | arm | receipt |
//! | --- | --- | --- | --- |
//! | none, unreadable, disable side | — | no | none |
//! | `Prepare` | target, same Node UID | no | `Prepare` |
//! | `Arm` | target, same Node UID | yes | `Arm` |
//! | `Enabled` | target, same Node UID | yes | none |
//! | `Enabled` | not a target (joining) | once its receipt is visible | `Prepare`, then `Arm` once armed, applied and healthy |
//! | `Prepare`/`Arm` | not a target | no | none: the controller re-freezes the cohort |
//! | any | target under another Node UID | no | none: an operator retires the old Node |
//!
//! A joiner arms without a barrier of its own: while `SB_Global.ipsec` is
//! true the patched ovn-controller builds no tunnel for a chassis whose
//! lease is not published (SPEC §4), so arming costs nothing and sends no
//! plaintext; the controller admits it on its `Arm` receipt. It arms only
//! once the receipt it published for the record is visible on its Node
//! and a fresh read of the record still has it joining ([`Plan::join`]):
//! a disable takes in every Node with such a receipt, so no node holds
//! state the disable cannot see.
//!
//! "No" to arming never disarms: a node holding a lease keeps its guards
//! whatever the record says (only cleanup withdraws them).

use kube_ovn_ipsec_api::coordination::{CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::status::Reason;

/// The coordination record as the follower last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordView {
    /// Not read yet.
    Unknown,
    /// The ConfigMap (or its `state` key) does not exist: IPsec was never
    /// coordinated in this cluster.
    Absent,
    /// The record does not decode or validate; why.
    Invalid(String),
    /// The record.
    Present(Box<CoordinationRecord>),
}

/// What the node should be doing for the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Allocate a lease and arm (never withdrawn once granted).
    pub arm: bool,
    /// A joiner: arm once the receipt published for this record is
    /// visible and a fresh read of the record still says join.
    pub join: bool,
    /// The receipt phase owed for the record, if any.
    pub receipt: Option<CoordinationPhase>,
    /// The record asks this node to prepare (readiness then needs only an
    /// issued identity).
    pub prepare: bool,
    /// Why the node waits on the cluster, for status and the log.
    pub waiting: Option<(Reason, String)>,
}

impl Plan {
    fn wait(reason: Reason, why: impl Into<String>) -> Self {
        Plan {
            arm: false,
            join: false,
            receipt: None,
            prepare: false,
            waiting: Some((reason, why.into())),
        }
    }
}

/// The plan for `view` of node `node_name` (UID `node_uid`); `armed_ready`:
/// protection armed, configuration applied and runtime healthy, i.e. an
/// `Arm` receipt would satisfy its barrier.
pub fn plan(view: &RecordView, node_name: &str, node_uid: &Uid, armed_ready: bool) -> Plan {
    let record = match view {
        RecordView::Unknown => {
            return Plan::wait(
                Reason::WaitingForCoordination,
                "the coordination record has not been read yet",
            );
        }
        RecordView::Absent => {
            return Plan::wait(
                Reason::WaitingForCoordination,
                "no coordination record: IPsec is not being enabled in this cluster",
            );
        }
        RecordView::Invalid(why) => {
            return Plan::wait(Reason::CoordinationInvalid, why.clone());
        }
        RecordView::Present(r) => r,
    };
    let phase = record.phase;
    let frozen = record.targets.get(node_name);
    if let Some(uid) = frozen
        && uid != node_uid
    {
        return Plan::wait(
            Reason::WaitingForCoordination,
            format!(
                "the cohort froze Node {node_name} with UID {}, this Node is {}: the old Node must be retired by an operator",
                uid.as_str(),
                node_uid.as_str()
            ),
        );
    }
    let target = frozen.is_some();
    match (phase, target) {
        (CoordinationPhase::Prepare, true) => Plan {
            arm: false,
            join: false,
            receipt: Some(CoordinationPhase::Prepare),
            prepare: true,
            waiting: None,
        },
        (CoordinationPhase::Arm, true) => Plan {
            arm: true,
            join: false,
            receipt: Some(CoordinationPhase::Arm),
            prepare: false,
            waiting: None,
        },
        (CoordinationPhase::Enabled, true) => Plan {
            arm: true,
            join: false,
            receipt: None,
            prepare: false,
            waiting: None,
        },
        (CoordinationPhase::Enabled, false) => Plan {
            arm: false,
            join: true,
            receipt: Some(if armed_ready {
                CoordinationPhase::Arm
            } else {
                CoordinationPhase::Prepare
            }),
            prepare: false,
            waiting: None,
        },
        (CoordinationPhase::Prepare | CoordinationPhase::Arm, false) => Plan::wait(
            Reason::WaitingForCoordination,
            format!(
                "not in the {} cohort yet: the controller adds a node the DaemonSet schedules to",
                phase.as_str()
            ),
        ),
        (_, _) => Plan::wait(
            Reason::WaitingForCoordination,
            format!("coordination is {}: nothing to arm", phase.as_str()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn uid(n: u8) -> Uid {
        Uid::new(format!("0b0e6a3c-1111-4222-8333-4444555566{n:02}")).unwrap()
    }

    fn view(phase: CoordinationPhase, targets: &[(&str, Uid)]) -> RecordView {
        let mut r = CoordinationRecord::initial();
        r.phase = phase;
        r.targets = targets
            .iter()
            .map(|(n, u)| ((*n).to_owned(), u.clone()))
            .collect::<BTreeMap<_, _>>();
        RecordView::Present(Box::new(r))
    }

    #[test]
    fn a_target_prepares_then_arms_then_stays_armed() {
        let me = uid(1);
        let t = [("n1", me.clone())];
        let p = plan(&view(CoordinationPhase::Prepare, &t), "n1", &me, false);
        assert!(!p.arm && p.prepare);
        assert_eq!(p.receipt, Some(CoordinationPhase::Prepare));
        let p = plan(&view(CoordinationPhase::Arm, &t), "n1", &me, false);
        assert!(p.arm && !p.prepare);
        assert_eq!(p.receipt, Some(CoordinationPhase::Arm));
        let p = plan(&view(CoordinationPhase::Enabled, &t), "n1", &me, true);
        assert!(p.arm && p.receipt.is_none() && p.waiting.is_none());
    }

    #[test]
    fn a_joiner_while_enabled_joins_and_owes_prepare_then_arm() {
        let me = uid(1);
        let t = [("other", uid(2))];
        let p = plan(&view(CoordinationPhase::Enabled, &t), "n1", &me, false);
        // Not armed outright: only once its receipt is visible.
        assert!(p.join && !p.arm);
        assert_eq!(p.receipt, Some(CoordinationPhase::Prepare));
        let p = plan(&view(CoordinationPhase::Enabled, &t), "n1", &me, true);
        assert_eq!(p.receipt, Some(CoordinationPhase::Arm));
    }

    #[test]
    fn nothing_is_armed_outside_a_cohort_or_without_a_record() {
        let me = uid(1);
        for v in [
            RecordView::Unknown,
            RecordView::Absent,
            RecordView::Invalid("bad".into()),
            view(CoordinationPhase::Prepare, &[("other", uid(2))]),
            view(CoordinationPhase::Arm, &[("other", uid(2))]),
            view(CoordinationPhase::Disabling, &[("n1", me.clone())]),
            view(CoordinationPhase::Disabled, &[]),
        ] {
            let p = plan(&v, "n1", &me, true);
            assert!(
                !p.arm && !p.join && p.receipt.is_none() && !p.prepare,
                "{v:?}"
            );
            assert!(p.waiting.is_some(), "{v:?}");
        }
        let p = plan(&RecordView::Invalid("bad".into()), "n1", &me, true);
        assert_eq!(p.waiting.unwrap().0, Reason::CoordinationInvalid);
    }

    #[test]
    fn a_recreated_node_never_answers_for_the_frozen_one() {
        let me = uid(1);
        for phase in [
            CoordinationPhase::Prepare,
            CoordinationPhase::Arm,
            CoordinationPhase::Enabled,
        ] {
            let p = plan(&view(phase, &[("n1", uid(9))]), "n1", &me, true);
            assert!(!p.arm && !p.join && p.receipt.is_none(), "{phase:?}");
            assert!(p.waiting.unwrap().1.contains("retired"), "{phase:?}");
        }
    }
}
