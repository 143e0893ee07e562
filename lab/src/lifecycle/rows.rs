//! The summary's node rows brought up to date from each agent's status,
//! its kernel and its Node: what the live status shows between steps.
//! Refreshing also re-tallies the probe losses, so a row's losses never
//! lag behind its state.

use kube_ovn_ipsec_api::status::Status;

use super::context::Run;
use super::readings::{lease_sas, receipt_of};
use super::tally::tally;
use super::world::World;
use crate::summary::NodeRow;
use harness::node::rss_kib;

/// Each node's row from its agent and kernel now.
pub(super) async fn refresh_rows(run: &mut Run<'_>, w: &World) {
    for i in 0..w.nodes.len() {
        if let Some(s) = w.nodes[i].parsed_status().await {
            update_row(&mut run.summary.nodes[i], &s);
        }
        let row = &mut run.summary.nodes[i];
        row.sas = Some(lease_sas(&w.nodes[i]));
        // The last measurement stands: a process restarting at this very
        // moment (a renewal's monitor restart, the actor-kill step) has no
        // resident set to read, which says nothing about what it used.
        if let Some(kib) = w.nodes[i].agent_pid().and_then(rss_kib) {
            row.agent_rss_kib = Some(kib);
        }
        if let Some(kib) = w.nodes[i].monitor_pid().and_then(rss_kib) {
            row.monitor_rss_kib = Some(kib);
        }
        row.receipt = receipt_of(&w.cp, &w.cp.nodes[i].name).await;
    }
    tally(run, w);
    run.report.status(&run.summary);
}

/// A node's row from its agent's status `s`.
pub(super) fn update_row(row: &mut NodeRow, s: &Status) {
    row.phase = format!("{:?}", s.phase);
    row.generation = s.generation;
    row.expires = s.expires.map(|e| e.to_string());
    row.guards = Some(s.protection_armed);
}
