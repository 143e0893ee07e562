//! A steady probe stream: one echo per interval from a pod to another,
//! each echo's fate kept, so the packets lost can be counted per phase of
//! whatever ran meanwhile (the lab's enable, renewal, disable; a chaos
//! run's kills) instead of one total at the end.
//!
//! It is iputils `ping -n -D -O` in the sender's namespace: `-D` stamps
//! every line with the wall clock, `-O` reports an echo without a reply
//! when the next one goes out. [`parse_line`] reads those lines (pure),
//! [`ProbeLog`] keeps what each sequence number came to and when it was
//! sent, and [`ProbeLog::losses`] attributes them to phases by send time.
//! The phases' boundaries are wall-clock times too
//! ([`unix_now`]), the clock `-D` uses.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::ipsec::IpsecError;
use crate::netns::Netns;
use crate::overlay::background_ping;

/// One line of `ping -D -O` that says something about an echo.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Echo {
    /// The reply to `seq` arrived at `at` (seconds since the epoch), after
    /// `rtt_ms`.
    Reply {
        /// The ICMP sequence number.
        seq: u32,
        /// When the reply arrived.
        at: f64,
        /// The round trip, milliseconds.
        rtt_ms: f64,
    },
    /// No reply to `seq` yet when the next echo went out at `at`.
    NoAnswerYet {
        /// The ICMP sequence number.
        seq: u32,
        /// When the next echo went out.
        at: f64,
    },
}

/// Reads one line of `ping -n -D -O`; `None` for every other line (the
/// header, the summary, errors that name no sequence number).
pub fn parse_line(line: &str) -> Option<Echo> {
    let rest = line.strip_prefix('[')?;
    let (stamp, rest) = rest.split_once(']')?;
    let at: f64 = stamp.parse().ok()?;
    let rest = rest.trim_start();
    let seq_of = |s: &str| -> Option<u32> {
        let after = s.split("icmp_seq=").nth(1)?;
        after
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    if rest.starts_with("no answer yet") {
        return Some(Echo::NoAnswerYet {
            seq: seq_of(rest)?,
            at,
        });
    }
    if rest.contains(" bytes from ") {
        let rtt_ms = rest
            .split("time=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        return Some(Echo::Reply {
            seq: seq_of(rest)?,
            at,
            rtt_ms,
        });
    }
    None
}

/// Now, as seconds since the epoch: the clock `ping -D` stamps with.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the echoes of one stream came to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeLog {
    interval: f64,
    /// Sequence number → when it was sent, for answered echoes (the
    /// reply's stamp less its round trip).
    sent: BTreeMap<u32, f64>,
    /// Sequence number → the stamp of its "no answer yet" line, printed as
    /// the next echo goes out.
    unanswered_at: BTreeMap<u32, f64>,
    answered: BTreeSet<u32>,
}

/// Echoes sent within a span, and how many of them got no reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Echoes sent.
    pub sent: u32,
    /// Of those, never answered.
    pub lost: u32,
}

impl ProbeLog {
    /// An empty log of a stream sending every `interval`.
    pub fn new(interval: Duration) -> Self {
        ProbeLog {
            interval: interval.as_secs_f64(),
            ..ProbeLog::default()
        }
    }

    /// Adds one line's news. A late reply still counts.
    pub fn record(&mut self, echo: Echo) {
        match echo {
            Echo::Reply { seq, at, rtt_ms } => {
                self.sent.insert(seq, at - rtt_ms / 1000.0);
                self.answered.insert(seq);
            }
            Echo::NoAnswerYet { seq, at } => {
                self.unanswered_at.entry(seq).or_insert(at);
            }
        }
    }

    /// The stream's real spacing: the median gap between the send times
    /// of consecutive answered echoes (a loaded machine stretches the
    /// requested interval by milliseconds, enough to move an echo across a
    /// phase boundary).
    fn spacing(&self) -> f64 {
        let mut gaps: Vec<f64> = self
            .sent
            .iter()
            .zip(self.sent.iter().skip(1))
            .filter(|((a, _), (b, _))| **b == **a + 1)
            .map(|((_, ta), (_, tb))| tb - ta)
            .collect();
        if gaps.is_empty() {
            return self.interval;
        }
        gaps.sort_by(f64::total_cmp);
        gaps[gaps.len() / 2]
    }

    /// Every echo the stream moved past: (when it was sent, answered). An
    /// unanswered one is dated one spacing before its "no answer yet"
    /// line, which is printed as the next echo goes out.
    fn echoes(&self) -> Vec<(f64, bool)> {
        let spacing = self.spacing();
        let mut v: Vec<(f64, bool)> = self.sent.values().map(|at| (*at, true)).collect();
        v.extend(
            self.unanswered_at
                .iter()
                .filter(|(seq, _)| !self.answered.contains(seq))
                .map(|(_, at)| (at - spacing, false)),
        );
        v
    }

    /// The echoes sent in `[from, to)` and how many were not answered.
    /// Only echoes the stream has moved past count: a sequence number is
    /// known once a later line names it.
    pub fn tally(&self, from: f64, to: f64) -> Tally {
        let mut t = Tally::default();
        for (at, answered) in self.echoes() {
            if at >= from && at < to {
                t.sent += 1;
                t.lost += u32::from(!answered);
            }
        }
        t
    }

    /// The runs of consecutive lost echoes sent in `[from, to)`: (first
    /// sent, last sent, how many), in order. Where a loss no phase allows
    /// fell, for the operator reading a failed run.
    pub fn lost_spans(&self, from: f64, to: f64) -> Vec<(f64, f64, u32)> {
        let mut echoes = self.echoes();
        echoes.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut spans: Vec<(f64, f64, u32)> = Vec::new();
        let mut open = false;
        for (at, answered) in echoes.into_iter().filter(|(at, _)| *at >= from && *at < to) {
            match (answered, open, spans.last_mut()) {
                (false, true, Some(last)) => {
                    last.1 = at;
                    last.2 += 1;
                }
                (false, _, _) => {
                    spans.push((at, at, 1));
                    open = true;
                }
                (true, _, _) => open = false,
            }
        }
        spans
    }

    /// Per phase, its tally: `phases` are (name, start) in order; each
    /// runs until the next one starts, the last until the end of the log.
    pub fn losses<'a>(&self, phases: &[(&'a str, f64)]) -> Vec<(&'a str, Tally)> {
        phases
            .iter()
            .enumerate()
            .map(|(i, (name, from))| {
                let to = phases.get(i + 1).map_or(f64::INFINITY, |p| p.1);
                (*name, self.tally(*from, to))
            })
            .collect()
    }

    /// When the stream answered again after its last loss in
    /// `[from, to)`: the send time of the first answered echo sent after
    /// the last unanswered one sent in that span; `from` when none in it
    /// went unanswered; `None` when nothing was answered after that loss.
    /// A flip's window per pair, read from the stream itself rather than
    /// from a probe started once the flip is seen.
    pub fn answered_again(&self, from: f64, to: f64) -> Option<f64> {
        let mut echoes = self.echoes();
        echoes.sort_by(|a, b| a.0.total_cmp(&b.0));
        let Some(last_lost) = echoes
            .iter()
            .filter(|(at, answered)| *at >= from && *at < to && !answered)
            .map(|(at, _)| *at)
            .next_back()
        else {
            return Some(from);
        };
        echoes
            .iter()
            .find(|(at, answered)| *at > last_lost && *answered)
            .map(|(at, _)| *at)
    }

    /// Every echo the log knows of.
    pub fn total(&self) -> Tally {
        self.tally(f64::NEG_INFINITY, f64::INFINITY)
    }
}

/// A probe stream running in the background until stopped.
#[derive(Debug)]
pub struct ProbeStream {
    // Taken by `stop`; whatever is left is killed on drop.
    child: Option<Child>,
    reader: Option<JoinHandle<()>>,
    log: Arc<Mutex<ProbeLog>>,
}

impl ProbeStream {
    /// Starts `ping -n -D -O -i interval dst` in `ns`.
    pub fn start(ns: &Netns, dst: Ipv4Addr, interval: Duration) -> Result<Self, IpsecError> {
        let mut child = background_ping(ns, &["-D", "-O"], dst, interval)?;
        let log = Arc::new(Mutex::new(ProbeLog::new(interval)));
        let reader = child.stdout.take().map(|out| {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if let (Some(echo), Ok(mut l)) = (parse_line(&line), log.lock()) {
                        l.record(echo);
                    }
                }
            })
        });
        Ok(ProbeStream {
            child: Some(child),
            reader,
            log,
        })
    }

    /// What the stream came to so far.
    pub fn log(&self) -> ProbeLog {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Stops it and returns the whole log. SIGINT lets ping print the
    /// lines it owes; the echo in flight at that moment is not counted
    /// (no later line names it).
    pub fn stop(mut self) -> ProbeLog {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
            }
            let _ = child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log()
    }
}

impl Drop for ProbeStream {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as iputils ping 20240117 prints them (captured on this
    // project's Debian machine, a blackhole route in the middle).
    const RUN: &str = "PING 10.99.0.1 (10.99.0.1) 56(84) bytes of data.
[1796223011.322607] 64 bytes from 10.99.0.1: icmp_seq=1 ttl=64 time=0.091 ms
[1796223011.524665] 64 bytes from 10.99.0.1: icmp_seq=2 ttl=64 time=0.044 ms
[1796223011.728674] 64 bytes from 10.99.0.1: icmp_seq=3 ttl=64 time=0.057 ms
[1796223011.932631] 64 bytes from 10.99.0.1: icmp_seq=4 ttl=64 time=0.048 ms
[1796223012.340506] no answer yet for icmp_seq=5
[1796223012.544525] no answer yet for icmp_seq=6
[1796223012.748526] no answer yet for icmp_seq=7
[1796223012.748622] 64 bytes from 10.99.0.1: icmp_seq=8 ttl=64 time=0.047 ms
[1796223012.952660] 64 bytes from 10.99.0.1: icmp_seq=9 ttl=64 time=0.047 ms
[1796223013.156587] 64 bytes from 10.99.0.1: icmp_seq=10 ttl=64 time=0.050 ms

--- 10.99.0.1 ping statistics ---
11 packets transmitted, 8 received, 27.2727% packet loss, time 2038ms";

    fn log_of(text: &str) -> ProbeLog {
        let mut log = ProbeLog::new(Duration::from_millis(200));
        for echo in text.lines().filter_map(parse_line) {
            log.record(echo);
        }
        log
    }

    #[test]
    fn answered_again_is_the_first_answer_after_the_last_loss() {
        let log = log_of(RUN);
        // Echoes 5-7 lost (dated one spacing before their lines), 8 the
        // first answered after them.
        let eight = 1_796_223_012.748_622 - 0.047 / 1000.0;
        let got = log
            .answered_again(1_796_223_011.0, 1_796_223_014.0)
            .unwrap();
        assert!((got - eight).abs() < 0.01, "{got}");
        // A span without a loss: answered all along.
        assert_eq!(
            log.answered_again(1_796_223_011.0, 1_796_223_012.0),
            Some(1_796_223_011.0)
        );
        // The loss at the end of a stream, nothing after it.
        let cut = log_of(&RUN.lines().take(8).collect::<Vec<_>>().join("\n"));
        assert_eq!(cut.answered_again(1_796_223_011.0, 1_796_223_014.0), None);
    }

    #[test]
    fn lost_spans_are_the_runs_of_lost_echoes() {
        let log = log_of(RUN);
        let spans = log.lost_spans(1_796_223_011.0, 1_796_223_014.0);
        assert_eq!(spans.len(), 1, "{spans:?}");
        let (first, last, n) = spans[0];
        assert_eq!(n, 3);
        assert!(
            (first - (1_796_223_012.340_506 - 0.2)).abs() < 0.05,
            "{first}"
        );
        assert!(last > first, "{last}");
        assert!(log.lost_spans(1_796_223_011.0, 1_796_223_012.0).is_empty());
    }

    #[test]
    fn lines_are_read_and_others_ignored() {
        assert_eq!(
            parse_line(
                "[1796223011.322607] 64 bytes from 10.99.0.1: icmp_seq=1 ttl=64 time=0.091 ms"
            ),
            Some(Echo::Reply {
                seq: 1,
                at: 1_796_223_011.322_607,
                rtt_ms: 0.091
            })
        );
        assert_eq!(
            parse_line("[1796223012.340506] no answer yet for icmp_seq=5"),
            Some(Echo::NoAnswerYet {
                seq: 5,
                at: 1_796_223_012.340_506
            })
        );
        for other in [
            "PING 10.99.0.1 (10.99.0.1) 56(84) bytes of data.",
            "11 packets transmitted, 8 received, 27.2727% packet loss, time 2038ms",
            "[1796223012.3] From 10.0.0.1 Destination Host Unreachable",
            "[garbage] 64 bytes from x: icmp_seq=1 time=1 ms",
            "[1796223012.3] 64 bytes from 10.99.0.1: icmp_seq=x ttl=64 time=0.1 ms",
            "",
        ] {
            assert_eq!(parse_line(other), None, "{other:?}");
        }
    }

    #[test]
    fn losses_are_attributed_to_the_phase_their_echo_was_sent_in() {
        let log = log_of(RUN);
        assert_eq!(log.total(), Tally { sent: 10, lost: 3 });
        let phases = [
            ("before", 1_796_223_011.0),
            ("outage", 1_796_223_012.0),
            ("after", 1_796_223_012.7),
        ];
        assert_eq!(
            log.losses(&phases),
            [
                ("before", Tally { sent: 4, lost: 0 }),
                ("outage", Tally { sent: 3, lost: 3 }),
                ("after", Tally { sent: 3, lost: 0 }),
            ]
        );
    }

    #[test]
    fn a_late_reply_is_not_a_loss() {
        let log = log_of(
            "[100.2] no answer yet for icmp_seq=1\n\
             [100.3] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=300.0 ms\n\
             [100.4] 64 bytes from 10.0.0.2: icmp_seq=2 ttl=64 time=0.5 ms",
        );
        assert_eq!(log.total(), Tally { sent: 2, lost: 0 });
        // Dated by its round trip: sent at 100.0.
        assert_eq!(log.tally(99.9, 100.1), Tally { sent: 1, lost: 0 });
    }
}
