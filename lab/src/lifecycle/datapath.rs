//! The data path step: every agent's own view of its data path agrees
//! with what the wire showed — `datapathHealthy`, every peer `Healthy`
//! from its SA counters, the MTU check passed — and the agent's control
//! socket answers `ipsec/show` the same, as an operator would ask it.

use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::datapath::PeerState;

use super::context::{Run, Step, fail};
use super::world::World;

/// Every agent's own view of its data path (SPEC §10): `datapathHealthy`,
/// every peer `Healthy` from its SA counters, the MTU check passed, and
/// a bare `ovs-appctl ipsec/show` answering in the node's namespaces as in
/// the `ipsec` container (the image's link first on `PATH`), while a bare
/// `ovs-appctl dpif/show` still reaches the node's ovs-vswitchd.
pub(super) async fn datapath(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("data path");
    let peers = w.nodes.len() - 1;
    for (i, node) in w.nodes.iter().enumerate() {
        let name = w.cp.nodes[i].name.clone();
        // Two samples (4 s) after the SAs carry the probes; slack for TCG.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let s = node.parsed_status().await;
            if let Some(s) = &s
                && s.datapath_healthy == Some(true)
                && s.peers.len() == peers
                && s.peers.iter().all(|p| p.state == PeerState::Healthy)
            {
                break s.clone();
            }
            if Instant::now() > deadline {
                let seen = s.map(|s| {
                    s.peers
                        .iter()
                        .map(|p| format!("{} {}", p.peer, p.state))
                        .collect::<Vec<_>>()
                });
                return fail(format!(
                    "{name}: the agent does not report every peer Healthy within 30 s: {seen:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // The design's troubleshooting line, as typed in the `ipsec`
        // container: a bare `ovs-appctl ipsec/show` reaches the agent...
        let show = match node.container_appctl(&w.bins.agent, &["ipsec/show"])? {
            o if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            o => {
                return fail(format!(
                    "{name}: ovs-appctl ipsec/show: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
        };
        // ...and every other command still reaches ovs-vswitchd.
        let dpif = node.container_appctl(&w.bins.agent, &["dpif/show"])?;
        let dpif_out = String::from_utf8_lossy(&dpif.stdout);
        if !dpif.status.success() || !dpif_out.contains("br-int") {
            return fail(format!(
                "{name}: ovs-appctl dpif/show did not reach ovs-vswitchd: {}{}",
                dpif_out.trim(),
                String::from_utf8_lossy(&dpif.stderr).trim()
            ));
        }
        if !show.contains("datapath: healthy") {
            return fail(format!(
                "{name}: ipsec/show disagrees with /status:\n{show}"
            ));
        }
        let mtu = status.mtu.map_or_else(
            || "MTU not checked".to_string(),
            |m| format!("MTU {} fits (max {})", m.tunnel, m.max_tunnel),
        );
        run.line(
            "data path",
            &name,
            format!(
                "{peers} peers Healthy; {mtu}; ovs-appctl ipsec/show answers, dpif/show reaches \
                 ovs-vswitchd"
            ),
        );
    }
    run.done("data path");
    Ok(())
}
