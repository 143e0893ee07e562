//! Shared helpers of the runtime's kernel tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr, UdpSocket};

use testbed::netns::Netns;
use xfrm::XfrmHandle;

/// A fresh network namespace (cleaned up on drop) and an XFRM socket in it.
pub fn netns(prefix: &str) -> (Netns, XfrmHandle) {
    for p in ["ip", "nsenter", "sh", "mount", "sleep"] {
        testbed::require_program(p).unwrap();
    }
    let ns = Netns::create(prefix).unwrap();
    let handle = XfrmHandle::in_netns(ns.name()).unwrap();
    (ns, handle)
}

/// `ip -n <ns> xfrm <args>`.
pub fn ip_xfrm(ns: &Netns, args: &str) -> String {
    let args: Vec<&str> = std::iter::once("xfrm")
        .chain(args.split_whitespace())
        .collect();
    ns.ip(&args)
        .unwrap_or_else(|e| panic!("ip xfrm {args:?}: {e}"))
}

/// The `ip xfrm policy list` stanzas, minus the two guards of `mark`.
pub fn foreign_policy_dump(ns: &Netns, mark: u32) -> Vec<String> {
    let text = ip_xfrm(ns, "policy list");
    let mut stanzas: Vec<String> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) || stanzas.is_empty() {
            stanzas.push(String::new());
        }
        if let Some(last) = stanzas.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    let guard_mark = format!("mark 0x{mark:x}/0xffffffff");
    stanzas
        .into_iter()
        .filter(|s| {
            !(s.contains(&guard_mark)
                && s.contains("action block")
                && s.contains("priority 2147483647")
                && (s.starts_with("src 0.0.0.0/0 dst 0.0.0.0/0")
                    || s.starts_with("src ::/0 dst ::/0")))
        })
        .collect()
}

/// Number of guard stanzas of `mark` in `ip xfrm policy list`.
pub fn guard_count(ns: &Netns, mark: u32) -> usize {
    let all = ip_xfrm(ns, "policy list");
    let foreign = foreign_policy_dump(ns, mark);
    let total = all
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .count();
    total - foreign.len()
}

/// Gives the namespace addresses to send from: a veth pair inside it with
/// 10.98.0.1/24 and fd98::1/64 (no DAD, so IPv6 is usable at once).
pub fn addresses(ns: &Netns) {
    ns.ip(["link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        .unwrap();
    ns.ip(["addr", "add", "10.98.0.1/24", "dev", "v0"]).unwrap();
    ns.ip(["-6", "addr", "add", "fd98::1/64", "dev", "v0", "nodad"])
        .unwrap();
    for l in ["v0", "v1", "lo"] {
        ns.ip(["link", "set", l, "up"]).unwrap();
    }
}

/// Sends one UDP datagram to `dst:port` from inside `ns` (a thread that
/// entered the namespace), with `SO_MARK = mark` when given. Returns the
/// `sendto` result.
pub fn send_udp(ns: &Netns, dst: IpAddr, port: u16, mark: Option<u32>) -> std::io::Result<usize> {
    let path = std::path::Path::new("/run/netns").join(ns.name());
    std::thread::spawn(move || {
        let f = std::fs::File::open(path)?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)?;
        let bind: SocketAddr = if dst.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let sock = UdpSocket::bind(bind)?;
        if let Some(m) = mark {
            nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::Mark, &m)?;
        }
        sock.send_to(b"koi", SocketAddr::new(dst, port))
    })
    .join()
    .unwrap()
}
