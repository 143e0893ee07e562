//! `kube-ovn-ipsec-controller`: [`controller::cli::main`].

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    controller::cli::main().await
}
