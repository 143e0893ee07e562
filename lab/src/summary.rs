//! What a lab run came to: the per-node table, the per-pair windows, the
//! packets lost per phase and the run's figures — a pure codec (JSON for
//! `--json` and `status`, the text table for people), no I/O.
//!
//! The same document is the lab's live status: the run rewrites it after
//! every step, so `kube-ovn-ipsec-lab status` of a running lab prints the
//! table as far as it has got. When the lab runs inside the guest kernel
//! the document crosses the serial console as one [`STATUS_PREFIX`] line.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The start of a console line carrying the summary as JSON.
pub const STATUS_PREFIX: &str = "KOI-LAB-STATUS ";

/// One lab run, as far as it has got.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Summary {
    /// Which kernel runs the nodes (the host's, or the guest's under qemu).
    pub kernel: String,
    /// Which ovn-controller builds the tunnels (the patched binary, or the
    /// emulation).
    #[serde(default)]
    pub ovn_controller: String,
    /// The step running now, or the last one.
    pub step: String,
    /// The run got through every step.
    pub finished: bool,
    /// The step that failed, and why.
    pub failed: Option<Failure>,
    /// One row per node.
    pub nodes: Vec<NodeRow>,
    /// One row per pod pair.
    pub pairs: Vec<PairRow>,
    /// Echoes sent and lost per phase, over every pair's probe stream.
    pub phases: Vec<PhaseLoss>,
    /// Every lifecycle event the lab caused or saw, with the echoes lost
    /// around it.
    #[serde(default)]
    pub events: Vec<EventLoss>,
    /// Each step's end, in seconds since `up`.
    pub steps: Vec<StepTime>,
    /// The run's figures.
    pub figures: Figures,
}

/// The step that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Failure {
    /// The step's name.
    pub step: String,
    /// What went wrong, for the operator.
    pub reason: String,
}

/// One simulated node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRow {
    /// The Node's name.
    pub name: String,
    /// Its chassis.
    pub chassis: String,
    /// The agent's phase (its `/status`), or what replaced the agent.
    pub phase: String,
    /// The active identity generation.
    pub generation: Option<u64>,
    /// The active certificate's notAfter (RFC 3339).
    pub expires: Option<String>,
    /// ESP SAs of the node's lease in its kernel.
    pub sas: Option<u32>,
    /// The guards read back from the kernel.
    pub guards: Option<bool>,
    /// The newest receipt on its Node (phase it answers, or `release`).
    pub receipt: Option<String>,
    /// Echoes lost on the probe streams from or to this node's pod.
    pub lost: u32,
    /// The longest enable window of its pairs, in milliseconds.
    pub enable_window_ms: Option<u64>,
    /// The agent's resident set, KiB.
    pub agent_rss_kib: Option<u64>,
    /// ovs-monitor-ipsec's resident set, KiB, in the same run.
    pub monitor_rss_kib: Option<u64>,
}

/// One pod pair.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PairRow {
    /// The first node's index.
    pub a: usize,
    /// The second node's index.
    pub b: usize,
    /// From the SB flip (SB's commit) to the first encrypted reply, ms:
    /// on the pair's probe stream, the first echo answered after the last
    /// one the flip lost (until the stream has that, the first reply of a
    /// probe the lab started once it saw the flip).
    pub enable_window_ms: Option<u64>,
    /// From SB off (SB's commit) to the first plaintext reply, ms, read
    /// the same way.
    pub disable_window_ms: Option<u64>,
    /// From the old CA's retirement (`ca retire`) to the first echo
    /// answered after the last one the rebuild lost, ms, read the same
    /// way.
    #[serde(default)]
    pub retirement_window_ms: Option<u64>,
    /// Echoes sent on this pair's stream.
    pub sent: u32,
    /// Of those, lost.
    pub lost: u32,
}

/// One phase of the probe streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PhaseLoss {
    /// The phase.
    pub phase: String,
    /// Echoes sent in it, over every pair.
    pub sent: u32,
    /// Of those, lost.
    pub lost: u32,
    /// Whether losses are expected in it (the flips, the lab's
    /// negotiation), rather than a fault.
    pub window: bool,
    /// Plaintext Geneve packets captured on the nodes' underlays in it.
    #[serde(default)]
    pub plaintext: Option<u32>,
    /// Every XFRM error counter that grew in it, per node.
    #[serde(default)]
    pub xfrm: Vec<CounterGrowth>,
}

/// One XFRM error counter (`/proc/net/xfrm_stat`) that grew on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CounterGrowth {
    /// The node's name.
    pub node: String,
    /// The counter (`XfrmOutPolBlock`, …).
    pub counter: String,
    /// By how much.
    pub by: u64,
}

/// One lifecycle event and what it cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventLoss {
    /// What happened: `renewal`, `monitor killed`, `IKE_SA rekey`,
    /// `CHILD_SA rekey`.
    pub kind: String,
    /// The node it happened on.
    pub node: String,
    /// What it was about (a generation, a connection).
    pub detail: String,
    /// When, in seconds since `up`.
    pub at_s: f64,
    /// The phase it fell in.
    pub phase: String,
    /// Echoes lost within [`EVENT_SPAN_S`] of it on the node's pairs,
    /// outside the windows.
    pub lost: u32,
}

/// How far before and after an event its lost echoes are counted, seconds:
/// the event's time is when it completed (charon's log line) or when the
/// lab saw it (a renewal, polled every second), and what it disturbs lies
/// within one negotiation of that.
pub const EVENT_SPAN_S: f64 = 5.0;

/// When a step ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepTime {
    /// The step.
    pub step: String,
    /// Seconds since `up`.
    pub at_s: f64,
}

/// The run's figures (docs/performance.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Figures {
    /// From `up` to the coordination record's `Enabled`, seconds.
    pub up_to_enabled_s: Option<f64>,
    /// From `up` to ESP SAs between every pair, seconds.
    pub up_to_sas_s: Option<f64>,
    /// One IKE_SA with its two CHILD_SAs negotiated on a pair whose SAs
    /// were taken down, initiated by name, to the first reply.
    pub negotiation_ms: Option<u64>,
    /// Echoes lost across the renewal (target 0), within the renewal step.
    pub renewal_lost: Option<u32>,
    /// Renewals that fell before the renewal step (their echoes are in
    /// the phases they fell in, not in `renewal_lost`).
    #[serde(default)]
    pub renewed_before_step: u32,
    /// From the actor's process killed to the agent healthy again, seconds.
    pub actor_recovery_s: Option<f64>,
    /// From the intent turned off to `Disabled`, seconds.
    pub disable_s: Option<f64>,
}

/// Phases in which lost echoes are expected: the design's two flip
/// windows, the lab's own negotiation measurement (it takes a pair's
/// IKE_SA down on purpose), and a CA's retirement (every tunnel rebuilt
/// under the new trust, make-before-break).
const WINDOWS: [&str; 4] = [
    "enable flip",
    "disable flip",
    "negotiation",
    "CA retirement",
];

/// Whether losses are expected in `phase` (a flip window, or the
/// negotiation the lab causes).
pub fn is_window(phase: &str) -> bool {
    WINDOWS.contains(&phase)
}

/// Phases in which every tunnel carries IPsec intent from start to end: a
/// plaintext Geneve packet on the underlay in one of them is a leak.
pub const INTENT_ON: [&str; 8] = [
    "Enabled",
    "negotiation",
    "renewal",
    "actor kill",
    "rekeys",
    "CA rotation",
    "CA retirement",
    "CA retired",
];

impl Summary {
    /// What the run's accounting says is wrong, for the operator: plaintext
    /// Geneve on an underlay while intent was on, an XFRM error counter
    /// that grew outside the windows, echoes lost around an event outside
    /// them. Empty when all is as the design promises.
    pub fn faults(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &self.phases {
            if INTENT_ON.contains(&p.phase.as_str()) && p.plaintext.unwrap_or(0) > 0 {
                out.push(format!(
                    "{} plaintext Geneve packets on the underlay in {} (intent on): a leak",
                    p.plaintext.unwrap_or(0),
                    p.phase
                ));
            }
            if !p.window {
                for g in &p.xfrm {
                    out.push(format!(
                        "{} {} grew by {} in {}, outside the windows",
                        g.node, g.counter, g.by, p.phase
                    ));
                }
            }
        }
        for e in &self.events {
            if e.lost > 0 {
                out.push(format!(
                    "{} echoes lost around the {} on {} at {:.1} s ({})",
                    e.lost, e.kind, e.node, e.at_s, e.detail
                ));
            }
        }
        out
    }
}

impl Summary {
    /// The JSON document (`--json`, `status --json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Decodes a document written by [`Summary::to_json`] or carried by a
    /// status line; the error says what is wrong with it.
    pub fn from_json(text: &str) -> Result<Summary, String> {
        serde_json::from_str(text).map_err(|e| format!("not a lab summary: {e}"))
    }

    /// The summary as one console line ([`STATUS_PREFIX`], compact JSON).
    pub fn status_line(&self) -> String {
        format!(
            "{STATUS_PREFIX}{}",
            serde_json::to_string(self).unwrap_or_default()
        )
    }

    /// The summary a console line carries: `None` for any other line,
    /// `Some(Err)` for a status line that does not decode.
    pub fn from_status_line(line: &str) -> Option<Result<Summary, String>> {
        let at = line.find(STATUS_PREFIX)?;
        Some(Summary::from_json(&line[at + STATUS_PREFIX.len()..]))
    }

    /// The table people read: nodes, pairs, phases, figures, outcome.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "{:<8} {:<10} {:<10} {:>4} {:<20} {:>4} {:<6} {:<9} {:>5} {:>9} {:>9} {:>9}",
            "NODE",
            "CHASSIS",
            "PHASE",
            "GEN",
            "EXPIRES",
            "SAS",
            "GUARDS",
            "RECEIPT",
            "LOST",
            "ENABLE-MS",
            "AGENT-KIB",
            "MON-KIB"
        );
        for n in &self.nodes {
            let _ = writeln!(
                s,
                "{:<8} {:<10} {:<10} {:>4} {:<20} {:>4} {:<6} {:<9} {:>5} {:>9} {:>9} {:>9}",
                n.name,
                n.chassis,
                n.phase,
                dash(n.generation.map(|g| g.to_string())),
                dash(n.expires.clone()),
                dash(n.sas.map(|v| v.to_string())),
                dash(
                    n.guards
                        .map(|g| if g { "armed" } else { "none" }.to_string())
                ),
                dash(n.receipt.clone()),
                n.lost,
                dash(n.enable_window_ms.map(|v| v.to_string())),
                dash(n.agent_rss_kib.map(|v| v.to_string())),
                dash(n.monitor_rss_kib.map(|v| v.to_string())),
            );
        }
        if !self.pairs.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<8} {:>10} {:>11} {:>10} {:>6} {:>5}",
                "PAIR", "ENABLE-MS", "DISABLE-MS", "RETIRE-MS", "SENT", "LOST"
            );
            for p in &self.pairs {
                let _ = writeln!(
                    s,
                    "{:<8} {:>10} {:>11} {:>10} {:>6} {:>5}",
                    format!("{}<->{}", p.a, p.b),
                    dash(p.enable_window_ms.map(|v| v.to_string())),
                    dash(p.disable_window_ms.map(|v| v.to_string())),
                    dash(p.retirement_window_ms.map(|v| v.to_string())),
                    p.sent,
                    p.lost
                );
            }
        }
        if !self.phases.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<18} {:>6} {:>5} {:>9}  XFRM COUNTERS GROWN",
                "PHASE", "SENT", "LOST", "PLAINTEXT"
            );
            for p in &self.phases {
                let note = if p.window {
                    "  (a window: expected)"
                } else if p.lost > 0 {
                    "  (expected none)"
                } else {
                    ""
                };
                let grown: Vec<String> = p
                    .xfrm
                    .iter()
                    .map(|g| format!("{} {} +{}", g.node, g.counter, g.by))
                    .collect();
                let _ = writeln!(
                    s,
                    "{:<18} {:>6} {:>5} {:>9}  {}{note}",
                    p.phase,
                    p.sent,
                    p.lost,
                    dash(p.plaintext.map(|v| v.to_string())),
                    if grown.is_empty() {
                        "-".to_string()
                    } else {
                        grown.join(", ")
                    }
                );
            }
        }
        if !self.events.is_empty() {
            let _ = writeln!(
                s,
                "\n{:>8} {:<15} {:<8} {:<14} {:>5}  DETAIL",
                "AT", "EVENT", "NODE", "PHASE", "LOST"
            );
            for e in &self.events {
                let _ = writeln!(
                    s,
                    "{:>7.1}s {:<15} {:<8} {:<14} {:>5}  {}",
                    e.at_s, e.kind, e.node, e.phase, e.lost, e.detail
                );
            }
        }
        let f = &self.figures;
        let secs = |v: Option<f64>| dash(v.map(|v| format!("{v:.1} s")));
        let _ = writeln!(
            s,
            "\nup→Enabled {}, up→SAs {}, one IKE+CHILD negotiation {}, lost across the renewal {}, \
             actor recovered in {}, disable→Disabled {}",
            secs(f.up_to_enabled_s),
            secs(f.up_to_sas_s),
            dash(f.negotiation_ms.map(|v| format!("{v} ms"))),
            dash(f.renewal_lost.map(|v| v.to_string())),
            secs(f.actor_recovery_s),
            secs(f.disable_s),
        );
        for (flip, of) in [
            (
                "enable",
                self.pairs
                    .iter()
                    .filter_map(|p| p.enable_window_ms)
                    .collect::<Vec<_>>(),
            ),
            (
                "disable",
                self.pairs
                    .iter()
                    .filter_map(|p| p.disable_window_ms)
                    .collect(),
            ),
            (
                "CA retirement",
                self.pairs
                    .iter()
                    .filter_map(|p| p.retirement_window_ms)
                    .collect(),
            ),
        ] {
            let (Some(lo), Some(hi)) = (of.iter().min(), of.iter().max()) else {
                continue;
            };
            let ratio = f
                .negotiation_ms
                .filter(|n| *n > 0)
                .map(|n| format!(" ({:.1}× the negotiation)", *hi as f64 / n as f64))
                .unwrap_or_default();
            let _ = writeln!(s, "{flip} windows per pair {lo}–{hi} ms{ratio}");
        }
        let _ = writeln!(s, "kernel: {}", self.kernel);
        if !self.ovn_controller.is_empty() {
            let _ = writeln!(s, "ovn-controller: {}", self.ovn_controller);
        }
        match (&self.failed, self.finished) {
            (Some(f), _) => {
                let _ = writeln!(s, "FAILED at step `{}`: {}", f.step, f.reason);
            }
            (None, true) => {
                let _ = writeln!(s, "every step passed");
            }
            (None, false) => {
                let _ = writeln!(s, "running: {}", self.step);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        Summary {
            kernel: "host".into(),
            step: "disable".into(),
            nodes: vec![NodeRow {
                name: "node-0".into(),
                chassis: "chassis-0".into(),
                phase: "Active".into(),
                generation: Some(2),
                sas: Some(4),
                guards: Some(true),
                lost: 3,
                ..NodeRow::default()
            }],
            pairs: vec![PairRow {
                a: 0,
                b: 1,
                enable_window_ms: Some(840),
                sent: 100,
                lost: 3,
                ..PairRow::default()
            }],
            phases: vec![
                PhaseLoss {
                    phase: "Prepare".into(),
                    sent: 40,
                    lost: 0,
                    window: false,
                    plaintext: Some(120),
                    xfrm: Vec::new(),
                },
                PhaseLoss {
                    phase: "enable flip".into(),
                    sent: 10,
                    lost: 3,
                    window: true,
                    plaintext: Some(8),
                    xfrm: vec![CounterGrowth {
                        node: "node-0".into(),
                        counter: "XfrmOutPolBlock".into(),
                        by: 5,
                    }],
                },
            ],
            events: vec![EventLoss {
                kind: "CHILD_SA rekey".into(),
                node: "node-0".into(),
                detail: "ovn-chassi-0-out-1".into(),
                at_s: 151.25,
                phase: "renewal".into(),
                lost: 0,
            }],
            ..Summary::default()
        }
    }

    #[test]
    fn json_round_trips_and_a_status_line_carries_it() {
        let s = sample();
        assert_eq!(Summary::from_json(&s.to_json()).unwrap(), s);
        let line = format!("\u{1b}[0m{}", s.status_line());
        assert_eq!(Summary::from_status_line(&line).unwrap().unwrap(), s);
        assert!(Summary::from_status_line("== in the kernel").is_none());
    }

    #[test]
    fn a_damaged_status_line_is_an_error_not_a_summary() {
        let err = Summary::from_status_line("KOI-LAB-STATUS {\"kernel\":")
            .unwrap()
            .unwrap_err();
        assert!(err.contains("not a lab summary"), "{err}");
        let err = Summary::from_json("{\"kernel\":\"x\",\"bogus\":1}").unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn faults_name_leaks_counters_and_events_outside_the_windows() {
        let mut s = sample();
        // The sample's growth and plaintext are in a window and before
        // intent; its event lost nothing.
        assert!(s.faults().is_empty(), "{:?}", s.faults());
        s.phases.push(PhaseLoss {
            phase: "renewal".into(),
            plaintext: Some(2),
            xfrm: vec![CounterGrowth {
                node: "node-1".into(),
                counter: "XfrmInNoStates".into(),
                by: 3,
            }],
            ..PhaseLoss::default()
        });
        s.events[0].lost = 4;
        let f = s.faults();
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(f[0].contains("2 plaintext Geneve packets") && f[0].contains("renewal"));
        assert!(f[1].contains("node-1 XfrmInNoStates grew by 3 in renewal"));
        assert!(f[2].contains("4 echoes lost around the CHILD_SA rekey on node-0"));
    }

    #[test]
    fn the_table_names_rows_windows_and_the_outcome() {
        let mut s = sample();
        let t = s.table();
        assert!(t.contains("node-0") && t.contains("chassis-0") && t.contains("armed"));
        assert!(t.contains("0<->1") && t.contains("840"));
        assert!(t.contains("(a window: expected)"));
        assert!(t.contains("node-0 XfrmOutPolBlock +5"), "{t}");
        assert!(t.contains("151.2s CHILD_SA rekey"), "{t}");
        assert!(t.contains("running: disable"));
        s.failed = Some(Failure {
            step: "renewal".into(),
            reason: "4 echoes lost".into(),
        });
        assert!(
            s.table()
                .contains("FAILED at step `renewal`: 4 echoes lost")
        );
        assert!(is_window("disable flip") && is_window("negotiation") && !is_window("Arm"));
    }
}
