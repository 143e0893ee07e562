//! `kube-ovn-ipsec-controller` as the chaos suite builds it: the same
//! program ([`controller::cli::main`]), a binary of this crate so that the
//! suite's tests find it beside them (`CARGO_BIN_EXE_…`) and SIGKILL it
//! as a process, as a node's kubelet or an OOM kill would.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    controller::cli::main().await
}
