//! The overlay's data path on simulated nodes, and the instruments that show
//! what the underlay really carries.
//!
//! Beside an [`IpsecNode`]'s ovsdb-server: [`VSwitchd`], ovs-vswitchd on the
//! OVS **kernel** datapath (`system@ovs-system`, one per network namespace;
//! each node's own `/run` keeps the daemons' sockets apart), and
//! [`add_pod`], an internal port on `br-int` with an address — the "pod".
//! Geneve tunnels come from [`IpsecNode::add_tunnel`] (IPsec intent) or
//! [`IpsecNode::add_plain_tunnel`] (none).
//!
//! The instruments: [`Capture`] (tcpdump on an underlay link, summarised as
//! ESP vs plaintext Geneve), [`ping`] and [`Pinger`] (RTT and loss),
//! [`tcp_throughput`] (a bulk TCP stream between pods) and [`xfrm_stats`]
//! (the kernel's XFRM counters in the node's namespace).
//!
//! Everything here needs the kernel's openvswitch and geneve modules (and
//! ESP for the encrypted path): on a machine without them, run it on
//! [`crate::guest`]'s full kernel.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use xfrm::stat::XfrmStats;

use crate::ipsec::{IpsecError, IpsecNode, SYSTEM_PYTHON};
use crate::netns::{self, Entry, Netns};

/// The Geneve UDP port.
pub const GENEVE_PORT: u16 = 6081;
/// MTU of pod ports: room for Geneve (and ESP) inside the underlay's 1500.
pub const POD_MTU: u32 = 1400;

fn failed(what: impl Into<String>, detail: impl Into<String>) -> IpsecError {
    IpsecError::Failed {
        what: what.into(),
        detail: detail.into(),
    }
}

fn signal(child: &Child, sig: Signal) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// Waits up to `grace` for `child` to exit after SIGTERM, then SIGKILLs it.
fn terminate(child: &mut Child, grace: Duration) {
    signal(child, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// ovs-vswitchd of one node, on the kernel datapath; stopped on drop.
#[derive(Debug)]
pub struct VSwitchd {
    child: Child,
    log: PathBuf,
}

impl VSwitchd {
    /// Starts ovs-vswitchd against the node's `/run/openvswitch/db.sock`
    /// (ovsdb-server must be running) in the foreground, logging to the
    /// node's `ovs-vswitchd.log`, and waits for its control socket and for
    /// `br-int` to exist as a kernel device.
    pub fn start(node: &IpsecNode) -> Result<Self, IpsecError> {
        crate::require_program("ovs-vswitchd")
            .map_err(|e| failed("ovs-vswitchd", e.to_string()))?;
        let log = node.dir().join("ovs-vswitchd.log");
        let child = node
            .netns()
            .command("ovs-vswitchd")
            .args([
                "unix:/run/openvswitch/db.sock",
                "--pidfile=/run/openvswitch/ovs-vswitchd.pid",
                // The control socket at OVS's default name
                // (`ovs-vswitchd.<pid>.ctl`), as in Kube-OVN's openvswitch
                // container: a bare `ovs-appctl` in the node finds it.
                "--no-chdir",
            ])
            .arg(format!("--log-file={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed("spawning ovs-vswitchd", e.to_string()))?;
        let mut me = Self { child, log };
        let pidfile = node.run_path("openvswitch/ovs-vswitchd.pid");
        let ctl = || {
            let pid = std::fs::read_to_string(&pidfile).ok()?;
            Some(node.run_path(&format!("openvswitch/ovs-vswitchd.{}.ctl", pid.trim())))
        };
        let waited = Duration::from_secs(30);
        let up = netns::wait_for(waited, Duration::from_millis(50), || {
            (ctl().is_some_and(|c| c.exists())
                && node.netns().ip(["link", "show", "br-int"]).is_ok())
            .then_some(())
        });
        if up.is_none() {
            return Err(IpsecError::NotReady {
                what: "ovs-vswitchd with br-int on the kernel datapath".into(),
                waited,
                diagnostics: me.log_tail(30),
            });
        }
        if let Ok(Some(status)) = me.child.try_wait() {
            return Err(failed(
                format!("ovs-vswitchd exited ({status})"),
                me.log_tail(30),
            ));
        }
        Ok(me)
    }

    /// The last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for VSwitchd {
    fn drop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(3));
    }
}

/// Adds the internal port `name` on `br-int` (ovs-vswitchd must run),
/// gives it `cidr` and [`POD_MTU`] and brings it up: a pod on this node.
pub fn add_pod(node: &IpsecNode, name: &str, cidr: &str) -> Result<(), IpsecError> {
    node.vsctl(&[
        "add-port",
        "br-int",
        name,
        "--",
        "set",
        "Interface",
        name,
        "type=internal",
    ])?;
    let waited = Duration::from_secs(10);
    netns::wait_for(waited, Duration::from_millis(50), || {
        node.netns().ip(["link", "show", name]).ok()
    })
    .ok_or_else(|| IpsecError::NotReady {
        what: format!("the internal port {name}"),
        waited,
        diagnostics: node.diagnostics(),
    })?;
    let ns = node.netns();
    ns.ip(["addr", "add", cidr, "dev", name])?;
    ns.ip(["link", "set", name, "mtu", &POD_MTU.to_string(), "up"])?;
    ns.ip(["link", "set", "br-int", "up"])?;
    Ok(())
}

/// Replaces `br-int`'s flows on the switch of the node `entry` enters with
/// a split horizon, as OVN forwards between chassis: what the pod `pod`
/// sends goes out of every tunnel in `tunnels`, what arrives on a tunnel
/// goes to the pod only (with more than two nodes a full mesh of tunnels
/// under the `NORMAL` action would loop broadcasts). Every packet the pod
/// sends carries OVN's Geneve option (one 4-byte option, class 0x0102,
/// type 0x80: OVN's logical ports), so the wire format — and what ESP's
/// MTU arithmetic must leave room for — is OVN's, byte for byte; without
/// it a packet is 8 bytes shorter on the wire than OVN's. ovs-vswitchd
/// must run and the ports must exist. `entry` rather than a node: the
/// caller is a thread playing ovn-controller for a node it does not own.
pub fn split_horizon(entry: &Entry, pod: &str, tunnels: &[&str]) -> Result<(), IpsecError> {
    let ofctl = |args: &[&str]| -> Result<String, IpsecError> {
        let out = entry.run("ovs-ofctl", args)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(failed(
                format!("ovs-ofctl {}", args.join(" ")),
                String::from_utf8_lossy(&out.stderr),
            ))
        }
    };
    // The option's mapping once: every call maps it the same way.
    let map = ofctl(&["dump-tlv-map", "br-int"])?;
    if !map.contains("tun_metadata0") {
        ofctl(&[
            "add-tlv-map",
            "br-int",
            "{class=0x102,type=0x80,len=4}->tun_metadata0",
        ])?;
    }
    let mut actions = vec!["set_field:0x1->tun_metadata0".to_owned()];
    actions.extend(tunnels.iter().map(|t| format!("output:{t}")));
    let mut flows = vec![format!("in_port={pod},actions={}", actions.join(","))];
    flows.extend(
        tunnels
            .iter()
            .map(|t| format!("in_port={t},actions=output:{pod}")),
    );
    // One replace-flows: ovs-vswitchd gets only the difference, so a tunnel
    // added or removed never leaves the pods' flows missing for a moment
    // (deleting every flow first dropped the traffic of the tunnels that
    // stayed, seconds long under TCG).
    let file = tempfile::Builder::new()
        .prefix("koi-flows-")
        .tempfile()
        .map_err(|e| failed("writing the flows", e.to_string()))?;
    std::fs::write(file.path(), flows.join("\n") + "\n")
        .map_err(|e| failed("writing the flows", e.to_string()))?;
    ofctl(&["replace-flows", "br-int", &file.path().to_string_lossy()])?;
    Ok(())
}

/// Sends single echoes to `dst` from `ns` (each waiting up to 200 ms) until
/// one is answered; how long after the call that was, `None` after
/// `timeout`. Resolution: one lost echo costs at most 200 ms.
pub fn first_reply(ns: &Netns, dst: Ipv4Addr, timeout: Duration) -> Option<Duration> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < timeout {
        let answered = ns
            .command("ping")
            .args(["-n", "-q", "-c", "1", "-W", "0.2"])
            .arg(dst.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if answered {
            return Some(t0.elapsed());
        }
    }
    None
}

/// [`first_reply`] for several (namespace, destination) probes at once,
/// each on its own thread: a window per pair measured from the same start.
pub fn first_replies(probes: &[(&Netns, Ipv4Addr)], timeout: Duration) -> Vec<Option<Duration>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = probes
            .iter()
            .map(|&(ns, dst)| s.spawn(move || first_reply(ns, dst, timeout)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    })
}

/// The kernel's XFRM counters in `ns` (`/proc/net/xfrm_stat` read by a
/// process inside it).
pub fn xfrm_stats(ns: &Netns) -> Result<XfrmStats, IpsecError> {
    let out = ns.run("cat", ["/proc/net/xfrm_stat"])?;
    XfrmStats::parse(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| failed("parsing /proc/net/xfrm_stat", e.to_string()))
}

/// What a stopped [`Capture`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureSummary {
    /// Every captured packet.
    pub total: usize,
    /// ESP packets (IP protocol 50).
    pub esp: usize,
    /// Plaintext Geneve: UDP to or from port 6081.
    pub geneve: usize,
    /// Packets the kernel dropped before tcpdump saw them (then the capture
    /// proves nothing about what it missed).
    pub dropped_by_kernel: u64,
}

/// tcpdump on one link of a namespace, writing a pcap file; summarised
/// when stopped.
#[derive(Debug)]
pub struct Capture {
    child: Child,
    file: PathBuf,
    stderr: mpsc::Receiver<String>,
}

impl Capture {
    /// Starts capturing every packet on `iface` in `ns` into `file` and
    /// waits until tcpdump says it is listening.
    pub fn start(ns: &Netns, iface: &str, file: &Path) -> Result<Self, IpsecError> {
        Self::start_filtered(ns, iface, file, &[])
    }

    /// [`Capture::start`], keeping only the packets `filter` (tcpdump's
    /// expression, one word per item) admits.
    pub fn start_filtered(
        ns: &Netns,
        iface: &str,
        file: &Path,
        filter: &[&str],
    ) -> Result<Self, IpsecError> {
        crate::require_program("tcpdump").map_err(|e| failed("tcpdump", e.to_string()))?;
        let mut child = ns
            .command("tcpdump")
            // Immediate mode: without it packets reach tcpdump in ring
            // blocks up to a second late, and the last second of traffic
            // before a stop would be missing from the evidence.
            .args([
                "--immediate-mode",
                "-U",
                "-n",
                "-s",
                "128",
                "-i",
                iface,
                "-w",
            ])
            .arg(file)
            .args(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed("spawning tcpdump", e.to_string()))?;
        let (tx, rx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let waited = Duration::from_secs(15);
        let deadline = Instant::now() + waited;
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) if line.contains("listening on") => break,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(IpsecError::NotReady {
                        what: format!("tcpdump on {iface}"),
                        waited,
                        diagnostics: seen.join("\n"),
                    });
                }
            }
        }
        Ok(Self {
            child,
            file: file.to_path_buf(),
            stderr: rx,
        })
    }

    /// Stops tcpdump (SIGINT: it flushes the file and reports its drops)
    /// and counts what it captured.
    pub fn stop(mut self) -> Result<CaptureSummary, IpsecError> {
        // Packets still in flight (a reply on its way back) get in.
        std::thread::sleep(Duration::from_millis(300));
        signal(&self.child, Signal::SIGINT);
        let _ = self.child.wait();
        let mut dropped_by_kernel = 0;
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_secs(2)) {
            if let Some(n) = line.strip_suffix(" packets dropped by kernel") {
                dropped_by_kernel = n.trim().parse().unwrap_or(u64::MAX);
            }
        }
        let count = |filter: &[&str]| -> Result<usize, IpsecError> {
            let out = netns::run(
                std::process::Command::new("tcpdump")
                    .args(["-n", "-r"])
                    .arg(&self.file)
                    .args(filter),
            )?;
            Ok(String::from_utf8_lossy(&out.stdout).lines().count())
        };
        Ok(CaptureSummary {
            total: count(&[])?,
            esp: count(&["ip", "proto", "50"])?,
            geneve: count(&["udp", "port", &GENEVE_PORT.to_string()])?,
            dropped_by_kernel,
        })
    }
}

/// When each packet of the pcap `file` that `filter` admits was captured
/// (Unix seconds), read while tcpdump may still be writing it: a packet cut
/// short at the end of the file is left out, not an error.
pub fn pcap_times(file: &Path, filter: &[&str]) -> Result<Vec<f64>, IpsecError> {
    let out = std::process::Command::new("tcpdump")
        .args(["-tt", "-n", "-r"])
        .arg(file)
        .args(filter)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| failed("running tcpdump -r", e.to_string()))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .collect())
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Packets sent and answered by `ping`, and the mean round trip.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PingStats {
    /// Echo requests sent.
    pub transmitted: u32,
    /// Echo replies received.
    pub received: u32,
    /// Mean RTT of the answered ones, in milliseconds.
    pub rtt_avg_ms: Option<f64>,
}

impl PingStats {
    /// Reads the summary lines of iputils `ping` output.
    pub fn parse(text: &str) -> Option<PingStats> {
        let mut stats = None;
        for line in text.lines() {
            if let Some((tx, rest)) = line.split_once(" packets transmitted, ") {
                let rx = rest.split_once(" received")?.0;
                stats = Some(PingStats {
                    transmitted: tx.trim().parse().ok()?,
                    received: rx.trim().parse().ok()?,
                    rtt_avg_ms: None,
                });
            }
            // rtt min/avg/max/mdev = 0.799/0.886/0.974/0.087 ms
            if let (Some(s), Some((_, v))) = (stats.as_mut(), line.split_once(" = ")) {
                s.rtt_avg_ms = v.split('/').nth(1).and_then(|a| a.parse().ok());
            }
        }
        stats
    }
}

/// `ping -c count -i interval -W 1 dst` in `ns`; a ping that lost packets
/// is a result, not an error.
pub fn ping(
    ns: &Netns,
    dst: Ipv4Addr,
    count: u32,
    interval: Duration,
) -> Result<PingStats, IpsecError> {
    let out = ns
        .command("ping")
        .args(["-n", "-q", "-W", "1", "-c", &count.to_string(), "-i"])
        .arg(format!("{:.3}", interval.as_secs_f64()))
        .arg(dst.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed("running ping", e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    PingStats::parse(&text).ok_or_else(|| {
        failed(
            format!("ping {dst}: no summary"),
            format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
        )
    })
}

/// `ping -n <flags> -i interval dst` in `ns`, its output piped: the one
/// way the instruments here start a continuous ping.
pub(crate) fn background_ping(
    ns: &Netns,
    flags: &[&str],
    dst: Ipv4Addr,
    interval: Duration,
) -> Result<Child, IpsecError> {
    ns.command("ping")
        .arg("-n")
        .args(flags)
        .arg("-i")
        .arg(format!("{:.3}", interval.as_secs_f64()))
        .arg(dst.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| failed("spawning ping", e.to_string()))
}

/// A ping running in the background until stopped.
#[derive(Debug)]
pub struct Pinger {
    // Taken by `stop`; whatever is left is killed on drop.
    child: Option<Child>,
}

impl Pinger {
    /// Starts `ping -i interval -W 1 dst` in `ns`.
    pub fn start(ns: &Netns, dst: Ipv4Addr, interval: Duration) -> Result<Self, IpsecError> {
        let child = background_ping(ns, &["-q", "-W", "1"], dst, interval)?;
        Ok(Self { child: Some(child) })
    }

    /// Stops it (SIGINT makes ping print its summary) and returns the
    /// counts.
    pub fn stop(mut self) -> Result<PingStats, IpsecError> {
        let child = self
            .child
            .take()
            .ok_or_else(|| failed("background ping", "already stopped"))?;
        signal(&child, Signal::SIGINT);
        let out = child
            .wait_with_output()
            .map_err(|e| failed("waiting for ping", e.to_string()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        PingStats::parse(&text).ok_or_else(|| failed("background ping: no summary", text))
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One bulk TCP transfer measured at the receiver.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Bytes received.
    pub bytes: u64,
    /// From the first byte to the sender's close.
    pub seconds: f64,
}

impl Throughput {
    /// Megabits per second.
    pub fn mbit_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 * 8.0 / self.seconds / 1e6
        } else {
            0.0
        }
    }
}

/// The receiver: accepts one connection, reads until EOF, prints
/// `<bytes> <seconds from the first byte>`.
const SINK: &str = r#"
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(30)
print('listening', flush=True)
c, _ = s.accept()
c.settimeout(30)
n, t0 = 0, None
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    if t0 is None:
        t0 = time.monotonic()
    n += len(b)
print(n, time.monotonic() - (t0 or time.monotonic()), flush=True)
"#;

/// The sender: connects and writes 64 KiB blocks for argv[3] seconds.
const SOURCE: &str = r#"
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
buf = b'x' * (1 << 16)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    c.sendall(buf)
c.close()
"#;

/// Streams bulk TCP from a socket in `from` to `to_ip:port` (a listener in
/// `to`) for `duration`, and returns what the receiver counted.
pub fn tcp_throughput(
    from: &Netns,
    to: &Netns,
    to_ip: Ipv4Addr,
    port: u16,
    duration: Duration,
) -> Result<Throughput, IpsecError> {
    let mut sink = to
        .command(SYSTEM_PYTHON)
        .args(["-c", SINK, &to_ip.to_string(), &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed("spawning the TCP sink", e.to_string()))?;
    let mut lines = BufReader::new(
        sink.stdout
            .take()
            .ok_or_else(|| failed("the TCP sink", "no stdout"))?,
    )
    .lines();
    match lines.next() {
        Some(Ok(l)) if l == "listening" => {}
        other => {
            let _ = sink.kill();
            let out = sink.wait_with_output().ok();
            return Err(failed(
                "the TCP sink did not listen",
                format!(
                    "{other:?} {}",
                    out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                        .unwrap_or_default()
                ),
            ));
        }
    }
    let sent = from.run(
        SYSTEM_PYTHON,
        [
            "-c",
            SOURCE,
            &to_ip.to_string(),
            &port.to_string(),
            &format!("{:.3}", duration.as_secs_f64()),
        ],
    );
    if let Err(e) = sent {
        let _ = sink.kill();
        let _ = sink.wait();
        return Err(e.into());
    }
    let result = lines.next();
    let _ = sink.wait();
    let text = match result {
        Some(Ok(t)) => t,
        other => return Err(failed("the TCP sink's count", format!("{other:?}"))),
    };
    let mut fields = text.split_whitespace();
    let parse = || failed("the TCP sink's count", text.clone());
    let bytes = fields
        .next()
        .and_then(|b| b.parse().ok())
        .ok_or_else(parse)?;
    let seconds = fields
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(parse)?;
    Ok(Throughput { bytes, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{VethEnd, veth_pair};

    /// Two namespaces on a veth pair, 10.78.0.1 and 10.78.0.2 (no kernel
    /// feature beyond veth: the instruments are checked on any host).
    fn pair() -> (Netns, Netns) {
        for p in ["ip", "nsenter", "ping", "tcpdump", "cat"] {
            crate::require_program(p).unwrap();
        }
        let a = Netns::create("koi-instr").unwrap();
        let b = Netns::create("koi-instr").unwrap();
        veth_pair(
            VethEnd {
                netns: &a,
                ifname: "eth0",
                cidr: "10.78.0.1/24",
            },
            VethEnd {
                netns: &b,
                ifname: "eth0",
                cidr: "10.78.0.2/24",
            },
        )
        .unwrap();
        (a, b)
    }

    const B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

    #[test]
    fn instruments_on_a_veth_pair() {
        let (a, b) = pair();
        let dir = tempfile::tempdir().unwrap();
        let before = xfrm_stats(&a).unwrap();
        let cap = Capture::start(&a, "eth0", &dir.path().join("c.pcap")).unwrap();
        let p = ping(&a, B, 3, Duration::from_millis(100)).unwrap();
        assert_eq!((p.transmitted, p.received), (3, 3), "{p:?}");
        assert!(p.rtt_avg_ms.is_some());
        // UDP to 6081 is what the capture calls plaintext Geneve.
        for _ in 0..4 {
            a.run(
                SYSTEM_PYTHON,
                [
                    "-c",
                    "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\
                     .sendto(b'x', ('10.78.0.2', 6081))",
                ],
            )
            .unwrap();
        }
        let seen = cap.stop().unwrap();
        assert_eq!(seen.geneve, 4, "{seen:?}");
        assert_eq!(seen.esp, 0, "{seen:?}");
        assert!(
            seen.total >= 10,
            "3 echoes, 3 replies, 4 datagrams: {seen:?}"
        );
        assert_eq!(seen.dropped_by_kernel, 0);
        assert!(xfrm_stats(&a).unwrap().growth_since(&before).is_empty());

        let bg = Pinger::start(&a, B, Duration::from_millis(100)).unwrap();
        std::thread::sleep(Duration::from_millis(450));
        let s = bg.stop().unwrap();
        assert!(s.transmitted >= 2 && s.received == s.transmitted, "{s:?}");
        // Nobody at .9: a result with losses, not an error.
        let lost = ping(
            &a,
            Ipv4Addr::new(10, 78, 0, 9),
            1,
            Duration::from_millis(100),
        )
        .unwrap();
        assert_eq!(lost.received, 0);

        let t = tcp_throughput(&a, &b, B, 5301, Duration::from_millis(300)).unwrap();
        assert!(t.bytes > 0 && t.seconds > 0.0, "{t:?}");
        // No listener reachable: the error names the sink.
        let e =
            tcp_throughput(&a, &b, Ipv4Addr::new(10, 78, 0, 9), 5302, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("TCP sink"), "{e}");
    }

    #[test]
    fn ping_summary_with_and_without_replies() {
        let ok = "PING 10.1.0.2 (10.1.0.2) 56(84) bytes of data.\n\n--- 10.1.0.2 ping statistics ---\n\
                  5 packets transmitted, 5 received, 0% packet loss, time 4011ms\n\
                  rtt min/avg/max/mdev = 0.799/0.886/0.974/0.087 ms\n";
        let s = PingStats::parse(ok).unwrap();
        assert_eq!((s.transmitted, s.received), (5, 5));
        assert_eq!(s.rtt_avg_ms, Some(0.886));
        let lost = "--- 10.1.0.2 ping statistics ---\n\
                    3 packets transmitted, 0 received, 100% packet loss, time 2061ms\n";
        let s = PingStats::parse(lost).unwrap();
        assert_eq!((s.transmitted, s.received, s.rtt_avg_ms), (3, 0, None));
        let errs = "12 packets transmitted, 4 received, +8 errors, 66.6667% packet loss\n";
        assert_eq!(PingStats::parse(errs).unwrap().received, 4);
        assert_eq!(
            PingStats::parse("ping: connect: Network is unreachable\n"),
            None
        );
    }

    #[test]
    fn throughput_in_megabits() {
        let t = Throughput {
            bytes: 12_500_000,
            seconds: 2.0,
        };
        assert!((t.mbit_per_s() - 50.0).abs() < 1e-9);
        assert_eq!(
            Throughput {
                bytes: 1,
                seconds: 0.0
            }
            .mbit_per_s(),
            0.0
        );
    }
}
