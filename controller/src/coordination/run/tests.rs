//! The shell's readings of API objects: the DaemonSet's shape and the
//! cleanup init container's state.

use k8s_openapi::api::core::v1::ContainerState;

use super::*;

fn ds(template: serde_json::Value) -> DaemonSet {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "kube-ovn-cni", "uid": "ds-uid"},
        "spec": {"selector": {"matchLabels": {"app": "kube-ovn-cni"}},
                 "template": {"spec": template}}
    }))
    .unwrap()
}

#[test]
fn the_cleanup_shape_is_the_init_container_without_the_agent() {
    let c = |n: &str| serde_json::json!({"name": n, "image": "kube-ovn"});
    let enabled = ds(serde_json::json!({"containers": [c("cni-server"), c("ipsec")]}));
    assert!(!cleanup_shape(&enabled));
    let cleanup = ds(serde_json::json!({
        "initContainers": [c("ipsec-cleanup")], "containers": [c("cni-server")]}));
    assert!(cleanup_shape(&cleanup));
    // Mid-edit: both at once is not the cleanup shape yet.
    let both = ds(serde_json::json!({
        "initContainers": [c("ipsec-cleanup")], "containers": [c("cni-server"), c("ipsec")]}));
    assert!(!cleanup_shape(&both));
    let neither = ds(serde_json::json!({"containers": [c("cni-server")]}));
    assert!(!cleanup_shape(&neither));
}

fn state(v: serde_json::Value) -> ContainerState {
    serde_json::from_value(v).unwrap()
}

#[test]
fn init_states_carry_the_exit_code_and_the_reasons() {
    assert_eq!(init_state(None), InitState::Waiting(String::new()));
    assert_eq!(
        init_state(Some(&state(serde_json::json!({"running": {}})))),
        InitState::Running
    );
    assert_eq!(
        init_state(Some(&state(
            serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}})
        ))),
        InitState::Waiting("CrashLoopBackOff".into())
    );
    assert_eq!(
        init_state(Some(&state(serde_json::json!({"terminated": {
            "exitCode": 1, "reason": "Error", "message": "a foreign owner holds reqid 7"}})))),
        InitState::Terminated {
            exit_code: 1,
            reason: "Error: a foreign owner holds reqid 7".into()
        }
    );
    assert_eq!(
        init_state(Some(&state(
            serde_json::json!({"terminated": {"exitCode": 0, "reason": "Completed"}})
        ))),
        InitState::Terminated {
            exit_code: 0,
            reason: "Completed".into()
        }
    );
}
