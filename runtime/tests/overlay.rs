//! The encrypted overlay, end to end, on a full kernel (ESP, GENEVE, the
//! OVS kernel datapath): two simulated nodes, each with ovsdb-server and
//! ovs-vswitchd on the kernel datapath, `br-int` with a pod port, and
//! ovn-controller (emulated, or the patched binary
//! `KUBE_OVN_IPSEC_OVN_CONTROLLER` names) building a Geneve tunnel to the
//! other from OVN SB, IPsec switched through NB; the agent's lease and
//! guards armed and published before IKE starts, strongSwan and the
//! image's patched ovs-monitor-ipsec run by the runtime's own runners,
//! identities from the test CA. A tcpdump on node A's underlay link is
//! the judge of what the wire carries.
//!
//! 1. Without IPsec intent (no `remote_name`, no marks) pod traffic is
//!    plaintext Geneve and the armed guards drop none of it; plain underlay
//!    traffic passes too.
//! 2. With intent as ovn-controller gives it (IPsec on in NB), pod traffic
//!    flows, both nodes' SAs carry it, and the underlay sees ESP and no
//!    plaintext UDP 6081.
//! 3. The IKE daemon SIGKILLed under load: no plaintext Geneve while it is
//!    down; traffic flows encrypted once it is back.
//! 4. The IKE daemon stopped (it removes its policies and SAs, as any
//!    restart of it does): the guards drop the marked packets
//!    (`XfrmOutPolBlock` grows), the underlay sees no plaintext Geneve, and
//!    traffic resumes encrypted once the daemon is back.
//! 5. Disable with crash orphans (SPEC §8 "Drain", §10): foreign policies
//!    and ESP states installed before any intent (marks differing only
//!    under their masks, a reqid neighbour) stay; the IKE daemons are
//!    SIGKILLed, so their SAs and policies stay in the kernel; intent is
//!    removed as after the NB flip; cleanup's drain removes exactly the
//!    lease's SAs and policies (each node's XFRM dump is then byte-identical
//!    to the one taken before any intent), the guards are withdrawn, and pod
//!    traffic flows again in plaintext (UDP 6081 on the wire, no ESP).
//!
//! On a kernel without those features this prints SKIPPED and returns;
//! scripts/kernel-tests.sh runs it on a full kernel, where SKIPPED fails.

// Tests and benches fail loudly on any unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::ike_node;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use ike_node::{
    Node, Overlay, POD_B, guards_present, guards_through, overlay_pair, start_ike,
    wait_for_pod_reply,
};
use kube_ovn_ipsec_runtime::monitor_patch;
use kube_ovn_ipsec_runtime::sa::{self, TunnelEndpoints};
use nix::sys::signal::Signal;
use testbed::guest::HostFeatures;
use testbed::netns::wait_for;
use testbed::overlay::{self, Capture, CaptureSummary, Pinger};
use xfrm::Xfrm;
use xfrm::stat::{OUT_POL_BLOCK, XfrmStats};

const PING_INTERVAL: Duration = Duration::from_millis(200);

/// `(spi, bytes)` of every SA attributed to `n`'s lease.
fn lease_sas(n: &mut Node, peer_ip: Ipv4Addr) -> Vec<(u32, u64)> {
    let states = n.keeper.xfrm().dump_states().unwrap();
    let policies = n.keeper.xfrm().dump_policies().unwrap();
    let t = [TunnelEndpoints {
        local: n.node.ip().into(),
        remote: peer_ip.into(),
    }];
    let at = sa::attribute(&n.lease, &states, &policies, &t);
    states
        .iter()
        .filter(|s| at.sas.iter().any(|o| o.spi == format!("{:08x}", s.spi)))
        .map(|s| (s.spi, s.bytes))
        .collect()
}

fn stats(n: &Node) -> XfrmStats {
    overlay::xfrm_stats(n.node.netns()).unwrap()
}

fn capture(n: &Node, name: &str) -> Capture {
    Capture::start(n.node.netns(), "eth0", &n.node.dir().join(name)).unwrap()
}

fn assert_no_plaintext(what: &str, c: &CaptureSummary) {
    assert_eq!(
        c.dropped_by_kernel, 0,
        "{what}: the capture missed packets: {c:?}"
    );
    assert_eq!(
        c.geneve, 0,
        "{what}: plaintext Geneve on the underlay: {c:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_overlay_end_to_end() {
    let features = HostFeatures::probe();
    if !features.complete() {
        println!(
            "SKIPPED: the encrypted overlay end to end: this kernel lacks {features:?}; \
             scripts/kernel-tests.sh runs it on a full kernel"
        );
        return;
    }
    for p in [
        "ipsec",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ovs-vswitchd",
        "ovs-appctl",
        "tcpdump",
        "ping",
        "patch",
        "nsenter",
        "ip",
    ] {
        testbed::require_program(p).unwrap();
    }
    let t0 = Instant::now();
    let script =
        testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap();
    assert!(
        !monitor_patch::inspect(script)
            .unwrap()
            .needs_ca_workaround()
    );
    let Overlay {
        ovn,
        mut a,
        mut b,
        ca: _ca,
    } = overlay_pair("koi-ovl", "kube-ovn-ipsec overlay test CA", script).await;
    println!(
        "two nodes up (ovsdb, vswitchd, guards, IKE, monitor) after {:?}",
        t0.elapsed()
    );

    // Foreign state that every step must leave alone, then the dump the
    // disable must come back to.
    install_foreign(&a, &b);
    install_foreign(&b, &a);
    let baseline = [xfrm_dump(&a), xfrm_dump(&b)];

    // 1. No IPsec intent: plaintext, unmarked, untouched by the guards.
    guards_present(&mut a);
    guards_present(&mut b);
    let learned = wait_for_pod_reply(&a, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no plaintext pod reply:\n{}", a.node.diagnostics()));
    println!("[plain] first pod reply after {learned:?}");
    let before = stats(&a);
    let cap = capture(&a, "plain.pcap");
    let pods = overlay::ping(a.node.netns(), POD_B, 10, PING_INTERVAL).unwrap();
    let underlay = overlay::ping(a.node.netns(), b.node.ip(), 3, PING_INTERVAL).unwrap();
    let seen = cap.stop().unwrap();
    let grew = stats(&a).growth_since(&before);
    println!("[plain] pods {pods:?}, underlay {underlay:?}, wire {seen:?}, xfrm {grew:?}");
    assert!(pods.received >= 9, "plaintext pod traffic lost: {pods:?}");
    assert_eq!(
        underlay.received, 3,
        "unmarked underlay traffic lost: {underlay:?}"
    );
    assert!(seen.geneve > 0 && seen.esp == 0, "{seen:?}");
    assert!(
        !grew.contains_key(OUT_POL_BLOCK),
        "guards dropped unmarked traffic: {grew:?}"
    );

    // 2. IPsec on: ovn-controller gives both tunnels intent with the
    //    lease.
    ovn.enable(&a, &b);
    for n in [&a, &b] {
        wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
            (n.node.routed_conns().ok()?.len() >= 2).then_some(())
        })
        .unwrap_or_else(|| panic!("conns not routed:\n{}", n.node.diagnostics()));
    }
    println!("[esp] both nodes routed after {:?}", t0.elapsed());
    let first = wait_for_pod_reply(&a, Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "no encrypted pod reply:\n{}\n{}",
            a.node.diagnostics(),
            b.node.diagnostics()
        )
    });
    println!("[esp] first pod reply through ESP after {first:?}");
    let (ip_a, ip_b) = (a.node.ip(), b.node.ip());
    let (sas_a, sas_b) = (lease_sas(&mut a, ip_b), lease_sas(&mut b, ip_a));
    let before = stats(&a);
    let cap = capture(&a, "esp.pcap");
    let pods = overlay::ping(a.node.netns(), POD_B, 10, PING_INTERVAL).unwrap();
    let underlay = overlay::ping(a.node.netns(), b.node.ip(), 3, PING_INTERVAL).unwrap();
    let seen = cap.stop().unwrap();
    let grew = stats(&a).growth_since(&before);
    let (after_a, after_b) = (lease_sas(&mut a, ip_b), lease_sas(&mut b, ip_a));
    println!(
        "[esp] pods {pods:?}, underlay {underlay:?}, wire {seen:?}, xfrm {grew:?}\n\
         [esp] SAs of A {sas_a:?} -> {after_a:?}; of B {sas_b:?} -> {after_b:?}"
    );
    assert!(pods.received >= 9, "encrypted pod traffic lost: {pods:?}");
    assert_eq!(
        underlay.received, 3,
        "unmarked underlay traffic lost: {underlay:?}"
    );
    assert_no_plaintext("encrypted", &seen);
    // Every answered echo crossed the wire twice, as ESP.
    assert!(seen.esp >= 2 * pods.received as usize, "{seen:?}");
    for (node, before, after) in [("A", &sas_a, &after_a), ("B", &sas_b, &after_b)] {
        assert!(
            after.len() >= 2,
            "{node}: fewer than two lease SAs: {after:?}"
        );
        let grown = after
            .iter()
            .filter(|(spi, bytes)| {
                before
                    .iter()
                    .find(|(s, _)| s == spi)
                    .is_none_or(|(_, b)| bytes > b)
            })
            .count();
        assert!(
            grown >= 2,
            "{node}: SA byte counters did not grow: {before:?} -> {after:?}"
        );
    }

    // 3. The IKE daemon SIGKILLed while pod traffic runs.
    let before = stats(&a);
    let cap = capture(&a, "kill.pcap");
    let pinger = Pinger::start(a.node.netns(), POD_B, Duration::from_millis(100)).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ike = a.ike.as_mut().unwrap();
    ike.process().signal(Signal::SIGKILL);
    let status = ike.process().exited().await.unwrap();
    let dumps = guards_through(&mut a, Duration::from_secs(2)).await;
    let during = stats(&a).growth_since(&before);
    println!(
        "[kill] IKE daemon {status}; guards in {dumps} dumps; xfrm during the outage {during:?}"
    );
    a.ike = None;
    start_ike(&mut a);
    let back = wait_for_pod_reply(&a, Duration::from_secs(60));
    let pinged = pinger.stop().unwrap();
    let seen = cap.stop().unwrap();
    println!(
        "[kill] daemon back, pod reply {back:?}; pings {pinged:?}; wire {seen:?}; xfrm {:?}",
        stats(&a).growth_since(&before)
    );
    assert!(
        back.is_some(),
        "no pod traffic after the restart:\n{}",
        a.node.diagnostics()
    );
    assert_no_plaintext("IKE daemon killed", &seen);
    guards_present(&mut a);

    // 4. The IKE daemon stopped: its policies and SAs go with it.
    let before = stats(&a);
    let cap = capture(&a, "stop.pcap");
    a.ike.as_mut().unwrap().stop().await.unwrap();
    a.ike = None;
    let outage = overlay::ping(a.node.netns(), POD_B, 10, PING_INTERVAL).unwrap();
    let during = stats(&a).growth_since(&before);
    guards_present(&mut a);
    println!("[stop] pings while stopped {outage:?}; xfrm {during:?}");
    start_ike(&mut a);
    let back = wait_for_pod_reply(&a, Duration::from_secs(60));
    let resumed = overlay::ping(a.node.netns(), POD_B, 5, PING_INTERVAL).unwrap();
    let seen = cap.stop().unwrap();
    println!("[stop] daemon back, pod reply {back:?}, then {resumed:?}; wire {seen:?}");
    assert!(
        during.get(OUT_POL_BLOCK).copied().unwrap_or(0) >= u64::from(outage.transmitted / 2),
        "the guards did not drop the marked packets: {during:?}"
    );
    assert!(outage.received < outage.transmitted, "{outage:?}");
    assert!(
        back.is_some(),
        "no pod traffic after the restart:\n{}",
        a.node.diagnostics()
    );
    assert!(resumed.received >= 4, "{resumed:?}");
    assert_no_plaintext("IKE daemon stopped", &seen);
    assert!(seen.esp > 0, "{seen:?}");

    // 5. Disable with crash orphans.
    for n in [&mut a, &mut b] {
        if let Some(m) = n.monitor.as_mut() {
            m.stop().await.unwrap();
        }
        n.monitor = None;
        let ike = n.ike.as_mut().unwrap();
        ike.process().signal(Signal::SIGKILL);
        ike.process().exited().await.unwrap();
        n.ike = None;
    }
    let orphans = |n: &mut Node| {
        let states = n.keeper.xfrm().dump_states().unwrap();
        states.iter().filter(|s| s.reqid == n.lease.reqid).count()
    };
    let (oa, ob) = (orphans(&mut a), orphans(&mut b));
    println!("[disable] SAs left by the killed daemons: A {oa}, B {ob}");
    assert!(oa >= 2 && ob >= 2, "no crash orphans to drain: {oa}, {ob}");
    // The NB flip, as ovn-controller carries it out: intent and marks go
    // together.
    ovn.disable(&a, &b);
    let (ip_a, ip_b) = (a.node.ip(), b.node.ip());
    for (n, peer, base) in [(&mut a, ip_b, &baseline[0]), (&mut b, ip_a, &baseline[1])] {
        let tunnels = [TunnelEndpoints {
            local: n.node.ip().into(),
            remote: peer.into(),
        }];
        let lease = n.lease.clone();
        let (states, policies) =
            kube_ovn_ipsec_runtime::cleanup::drain(n.keeper.xfrm(), &lease, &tunnels).unwrap();
        println!(
            "[disable] {}: drained {states} SAs and {policies} policies",
            n.node.chassis()
        );
        assert!(
            states >= 2 && policies >= 2,
            "{states} SAs, {policies} policies"
        );
        assert_eq!(
            &xfrm_dump(n),
            base,
            "{}: after the drain the dump differs from the one before any intent",
            n.node.chassis()
        );
        let w = n.keeper.withdraw(&lease).unwrap();
        assert_eq!(w.removed.len(), 2, "{w:?}");
        assert!(w.refused.is_empty(), "{w:?}");
        assert_eq!(
            xfrm_dump(n),
            without_guards(base, lease.mark),
            "{}: after the withdrawal only the guards may be gone",
            n.node.chassis()
        );
    }
    let cap = capture(&a, "disabled.pcap");
    let plain = overlay::ping(a.node.netns(), POD_B, 10, PING_INTERVAL).unwrap();
    let seen = cap.stop().unwrap();
    println!("[disable] pings after cleanup {plain:?}; wire {seen:?}");
    assert!(plain.received >= 9, "{plain:?}\n{}", a.node.diagnostics());
    assert!(
        seen.geneve > 0,
        "no plaintext Geneve after the disable: {seen:?}"
    );
    assert_eq!(seen.esp, 0, "ESP after the disable: {seen:?}");
    println!("total {:?}", t0.elapsed());
}

/// `ip xfrm policy list` and `ip xfrm state list` of `n`, verbatim.
fn xfrm_dump(n: &Node) -> String {
    let ns = n.node.netns();
    let p = ns.ip(["xfrm", "policy", "list"]).unwrap();
    let s = ns.ip(["xfrm", "state", "list"]).unwrap();
    format!("{p}\n--- states ---\n{s}")
}

/// `dump` without the stanzas of the two guards of `mark`.
fn without_guards(dump: &str, mark: u32) -> String {
    let guard = format!("mark {mark:#x}/0xffffffff");
    let mut out = String::new();
    let mut stanza = String::new();
    let flush = |stanza: &mut String, out: &mut String| {
        if !(stanza.contains(&guard) && stanza.contains("action block")) {
            out.push_str(stanza);
        }
        stanza.clear();
    };
    for line in dump.split_inclusive('\n') {
        // A stanza starts at an unindented line; a blank line stands alone.
        if !line.starts_with(char::is_whitespace) || line.trim().is_empty() {
            flush(&mut stanza, &mut out);
        }
        stanza.push_str(line);
    }
    flush(&mut stanza, &mut out);
    out
}

/// Foreign policies and ESP states in `n`'s namespace, none of them this
/// project's: the guards' priority and selector with marks that differ
/// from the lease's only under their masks, and an SA and a policy on the
/// tunnel's own addresses with a reqid neighbour of the lease's.
fn install_foreign(n: &Node, peer: &Node) {
    let (me, other) = (n.node.ip(), peer.node.ip());
    let mark = n.lease.mark;
    let reqid = n.lease.reqid.wrapping_add(1).max(1);
    let run = |args: String| {
        let args: Vec<&str> = args.split_whitespace().collect();
        n.node
            .netns()
            .ip(&args)
            .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    };
    run(format!(
        "xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark {:#x} mask 0xffff0000",
        (mark & 0xffff_0000) ^ 0x0001_0000
    ));
    run(format!(
        "xfrm policy add dir out src 10.97.0.1/32 dst 10.97.0.2/32 priority 100 mark {:#x} mask 0xffffffff tmpl src 10.97.0.1 dst 10.97.0.2 proto esp reqid {reqid} mode transport",
        mark ^ 1
    ));
    run(format!(
        "xfrm state add src {me} dst {other} proto esp spi 0x5eed0001 reqid {reqid} mode transport mark {:#x} mask 0xffffffff aead rfc4106(gcm(aes)) 0x0102030405060708091011121314151617181920 128",
        mark ^ 1
    ));
    run(format!(
        "xfrm state add src {me} dst {other} proto esp spi 0x5eed0002 reqid {reqid} mode transport aead rfc4106(gcm(aes)) 0x0102030405060708091011121314151617181920 128"
    ));
}
