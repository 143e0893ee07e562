//! The enable step: the agents and the controller (enable-ipsec=true)
//! started, then watched until the flip — each node's identity issued, its
//! guards armed, its runtime up, NB_Global.ipsec and SB_Global.ipsec true.
//! NB turning true while a node is not yet armed fails the step: the
//! controller must not flip before every node can protect its traffic.

use std::time::{Duration, Instant};

use kube_ovn_ipsec_api::coordination::CoordinationPhase;

use super::context::{Run, Step, fail};
use super::readings::nb_sb;
use super::rows::update_row;
use super::world::World;
use testbed::probe::unix_now;

/// The `--key-algorithm` of node `i`: RSA and ECDSA by turns, so that every
/// run has pairs of both kinds and mixed ones.
pub(super) fn key_algorithm(i: usize) -> &'static str {
    if i.is_multiple_of(2) {
        "rsa2048"
    } else {
        "ecdsa-p256"
    }
}

/// Agents, controller, the barriers, the flip.
pub(super) async fn enable(run: &mut Run<'_>, w: &mut World) -> Step {
    run.begin("enable");
    let mut options = harness::node::AgentOptions::lab(w.lifetime);
    options.rekeying = Some(w.rekeying);
    for (i, sim) in w.nodes.iter_mut().enumerate() {
        let mut options = options.clone();
        options.extra.extend(w.ovn.agent_flags());
        options
            .extra
            .extend(["--key-algorithm".into(), key_algorithm(i).into()]);
        sim.start_agent(
            &w.bins.agent,
            &w.cp.nodes[i],
            &w.cp.api,
            &w.monitor,
            &options,
        )?;
    }
    run.line(
        "enable",
        "-",
        format!(
            "agents started (kube-ovn-ipsec run, certificate lifetime {} s, IKE_SA lifetime {} s, \
             CHILD_SA lifetime {} s, keys RSA-2048 and ECDSA P-256 by turns); controller started \
             with enable-ipsec=true",
            w.lifetime,
            w.rekeying.ike_lifetime().as_secs(),
            w.rekeying.child_lifetime().as_secs()
        ),
    );
    w.cp.start_controller(&w.bins.controller, true)?;
    let n = w.nodes.len();
    let (mut issued, mut armed, mut up) = (vec![false; n], vec![false; n], vec![false; n]);
    let mut last_phase = None;
    let mut nb_seen = false;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(r) = w.cp.record().await?
            && last_phase != Some(r.phase)
        {
            run.line("record", "-", r.phase);
            if matches!(r.phase, CoordinationPhase::Prepare | CoordinationPhase::Arm) {
                run.phase(r.phase.as_str());
            }
            last_phase = Some(r.phase);
        }
        for i in 0..n {
            let Some(s) = w.nodes[i].parsed_status().await else {
                continue;
            };
            let name = w.cp.nodes[i].name.clone();
            if !issued[i] && s.generation.is_some() {
                issued[i] = true;
                w.issued_generation[i] = s.generation.unwrap_or_default();
                run.line(
                    "identity issued",
                    &name,
                    format!(
                        "generation {}, expires {}",
                        s.generation.unwrap_or_default(),
                        s.expires.map(|e| e.to_string()).unwrap_or_default()
                    ),
                );
            }
            if !armed[i] && s.protection_armed {
                armed[i] = true;
                let lease = w.nodes[i]
                    .lease()
                    .map(|(m, r)| format!("lease mark {m:#x} reqid {r} published"))
                    .unwrap_or_default();
                run.line("guards armed", &name, lease);
            }
            if !up[i] && s.runtime_healthy {
                up[i] = true;
                run.line(
                    "runtime up",
                    &name,
                    "strongSwan and ovs-monitor-ipsec healthy",
                );
            }
            update_row(&mut run.summary.nodes[i], &s);
        }
        let (nb, sb) = nb_sb(&w.cp);
        // SB true implies NB was: a read of NB that failed under load must
        // not skip the check.
        if (nb || sb) && !nb_seen {
            nb_seen = true;
            if let Some(i) = armed.iter().position(|a| !a) {
                return fail(format!(
                    "NB_Global.ipsec turned true while {} was not armed",
                    w.cp.nodes[i].name
                ));
            }
            run.line(
                "NB true",
                "-",
                "every node armed: the controller flipped NB_Global.ipsec",
            );
        }
        if sb {
            // The window opens with SB's commit, not with this poll.
            let at = w.sb_turned(true).unwrap_or_else(unix_now);
            run.phase_at("enable flip", at);
            run.line(
                "SB true",
                "-",
                format!(
                    "ovn-northd copied it to SB_Global.ipsec {:.1} s before the lab saw it",
                    unix_now() - at
                ),
            );
            break;
        }
        if Instant::now() > deadline {
            return fail(format!(
                "SB_Global.ipsec not true in 600 s (record {last_phase:?}); see controller.log and each node's agent.log"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.done("enable");
    Ok(())
}
