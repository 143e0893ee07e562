//! `kube-ovn-ipsec-chaos-ledger [--expect SUITE]... LOG...`: the whole
//! run's faults and recovery distribution from the ledger lines the
//! suites printed into `LOG` (`chaos::report::Ledger`), per suite and over
//! all of them. Fails when a tagged line does not parse, when an expected
//! suite left no ledger (it did not run, or SKIPPED), or when a fault
//! violated an invariant.

use std::process::ExitCode;

use chaos::report::Ledger;

fn main() -> ExitCode {
    let mut expect = Vec::new();
    let mut logs = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--expect" {
            match args.next() {
                Some(s) => expect.push(s),
                None => return usage("--expect takes a suite's name"),
            }
        } else {
            logs.push(a);
        }
    }
    if logs.is_empty() {
        return usage("no log given");
    }
    let mut text = String::new();
    for path in &logs {
        match std::fs::read(path) {
            // A console may carry bytes that are not UTF-8; ledger lines are.
            Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Err(e) => {
                eprintln!("chaos-ledger: reading {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let ledger = match Ledger::parse(&text) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("chaos-ledger: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", ledger.summary());
    let missing: Vec<&String> = expect
        .iter()
        .filter(|s| !ledger.suites.iter().any(|r| &&r.suite == s))
        .collect();
    if !missing.is_empty() {
        eprintln!("chaos-ledger: no ledger from {missing:?}: the suite did not run to its table");
        return ExitCode::FAILURE;
    }
    if ledger.failed() > 0 {
        eprintln!(
            "chaos-ledger: {} of {} faults violated an invariant",
            ledger.failed(),
            ledger.faults()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn usage(why: &str) -> ExitCode {
    eprintln!(
        "chaos-ledger: {why} (usage: kube-ovn-ipsec-chaos-ledger [--expect SUITE]... LOG...)"
    );
    ExitCode::from(2)
}
