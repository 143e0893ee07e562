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
/// `elapsed`), then its [`Ledger`] lines, flushed before the caller tears
/// its world down; returns the table and how many rows failed, for the
/// caller's assertion.
pub fn print_run(seed: u64, rows: &[Row], unit: &str, elapsed: Duration) -> (String, usize) {
    use std::io::Write as _;
    let report = table(seed, rows);
    println!("{report}");
    println!("{} {unit} in {:.1} s", rows.len(), elapsed.as_secs_f64());
    let suite = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map_or_else(|| "unknown".to_string(), |s| suite_of_binary(&s));
    let ledger = Ledger::of(&suite, rows, elapsed);
    println!("{}", ledger.lines());
    let _ = std::io::stdout().flush();
    (report, ledger.failed())
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

/// A time in a table: seconds to the hundredth, `—` for none.
fn secs(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.2} s", d.as_secs_f64()))
        .unwrap_or_else(|| "—".into())
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
        let rec = secs(r.recovery);
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
    let _ = writeln!(
        out,
        "recovery over {} faults: p50 {}, p99 {}, max {}",
        rec.len(),
        secs(quantile(&rec, 0.5)),
        secs(quantile(&rec, 0.99)),
        secs(quantile(&rec, 1.0))
    );
    let _ = writeln!(
        out,
        "{} of {} faults passed every invariant",
        rows.len() - failed,
        rows.len()
    );
    out
}

/// A test binary's suite: its name without the hash cargo appends
/// (`overlay_kills-8caac3c6da9e7eae` → `overlay_kills`).
fn suite_of_binary(stem: &str) -> String {
    match stem.rsplit_once('-') {
        Some((name, hash)) if !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => stem.to_string(),
    }
}

/// What each line of a [`Ledger`] starts with.
pub const LEDGER_TAG: &str = "chaos-ledger";
/// Recoveries per ledger line: a line stays well under a pipe's atomic
/// write, so a line of one process is never split by another's output on
/// a shared log.
const PER_LINE: usize = 64;

/// The runs of the suites, as their ledger lines carry them out of each
/// test binary (and out of the guest's serial console) into one log:
/// what the whole CI run's recovery distribution is taken over
/// ([`Ledger::summary`]), rather than each suite's on its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// Per suite, in the order first seen: faults, failed, time spent,
    /// the measured recoveries.
    pub suites: Vec<SuiteRun>,
}

/// One suite's share of a [`Ledger`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SuiteRun {
    /// The test binary's name (`actor_kills`).
    pub suite: String,
    /// Faults injected.
    pub faults: usize,
    /// Faults that violated an invariant.
    pub failed: usize,
    /// Wall time of the runs, from the world's start to the table.
    pub elapsed: Duration,
    /// The recoveries measured (a fault without one: none within its
    /// bound, or nothing to recover from).
    pub recoveries: Vec<Duration>,
}

impl Ledger {
    /// The ledger of one run.
    pub fn of(suite: &str, rows: &[Row], elapsed: Duration) -> Ledger {
        Ledger {
            suites: vec![SuiteRun {
                suite: suite.to_string(),
                faults: rows.len(),
                failed: rows.iter().filter(|r| !r.violations.is_empty()).count(),
                elapsed,
                recoveries: rows.iter().filter_map(|r| r.recovery).collect(),
            }],
        }
    }

    /// Its lines: per suite, `chaos-ledger <suite> run <faults> <failed>
    /// <ms>`, then `chaos-ledger <suite> recovered <ms>...` in chunks.
    pub fn lines(&self) -> String {
        let mut out = Vec::new();
        for s in &self.suites {
            out.push(format!(
                "{LEDGER_TAG} {} run {} {} {}",
                s.suite,
                s.faults,
                s.failed,
                s.elapsed.as_millis()
            ));
            for chunk in s.recoveries.chunks(PER_LINE) {
                let ms: Vec<String> = chunk.iter().map(|d| d.as_millis().to_string()).collect();
                out.push(format!(
                    "{LEDGER_TAG} {} recovered {}",
                    s.suite,
                    ms.join(" ")
                ));
            }
        }
        out.join("\n")
    }

    /// The ledger in a log: its lines, wherever they are among the rest
    /// (a line may carry a prefix, as the guest's console gives it). A
    /// suite that ran twice counts twice. A tagged line that does not
    /// parse is an error naming it: the summary must not quietly leave
    /// faults out.
    pub fn parse(log: &str) -> Result<Ledger, String> {
        let mut ledger = Ledger::default();
        for (n, line) in log.lines().enumerate() {
            // The tag as a word of its own: a path or a binary's name
            // that contains it (cargo's `Running …chaos-ledger.rs`) is
            // not a ledger line.
            let Some(at) = line.match_indices(LEDGER_TAG).map(|(i, _)| i).find(|&i| {
                let before = line[..i].chars().next_back();
                let after = line[i + LEDGER_TAG.len()..].chars().next();
                before.is_none_or(char::is_whitespace) && after.is_some_and(char::is_whitespace)
            }) else {
                continue;
            };
            let bad = || format!("line {}: not a ledger line: {line}", n + 1);
            let mut words = line[at + LEDGER_TAG.len()..].split_whitespace();
            let (Some(suite), Some(kind)) = (words.next(), words.next()) else {
                return Err(bad());
            };
            let numbers: Vec<u64> = words
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad())?;
            match (kind, numbers.as_slice()) {
                ("run", &[faults, failed, ms]) => ledger.suites.push(SuiteRun {
                    suite: suite.to_string(),
                    faults: usize::try_from(faults).map_err(|_| bad())?,
                    failed: usize::try_from(failed).map_err(|_| bad())?,
                    elapsed: Duration::from_millis(ms),
                    recoveries: Vec::new(),
                }),
                ("recovered", ms) if !ms.is_empty() => {
                    // Recoveries follow their own run's line.
                    let Some(run) = ledger.suites.iter_mut().rev().find(|s| s.suite == suite)
                    else {
                        return Err(format!(
                            "line {}: recoveries of {suite} before its run line",
                            n + 1
                        ));
                    };
                    run.recoveries
                        .extend(ms.iter().map(|&m| Duration::from_millis(m)));
                    if run.recoveries.len() > run.faults {
                        return Err(format!(
                            "line {}: more recoveries than faults for {suite}",
                            n + 1
                        ));
                    }
                }
                _ => return Err(bad()),
            }
        }
        Ok(ledger)
    }

    /// Per suite and over all: faults, failed, time, and the recovery
    /// distribution (p50, p99, max) — the whole run's, over every fault
    /// with a recovery, not a bound from the suites' own.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "suite", "faults", "failed", "time", "measured", "p50", "p99", "max"
        );
        let mut row = |name: &str, faults: usize, failed: usize, t: Duration, rec: &[Duration]| {
            let _ = writeln!(
                out,
                "{:<20} {:>6} {:>6} {:>7.1} s {:>9} {:>9} {:>9} {:>9}",
                name,
                faults,
                failed,
                t.as_secs_f64(),
                rec.len(),
                secs(quantile(rec, 0.5)),
                secs(quantile(rec, 0.99)),
                secs(quantile(rec, 1.0))
            );
        };
        for r in &self.suites {
            row(&r.suite, r.faults, r.failed, r.elapsed, &r.recoveries);
        }
        let all: Vec<Duration> = self
            .suites
            .iter()
            .flat_map(|r| r.recoveries.iter().copied())
            .collect();
        row(
            "all",
            self.faults(),
            self.failed(),
            self.suites.iter().map(|r| r.elapsed).sum(),
            &all,
        );
        out
    }

    /// Faults over every suite.
    pub fn faults(&self) -> usize {
        self.suites.iter().map(|r| r.faults).sum()
    }

    /// Failed faults over every suite.
    pub fn failed(&self) -> usize {
        self.suites.iter().map(|r| r.failed).sum()
    }
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

    /// The `index`th fault of a run: `point`, the `actor`th actor, `seed`.
    fn fault(index: usize, point: Point, actor: usize, seed: u64) -> Fault<Victim> {
        Fault {
            index,
            point,
            victim: Victim::ACTORS[actor],
            seed,
        }
    }

    #[test]
    fn a_ledger_survives_a_shared_log_and_sums_over_every_suite() {
        let f = |index| fault(index, Point::Verified, 0, 1);
        let many: Vec<Row> = (0..100)
            .map(|i| {
                Row::of(
                    f(i),
                    0,
                    Some(Duration::from_millis(10 * (i as u64 + 1))),
                    vec![],
                )
            })
            .collect();
        let few = [
            Row::of(f(0), 1, Some(Duration::from_secs(48)), vec![]),
            Row::of(f(1), 1, None, vec!["4: not ready within 40 s".into()]),
        ];
        let a = Ledger::of("actor_kills", &many, Duration::from_secs(200));
        let b = Ledger::of("overlay_kills", &few, Duration::from_secs(300));
        // Chunked, interleaved with other output, one behind a console's
        // prefix.
        let log = format!(
            "noise\n{}\nipsec_starter[1]: routed\n     Running unittests \
             src/bin/kube-ovn-ipsec-chaos-ledger.rs (deps/kube_ovn_ipsec_chaos_ledger-94)\n\
             [guest] {}\n",
            a.lines(),
            b.lines()
        );
        assert!(a.lines().lines().count() > 2, "{}", a.lines());
        let l = Ledger::parse(&log).unwrap();
        assert_eq!(l.suites.len(), 2);
        assert_eq!(l.suites[0], a.suites[0]);
        assert_eq!(l.suites[1], b.suites[0]);
        assert_eq!((l.faults(), l.failed()), (102, 1));
        let sum = l.summary();
        let all = sum.lines().last().unwrap();
        // 101 measured: p99 by nearest rank is the 100th, 1.00 s; the 48 s
        // is the max only.
        assert!(all.starts_with("all"), "{sum}");
        assert!(all.contains("500.0 s"), "{all}");
        assert!(all.contains(" 101 "), "{all}");
        assert!(all.contains("1.00 s") && all.ends_with("48.00 s"), "{all}");
    }

    #[test]
    fn a_mangled_ledger_line_is_an_error_that_names_it() {
        let e = Ledger::parse("x\nchaos-ledger actor_kills run 5 zero 10\n").unwrap_err();
        assert!(e.starts_with("line 2:") && e.contains("run 5 zero"), "{e}");
        let e = Ledger::parse("chaos-ledger overlay_kills recovered 10\n").unwrap_err();
        assert!(e.contains("before its run line"), "{e}");
        let e =
            Ledger::parse("chaos-ledger a run 1 0 5\nchaos-ledger a recovered 1 2\n").unwrap_err();
        assert!(e.contains("more recoveries than faults"), "{e}");
        assert_eq!(
            suite_of_binary("overlay_kills-8caac3c6da9e7eae"),
            "overlay_kills"
        );
        assert_eq!(suite_of_binary("chaos-ledger"), "chaos-ledger");
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
        let f = |index| fault(index, Point::CsrCreated, 2, 9);
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
