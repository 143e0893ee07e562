//! Shared fixtures of the runtime integration tests.
pub mod cluster;
/// The controller's test cluster (RBAC, DaemonSet, Nodes, CNI Pods with
/// Pod-bound tokens): the agent signed by the real controller runs on it.
#[path = "../../../controller/tests/common/mod.rs"]
pub mod controller_cluster;
