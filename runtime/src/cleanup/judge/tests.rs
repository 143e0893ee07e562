use super::*;
use kube_ovn_ipsec_api::coordination::{Challenge, CoordinationRecord};
use kube_ovn_ipsec_api::ident::Uid;

const NODE_UID: &str = "0b0e6a3c-1111-4222-8333-444455556601";
const POD_UID: &str = "0b0e6a3c-1111-4222-8333-444455556602";

fn lease() -> Lease {
    Lease {
        version: 1,
        lease_id: "l".into(),
        node_uid: NODE_UID.into(),
        mark: 0x1234_5678,
        reqid: 9,
        guards: vec![],
    }
}

fn record(phase: CoordinationPhase) -> RecordView {
    let mut r = CoordinationRecord::initial();
    r.phase = phase;
    r.generation = 2;
    r.epoch = 7;
    r.template_hash = Some("cleanup-hash".into());
    r.challenge = Some(Challenge::from_bytes([3; 32]));
    r.targets
        .insert("n1".into(), Uid::new(NODE_UID.to_owned()).unwrap());
    RecordView::Present(Box::new(r))
}

fn iface(name: &str, pairs: &[(&str, &str)]) -> InterfaceOptions {
    InterfaceOptions {
        name: name.into(),
        options: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

struct Case {
    lease: Lease,
    csr: Option<CsrBinding>,
    template: Option<&'static str>,
    record: RecordView,
    node_uid: &'static str,
    pod_uid: &'static str,
    interfaces: Vec<InterfaceOptions>,
    ike: Option<String>,
    holds_state: bool,
}

impl Case {
    fn ready() -> Self {
        Case {
            lease: lease(),
            csr: Some(CsrBinding {
                name: "ovn-ipsec-x".into(),
                uid: "0b0e6a3c-1111-4222-8333-444455556603".into(),
                pod_uid: None,
            }),
            template: Some("cleanup-hash"),
            record: record(CoordinationPhase::Release),
            node_uid: NODE_UID,
            pod_uid: POD_UID,
            interfaces: vec![iface(
                "ovn-abc-0",
                &[("remote_ip", "10.0.0.2"), ("egress_pkt_mark", "7")],
            )],
            ike: None,
            holds_state: true,
        }
    }

    fn judge(&self) -> Step {
        let local = Local {
            node_name: "n1",
            pod_uid: self.pod_uid,
            template_hash: self.template,
            lease: Some(&self.lease),
            csr: self.csr.as_ref(),
            holds_state: self.holds_state,
            record_name: "kube-system/ovn-ipsec-coordination",
        };
        let live = Live {
            record: &self.record,
            node_uid: self.node_uid,
            interfaces: &self.interfaces,
            ike_alive: self.ike.clone(),
        };
        judge(&local, &live)
    }
}

fn refused(step: Step, needle: &str) {
    match step {
        Step::Refuse(why) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected a refusal with {needle:?}, got {other:?}"),
    }
}

fn waits(step: Step, needle: &str) {
    match step {
        Step::Wait(why) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected a wait with {needle:?}, got {other:?}"),
    }
}

#[test]
fn every_check_holding_proceeds() {
    assert_eq!(Case::ready().judge(), Step::Proceed);
}

#[test]
fn a_node_that_is_not_asked_and_holds_nothing_leaves_at_once() {
    let mut c = Case::ready();
    c.holds_state = false;
    c.record = RecordView::Absent;
    assert!(matches!(c.judge(), Step::NotTarget(_)));
    let mut c = Case::ready();
    c.holds_state = false;
    let RecordView::Present(r) = &mut c.record else {
        unreachable!()
    };
    r.targets.clear();
    assert!(matches!(c.judge(), Step::NotTarget(_)));
    let mut c = Case::ready();
    c.holds_state = false;
    c.record = record(CoordinationPhase::Disabled);
    assert!(matches!(c.judge(), Step::NotTarget(_)));
}

#[test]
fn state_without_a_record_is_refused_not_called_never_enabled() {
    let mut c = Case::ready();
    c.record = RecordView::Absent;
    match c.judge() {
        Step::Refuse(why) => {
            assert!(why.starts_with("NoCoordinationRecord"), "{why}");
            assert!(why.contains("kube-system/ovn-ipsec-coordination"), "{why}");
            assert!(!why.contains("never enabled"), "{why}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_node_not_asked_that_holds_state_waits_for_release_then_releases_unasked() {
    let not_a_target = |phase| {
        let mut c = Case::ready();
        c.record = record(phase);
        let RecordView::Present(r) = &mut c.record else {
            unreachable!()
        };
        r.targets.clear();
        c
    };
    // While the switch may still be on: wait, guards kept.
    for phase in [
        CoordinationPhase::Prepare,
        CoordinationPhase::Arm,
        CoordinationPhase::Enabled,
        CoordinationPhase::Disabling,
        CoordinationPhase::Cleanup,
    ] {
        waits(not_a_target(phase).judge(), "holds this project's state");
    }
    // Once NB and SB were confirmed off: the same live checks as a target.
    for phase in [CoordinationPhase::Release, CoordinationPhase::Disabled] {
        assert!(matches!(
            not_a_target(phase).judge(),
            Step::ReleaseUnasked(_)
        ));
        let mut c = not_a_target(phase);
        c.ike = Some("pidfile".into());
        waits(c.judge(), "IkeDaemonRunning");
        let mut c = not_a_target(phase);
        c.interfaces = vec![iface("ovn-abc-0", &[("remote_name", "n2")])];
        waits(c.judge(), "TunnelsNotConverged");
        let mut c = not_a_target(phase);
        c.node_uid = "0b0e6a3c-1111-4222-8333-444455556699";
        refused(c.judge(), "belongs to Node UID");
    }
    // A target of a Disabled record holding state (released unasked too).
    let mut c = Case::ready();
    c.record = record(CoordinationPhase::Disabled);
    assert!(matches!(c.judge(), Step::ReleaseUnasked(_)));
    // A Disabled record no disable went through (no challenge): wait.
    let mut c = not_a_target(CoordinationPhase::Disabled);
    let RecordView::Present(r) = &mut c.record else {
        unreachable!()
    };
    r.challenge = None;
    waits(c.judge(), "holds this project's state");
}

#[test]
fn the_rollout_is_waited_for() {
    for phase in [
        CoordinationPhase::Enabled,
        CoordinationPhase::Disabling,
        CoordinationPhase::Cleanup,
    ] {
        let mut c = Case::ready();
        c.record = record(phase);
        waits(c.judge(), phase.as_str());
    }
    let mut c = Case::ready();
    c.interfaces
        .push(iface("ovn-def-0", &[("remote_name", "chassis-2")]));
    waits(c.judge(), "TunnelsNotConverged");
    let mut c = Case::ready();
    c.interfaces.push(iface(
        "ovn-def-0",
        &[("egress_pkt_mark", &format!("{:#x}", lease().mark))],
    ));
    waits(c.judge(), "the lease's mark");
    let mut c = Case::ready();
    c.ike = Some("/var/run/charon.pid names live charon (PID 42)".into());
    waits(c.judge(), "IkeDaemonRunning");
    let mut c = Case::ready();
    c.template = Some("newer-hash");
    waits(c.judge(), "DaemonSet changed");
    let mut c = Case::ready();
    c.record = RecordView::Unknown;
    waits(c.judge(), "not read yet");
}

#[test]
fn evidence_of_another_node_pod_or_signer_is_refused() {
    let mut c = Case::ready();
    c.node_uid = "0b0e6a3c-1111-4222-8333-444455556699";
    refused(c.judge(), "NodeUIDChanged");
    let mut c = Case::ready();
    c.lease.node_uid = "0b0e6a3c-1111-4222-8333-444455556698".into();
    refused(c.judge(), "belongs to Node UID");
    let mut c = Case::ready();
    c.pod_uid = "not a uid";
    refused(c.judge(), "PodUIDInvalid");
    let mut c = Case::ready();
    c.template = None;
    refused(c.judge(), "POD_TEMPLATE_HASH");
    let mut c = Case::ready();
    c.csr = None;
    refused(c.judge(), "no CSR");
    let mut c = Case::ready();
    c.record = RecordView::Invalid("does not decode".into());
    refused(c.judge(), "unusable");
}

#[test]
fn only_the_leases_egress_mark_counts_as_unconverged() {
    let l = lease();
    let other = [iface("t", &[("egress_pkt_mark", "0x4000")])];
    assert_eq!(unconverged(&other, Some(&l)), None);
    let ours = [iface("t", &[("egress_pkt_mark", &l.mark.to_string())])];
    assert!(unconverged(&ours, Some(&l)).is_some());
    assert_eq!(unconverged(&ours, None), None);
}
