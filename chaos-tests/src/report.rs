//! The run's report: one row per fault (point × victim × invariants,
//! recovery time, seed) and the recovery distribution (pure).

use std::fmt::Write as _;
use std::time::Duration;

use crate::plan::{Fault, Named};

/// The invariants, by number (docs/chaos.md).
pub const INVARIANTS: [(&str, &str); 7] = [
    ("1", "OVSDB on one complete generation"),
    ("2", "guards in every dump while enabled"),
    ("3", "identity kept, no half-written file"),
    ("4", "ready again within the bound"),
    (
        "5",
        "foreign XFRM state untouched, own state gone after a release",
    ),
    (
        "6",
        "no Enabled with a target unarmed, no release with state held",
    ),
    ("7", "no key material served or logged"),
];

/// What one fault did.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its place in the run.
    pub index: usize,
    /// Where it landed (a point's name, or several in order).
    pub point: String,
    /// What was killed.
    pub victim: String,
    /// The seed that drew it.
    pub seed: u64,
    /// The node (agent) it ran on.
    pub node: usize,
    /// From the hit to the agent ready again; `None`: not within the
    /// bound.
    pub recovery: Option<Duration>,
    /// Violations, each prefixed with its invariant's number (0: the fault
    /// was not injected as planned).
    pub violations: Vec<String>,
}

impl Row {
    /// The row of a `fault` of the matrix.
    pub fn of<V: Named>(
        fault: Fault<V>,
        node: usize,
        recovery: Option<Duration>,
        violations: Vec<String>,
    ) -> Row {
        Row {
            index: fault.index,
            point: fault.point.name().into(),
            victim: fault.victim.name().into(),
            seed: fault.seed,
            node,
            recovery,
            violations,
        }
    }
}

impl Row {
    /// The line a suite prints as each fault is done (the table comes at
    /// the end): index, node, point, victim, verdict, recovery.
    pub fn progress(&self) -> String {
        format!(
            "chaos: #{} node {} {} × {}: {} {}",
            self.index,
            self.node,
            self.point,
            self.victim,
            if self.violations.is_empty() {
                "pass"
            } else {
                "FAIL"
            },
            self.recovery
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_default()
        )
    }
}

/// Prints the run's table and how long it took (`rows.len()` `unit`s in
/// `elapsed`), flushed before the caller tears its world down; returns
/// the table and how many rows failed, for the caller's assertion.
pub fn print_run(seed: u64, rows: &[Row], unit: &str, elapsed: Duration) -> (String, usize) {
    use std::io::Write as _;
    let report = table(seed, rows);
    println!("{report}");
    println!("{} {unit} in {:.1} s", rows.len(), elapsed.as_secs_f64());
    let _ = std::io::stdout().flush();
    let failed = rows.iter().filter(|r| !r.violations.is_empty()).count();
    (report, failed)
}

/// The `q`-quantile (0..=1) of `xs` by nearest rank; `None` when empty.
pub fn quantile(xs: &[Duration], q: f64) -> Option<Duration> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The table: one line per fault, then the totals and the recovery
/// distribution.
pub fn table(seed: u64, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "chaos run, seed {seed:#x}: {} faults", rows.len());
    let _ = writeln!(
        out,
        "{:>4} {:>4} {:<22} {:<14} {:>10}  {:<7} seed",
        "#", "node", "point", "victim", "recovery", "result"
    );
    for r in rows {
        let rec = r
            .recovery
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .unwrap_or_else(|| "—".into());
        let verdict = if r.violations.is_empty() {
            "pass"
        } else {
            "FAIL"
        };
        let _ = writeln!(
            out,
            "{:>4} {:>4} {:<22} {:<14} {:>10}  {:<7} {:#x}",
            r.index, r.node, r.point, r.victim, rec, verdict, r.seed
        );
        for v in &r.violations {
            let _ = writeln!(out, "       violated {v}");
        }
    }
    let failed = rows.iter().filter(|r| !r.violations.is_empty()).count();
    for (n, what) in INVARIANTS {
        let broken = rows
            .iter()
            .filter(|r| r.violations.iter().any(|v| v.starts_with(&format!("{n}:"))))
            .count();
        let _ = writeln!(
            out,
            "invariant {n} ({what}): {} of {} held",
            rows.len() - broken,
            rows.len()
        );
    }
    let missed = rows
        .iter()
        .filter(|r| r.violations.iter().any(|v| v.starts_with("0:")))
        .count();
    let _ = writeln!(
        out,
        "faults not injected as planned (point not reached, victim not running): {missed}"
    );
    let rec: Vec<Duration> = rows.iter().filter_map(|r| r.recovery).collect();
    let s = |d: Option<Duration>| {
        d.map(|d| format!("{:.2} s", d.as_secs_f64()))
            .unwrap_or_else(|| "—".into())
    };
    let _ = writeln!(
        out,
        "recovery over {} faults: p50 {}, p99 {}, max {}",
        rec.len(),
        s(quantile(&rec, 0.5)),
        s(quantile(&rec, 0.99)),
        s(quantile(&rec, 1.0))
    );
    let _ = writeln!(
        out,
        "{} of {} faults passed every invariant",
        rows.len() - failed,
        rows.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Point, Victim};

    #[test]
    fn a_progress_line_names_the_fault_and_its_verdict() {
        let f = Fault {
            index: 7,
            point: Point::Verified,
            victim: Victim::ACTORS[0],
            seed: 1,
        };
        let pass = Row::of(f, 3, Some(Duration::from_millis(2340)), vec![]);
        let line = pass.progress();
        assert!(line.starts_with("chaos: #7 node 3 verified × "), "{line}");
        assert!(line.ends_with(": pass 2.34 s"), "{line}");
        let fail = Row::of(f, 3, None, vec!["2: a guard was missing".into()]);
        assert!(fail.progress().ends_with(": FAIL "), "{}", fail.progress());
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let xs: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(quantile(&xs, 0.5), Some(Duration::from_secs(50)));
        assert_eq!(quantile(&xs, 0.99), Some(Duration::from_secs(99)));
        assert_eq!(quantile(&xs, 1.0), Some(Duration::from_secs(100)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_table_names_each_failure_and_counts_each_invariant() {
        let f = |index| Fault {
            index,
            point: Point::CsrCreated,
            victim: Victim::ACTORS[2],
            seed: 9,
        };
        let rows = [
            Row::of(f(0), 0, Some(Duration::from_millis(1500)), vec![]),
            Row::of(f(1), 1, None, vec!["4: not ready within 40 s".into()]),
        ];
        let t = table(1, &rows);
        assert!(t.contains("CSR created"), "{t}");
        assert!(t.contains("violated 4: not ready"), "{t}");
        assert!(
            t.contains("invariant 4 (ready again within the bound): 1 of 2 held"),
            "{t}"
        );
        assert!(
            t.contains("invariant 1 (OVSDB on one complete generation): 2 of 2 held"),
            "{t}"
        );
        assert!(t.contains("1 of 2 faults passed"), "{t}");
    }
}
