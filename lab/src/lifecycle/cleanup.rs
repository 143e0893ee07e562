//! The cleanup rollout: the DaemonSet rolled node by node to the cleanup
//! shape (the agent stopped, `kube-ovn-ipsec cleanup` as the new Pod's init
//! container, its exit reported as the init container's), the nodes'
//! release receipts, then the coordination record `Disabled`. This is how
//! a real cluster removes the project, so the lab does it the same way
//! with the probes running on every pair.

use std::time::{Duration, Instant};

use apiserver::kube_ovn::{self, CniNode, InitReport, Shape};
use kube_ovn_ipsec_api::coordination::CoordinationPhase;

use super::context::{Run, Step, fail};
use super::readings::{lease_sas, receipt_of};
use super::world::World;

/// The template hash of the cleanup shape the lab rolls out on disable.
const CLEANUP_HASH: &str = "4c1ea9b70";

/// The node-by-node cleanup rollout, release receipts, `Disabled` (`t`:
/// when the operator's intent to disable was given).
pub(super) async fn cleanup_rollout(run: &mut Run<'_>, w: &mut World, t: Instant) -> Step {
    run.begin("cleanup rollout");
    run.phase("cleanup rollout");
    kube_ovn::set_template(&w.cp.admin, &w.cp.ds_uid, Shape::Cleanup, CLEANUP_HASH).await?;
    run.line(
        "cleanup rollout",
        "-",
        "DaemonSet template: ipsec container replaced by the ipsec-cleanup init container (maxUnavailable 1)",
    );
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        let t_node = Instant::now();
        w.nodes[i].stop_agent();
        let cni: &mut CniNode = &mut w.cp.nodes[i];
        kube_ovn::replace_pod(
            &w.cp.api,
            &w.cp.admin,
            &w.cp.ds_uid,
            cni,
            i,
            Shape::Cleanup,
            CLEANUP_HASH,
        )
        .await?;
        kube_ovn::set_cleanup_init(&w.cp.admin, &cni.pod_name, InitReport::Running).await?;
        let (code, message) = w.nodes[i].run_cleanup(&w.bins.agent, cni, &w.cp.api, 180)?;
        kube_ovn::set_cleanup_init(
            &w.cp.admin,
            &cni.pod_name,
            InitReport::Terminated {
                exit_code: code,
                message: &message,
            },
        )
        .await?;
        run.summary.nodes[i].phase = if code == 0 {
            "cleaned"
        } else {
            "cleanup-failed"
        }
        .into();
        run.summary.nodes[i].sas = Some(lease_sas(&w.nodes[i]));
        run.summary.nodes[i].guards = Some(false);
        run.line(
            "cleanup",
            &name,
            format!(
                "agent stopped, Pod replaced, kube-ovn-ipsec cleanup exited {code} after {:.1} s",
                t_node.elapsed().as_secs_f64()
            ),
        );
        if code != 0 {
            return fail(format!(
                "{name}: kube-ovn-ipsec cleanup exited {code}: {message}"
            ));
        }
        run.summary.nodes[i].receipt = receipt_of(&w.cp, &name).await;
        run.report.status(&run.summary);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let phase = w.cp.record().await?.map(|r| r.phase);
        if phase == Some(CoordinationPhase::Disabled) {
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "not Disabled within 180 s of the rollout (record {phase:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Echoes of the rollout's last moments, judged before the phase ends.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.phase("Disabled");
    let secs = (t.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    run.summary.figures.disable_s = Some(secs);
    for i in 0..w.nodes.len() {
        let name = w.cp.nodes[i].name.clone();
        run.summary.nodes[i].receipt = receipt_of(&w.cp, &name).await;
        run.line(
            "release receipt",
            &name,
            run.summary.nodes[i]
                .receipt
                .clone()
                .unwrap_or_else(|| "none".into()),
        );
    }
    run.line(
        "Disabled",
        "-",
        format!("coordination Disabled {secs} s after the intent"),
    );
    run.done("cleanup rollout");
    Ok(())
}
