//! What the lab records beside the probe streams, to account for every
//! phase and every lifecycle event as the strictest peer would:
//!
//! - the kernel's XFRM error counters of every node (`/proc/<holder
//!   pid>/net/xfrm_stat`, the node's network namespace, read without
//!   spawning anything), sampled every [`SAMPLE_PERIOD`];
//! - plaintext Geneve on every node's underlay (`tcpdump udp port 6081`
//!   from the probes' start to the end of the run), dated per packet;
//! - the lifecycle events: those the lab causes or sees (a renewal, the
//!   monitor killed), and the rekeys charon logs (its file log carries
//!   Unix seconds with milliseconds, the probes' clock).
//!
//! Pure accounting lives in `summary`; this file reads and records.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use testbed::overlay::{Capture, GENEVE_PORT, pcap_times};
use testbed::probe::unix_now;
use xfrm::stat::XfrmStats;

use harness::node::SimNode;

/// How often the XFRM counters are read.
pub(super) const SAMPLE_PERIOD: Duration = Duration::from_millis(500);

/// One reading of every node's counters (`None`: that node's file could
/// not be read or parsed at that moment).
pub(super) type Sample = (f64, Vec<Option<XfrmStats>>);

/// A lifecycle event the lab caused or saw.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Event {
    /// What happened (`renewal`, `monitor killed`, `IKE_SA rekey`, …).
    pub(super) kind: String,
    /// The node it happened on.
    pub(super) node: usize,
    /// When (Unix seconds).
    pub(super) at: f64,
    /// What it was about (a generation, a connection).
    pub(super) detail: String,
}

/// The counters' sampler and the underlay captures, running until dropped.
pub(super) struct Evidence {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    sampler: Option<JoinHandle<()>>,
    captures: Vec<(Capture, PathBuf)>,
    /// The events the steps recorded.
    pub(super) events: Vec<Event>,
}

impl Evidence {
    /// Starts sampling the counters of `nodes` and capturing plaintext
    /// Geneve on each one's underlay (`eth0`, into `plaintext.pcap` in its
    /// directory).
    pub(super) fn start(nodes: &[SimNode]) -> Result<Self, testbed::ipsec::IpsecError> {
        let files: Vec<PathBuf> = nodes
            .iter()
            .map(|n| {
                PathBuf::from(format!(
                    "/proc/{}/net/xfrm_stat",
                    n.node.netns().holder_pid()
                ))
            })
            .collect();
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let reading = files
                        .iter()
                        .map(|f| {
                            std::fs::read_to_string(f)
                                .ok()
                                .and_then(|t| XfrmStats::parse(&t).ok())
                        })
                        .collect();
                    if let Ok(mut s) = samples.lock() {
                        s.push((unix_now(), reading));
                    }
                    std::thread::sleep(SAMPLE_PERIOD);
                }
            })
        };
        let port = GENEVE_PORT.to_string();
        let mut captures = Vec::new();
        for n in nodes {
            let file = n.dir().join("plaintext.pcap");
            let cap =
                Capture::start_filtered(n.node.netns(), "eth0", &file, &["udp", "port", &port])?;
            captures.push((cap, file));
        }
        Ok(Evidence {
            samples,
            stop,
            sampler: Some(sampler),
            captures,
            events: Vec::new(),
        })
    }

    /// Records an event the lab caused or saw.
    pub(super) fn event(&mut self, kind: &str, node: usize, at: f64, detail: impl Into<String>) {
        self.events.push(Event {
            kind: kind.to_string(),
            node,
            at,
            detail: detail.into(),
        });
    }

    /// The counters' samples so far, oldest first.
    pub(super) fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// When each plaintext Geneve packet was captured, per node, so far.
    pub(super) fn plaintext_times(&self) -> Vec<Vec<f64>> {
        let port = GENEVE_PORT.to_string();
        self.captures
            .iter()
            .map(|(_, file)| pcap_times(file, &["udp", "port", &port]).unwrap_or_default())
            .collect()
    }
}

impl Drop for Evidence {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sampler.take() {
            let _ = t.join();
        }
    }
}

/// The rekeys in one node's charon log: (Unix seconds, kind, what).
///
/// A CHILD_SA rekey is logged where it starts, by each end whose kernel
/// reported one of the SA's states past its soft lifetime: `creating rekey
/// job for CHILD_SA ESP/0x<SPI>/<destination>` (the SPI names the SA on
/// both ends). An IKE_SA rekey is logged on both ends when it completes:
/// `IKE_SA <conn>[<n>] rekeyed between <own address>[<id>]...<peer
/// address>[<id>]`. The caller keeps one line per rekey.
pub(super) fn rekeys_in_log(log: &str) -> Vec<(f64, &'static str, String)> {
    log.lines()
        .filter_map(|line| {
            let (stamp, rest) = line.split_once(' ')?;
            let at: f64 = stamp.parse().ok()?;
            if let Some((_, tail)) = rest.split_once("rekeyed between ") {
                let (own, peer) = tail.split_once("...")?;
                let address = |end: &str| end.split('[').next().unwrap_or(end).to_string();
                let mut ends = [address(own), address(peer)];
                ends.sort();
                return Some((at, "IKE_SA rekey", ends.join(" <-> ")));
            }
            let (_, tail) = rest.split_once("creating rekey job for CHILD_SA ESP/")?;
            let (spi, dst) = tail.trim_end().split_once('/')?;
            Some((at, "CHILD_SA rekey", format!("SPI {spi} to {dst}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::rekeys_in_log;

    #[test]
    fn rekeys_are_read_from_charons_own_lines() {
        let log = "\
1796606239.832 15[KNL] creating rekey job for CHILD_SA ESP/0xc75ff568/10.77.0.2
1796606239.854 15[IKE] establishing CHILD_SA ovn-chassis2-0-out-1{13} reqid 723756875
1796606240.216 03[IKE] closing CHILD_SA ovn-chassis2-0-out-1{7} with SPIs c75ff568_i (0 bytes)
1796606336.224 16[IKE] IKE_SA ovn-chassis2-0-in-1[6] rekeyed between 10.77.0.1[chassis-0]...10.77.0.3[chassis-2]
1796606336.298 16[IKE] IKE_SA ovn-chassis0-0-in-1[5] rekeyed between 10.77.0.3[chassis-2]...10.77.0.1[chassis-0]
13:01:02 16[IKE] IKE_SA x[1] rekeyed between 10.0.0.1[a]...10.0.0.2[b]
";
        let r = rekeys_in_log(log);
        assert_eq!(
            r,
            vec![
                (
                    1796606239.832,
                    "CHILD_SA rekey",
                    "SPI 0xc75ff568 to 10.77.0.2".to_string()
                ),
                (
                    1796606336.224,
                    "IKE_SA rekey",
                    "10.77.0.1 <-> 10.77.0.3".to_string()
                ),
                (
                    1796606336.298,
                    "IKE_SA rekey",
                    "10.77.0.1 <-> 10.77.0.3".to_string()
                ),
            ]
        );
    }
}
