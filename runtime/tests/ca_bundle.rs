//! A CA rotation's trust bundle `[old, new]` on two simulated nodes with
//! real strongSwan (starter + charon) and the patched ovs-monitor-ipsec:
//! node A's leaf comes from the old CA, node B's from the new one, both
//! nodes trust the bundle.
//!
//! - the defect: strongSwan loads only the FIRST certificate of a PEM file,
//!   in `/etc/ipsec.d/cacerts` and in the monitor's `cacert=` alike. With
//!   the bundle as one file charon trusts only the old CA, B's leaf fails
//!   authentication at A whoever initiates, and the acknowledgement says so;
//! - the fix: the agent's own path (`IkeAdapter::install_trust`, which the
//!   monitor actor runs before each read-back) installs one file per CA;
//!   both CAs are loaded, the IKE_SA comes up
//!   initiated from A and from B, the acknowledgement holds; retiring the
//!   old CA removes only the agent's file of it.
//!
//! The kernel here has no ESP, so CHILD_SAs fail; only IKE_SAs are asserted.

// Helpers of this test binary panic on failure just like the #[test]s do.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Against real daemons in real time: deadlines and sleeps are wall-clock.
#![allow(clippy::disallowed_methods)]

use harness::ike_node;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use actors::ports::{IkePort, MonitorPort, OvsdbIdentityKeys, RunningMonitor};
use ike_node::{Node, Outcome, ike_config, initiate, setup, start_ike, tear_down};
use kube_ovn_ipsec_api::strongswan::{LoadedCert, parse_listcerts};
use kube_ovn_ipsec_runtime::agent::ports::{IkeAdapter, MonitorAdapter};
use kube_ovn_ipsec_runtime::ike::{self, CA_FILE_PREFIX, LEGACY_TRUST_FILE};
use kube_ovn_ipsec_runtime::monitor::{self, ActiveIdentity, MonitorConfig, normalize_serial};
use kube_ovn_ipsec_runtime::monitor_patch::{self, MonitorPatch};
use testbed::ipsec::{CaFiles, DEBIAN_MONITOR_SCRIPT, Tunnel, write_trust_bundle};
use testbed::netns::wait_for;

fn require_programs() {
    for p in [
        "ipsec",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ovs-appctl",
        "patch",
        "nsenter",
        "ip",
    ] {
        testbed::require_program(p).unwrap();
    }
    assert!(
        Path::new(DEBIAN_MONITOR_SCRIPT).exists(),
        "ovs-monitor-ipsec missing: install openvswitch-ipsec"
    );
}

fn patched_script() -> &'static Path {
    testbed::ipsec::patched_monitor_script(Path::new(env!("CARGO_TARGET_TMPDIR"))).unwrap()
}

/// Two CAs, the rotation's bundle `[old, new]` as one file, and two nodes:
/// A with a leaf from `old`, B with a leaf from `new`, both with
/// `other_config:ca_cert` naming the bundle, and the IKE daemon running.
struct Rotation {
    old: CaFiles,
    new: CaFiles,
    bundle: PathBuf,
    a: Node,
    b: Node,
    _files: tempfile::TempDir,
}

async fn rotation(prefix: &str) -> Rotation {
    require_programs();
    let old = CaFiles::create("kube-ovn-ipsec old CA").unwrap();
    let new = CaFiles::create("kube-ovn-ipsec new CA").unwrap();
    let files = tempfile::tempdir().unwrap();
    let bundle = files.path().join("ca.pem");
    write_trust_bundle(&bundle, &[&old, &new]).unwrap();
    let (a, b) = testbed::ipsec::IpsecNode::pair(prefix, "chass-a", "chass-b").unwrap();
    let mut a = setup(a, &old).await;
    let mut b = setup(b, &new).await;
    for n in [&mut a, &mut b] {
        set_ca_cert(n, &bundle);
        start_ike(n);
    }
    Rotation {
        old,
        new,
        bundle,
        a,
        b,
        _files: files,
    }
}

fn set_ca_cert(n: &Node, path: &Path) {
    n.node
        .vsctl(&[
            "set",
            "Open_vSwitch",
            ".",
            &format!("other_config:ca_cert={}", path.display()),
        ])
        .unwrap();
}

/// The agent's monitor port for `n`, as `agent::run` builds it.
fn adapter(n: &Node, script: &Path) -> MonitorAdapter {
    MonitorAdapter {
        config: MonitorConfig {
            python: Some(testbed::ipsec::SYSTEM_PYTHON.into()),
            script: script.into(),
            log_file: Some("/run/ovs-monitor-ipsec.log".into()),
            output_file: Some(n.node.dir().join("ovs-monitor-ipsec.out")),
            stop_grace: Duration::from_secs(3),
            ..MonitorConfig::default()
        },
        ike: ike_config(&n.node),
        launcher: n.launcher.clone(),
        patch: monitor_patch::inspect(script).unwrap(),
    }
}

/// The agent's IKE port for `n` (only its trust install is used here).
fn ike_adapter(n: &Node) -> IkeAdapter {
    IkeAdapter {
        config: ike_config(&n.node),
        launcher: n.launcher.clone(),
        stale_pidfiles: Vec::new(),
    }
}

/// What the monitor actor does before a read-back: the trust bundle `k`
/// names installed for the IKE daemon, one file per CA, and reread.
async fn install_trust(n: &Node, k: &OvsdbIdentityKeys) {
    ike_adapter(n).install_trust(k, None).await.unwrap();
}

async fn start_monitor(n: &Node, script: &Path) -> Box<dyn RunningMonitor> {
    let mut m = adapter(n, script).start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while m.probe().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "monitor not answering:\n{}",
            n.node.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    m
}

fn keys(n: &Node, ca: &Path) -> OvsdbIdentityKeys {
    OvsdbIdentityKeys {
        private_key: Some(n.cert.key.display().to_string()),
        certificate: Some(n.cert.cert.display().to_string()),
        ca_cert: Some(ca.display().to_string()),
    }
}

fn cacerts(n: &Node) -> Vec<LoadedCert> {
    parse_listcerts(&n.node.ipsec(&["listcacerts"]).unwrap())
}

fn serial_of(ca: &CaFiles) -> String {
    let (_, c) = x509_parser::parse_x509_certificate(ca.ca().cert_der()).unwrap();
    normalize_serial(
        &c.raw_serial()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

fn count_loaded(loaded: &[LoadedCert], ca: &CaFiles) -> usize {
    let s = serial_of(ca);
    loaded
        .iter()
        .filter(|c| normalize_serial(&c.serial) == s)
        .count()
}

fn own_files(n: &Node) -> Vec<String> {
    n.node
        .cacerts_files()
        .unwrap()
        .into_iter()
        .filter(|f| f.starts_with(CA_FILE_PREFIX))
        .collect()
}

/// The tunnels A ↔ B with each node's lease mark and reqid; waits until
/// starter has routed both conns of each.
fn connect(r: &Rotation) {
    for (n, peer) in [(&r.a, &r.b), (&r.b, &r.a)] {
        n.node
            .add_tunnel(&Tunnel {
                mark: n.lease.mark,
                reqid: n.lease.reqid,
                ..Tunnel::to(&peer.node, 0)
            })
            .unwrap();
    }
    for (n, peer) in [(&r.a, &r.b), (&r.b, &r.a)] {
        let name = Tunnel::to(&peer.node, 0).name;
        wait_for(Duration::from_secs(15), Duration::from_millis(50), || {
            let routed = n.node.routed_conns().ok()?;
            (routed.iter().filter(|c| c.starts_with(&name)).count() >= 2).then_some(())
        })
        .unwrap_or_else(|| panic!("conns of {name} not routed:\n{}", n.node.diagnostics()));
    }
}

/// Installs the trust bundle, then acknowledges through the agent's port
/// until applied (the monitor applies a changed `other_config` on its next
/// refresh).
async fn acknowledged(
    n: &Node,
    m: &mut Box<dyn RunningMonitor>,
    k: &OvsdbIdentityKeys,
) -> (actors::ports::Acknowledgement, Duration) {
    let t0 = Instant::now();
    install_trust(n, k).await;
    loop {
        let ack = m.acknowledge(k).await.unwrap();
        if ack.configuration_applied || t0.elapsed() > Duration::from_secs(10) {
            return (ack, t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The defect, on the production (patched) monitor: the bundle as one file
/// — the monitor's `cacert=` and the one-file copy earlier agents wrote —
/// loads only the old CA; B's leaf from the new CA fails authentication
/// at A, whoever initiates; the acknowledgement refuses. Then the agent's
/// install fixes the same nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_file_bundle_trusts_only_its_first_ca_and_the_second_cas_peer_fails() {
    let t0 = Instant::now();
    let script = patched_script();
    assert_eq!(
        monitor_patch::inspect(script).unwrap(),
        MonitorPatch::Patched {
            version: monitor_patch::CURRENT_PATCH_VERSION
        }
    );
    let mut r = rotation("koi-cab1").await;
    // What the agent did before: the bundle as one file, then a reread.
    for n in [&r.a, &r.b] {
        let dst = ike_config(&n.node).cacerts_dir.join(LEGACY_TRUST_FILE);
        std::fs::copy(&r.bundle, &dst).unwrap();
        n.node.ipsec(&["rereadcacerts"]).unwrap();
    }
    // Monitors started directly (not through the agent's port, which would
    // install the CA files).
    for n in [&mut r.a, &mut r.b] {
        ike_node::start_monitor(n, script).await;
    }
    connect(&r);
    println!("two nodes up and routed after {:?}", t0.elapsed());

    let loaded = cacerts(&r.a);
    println!("listcacerts with the one-file bundle: {loaded:?}");
    assert!(count_loaded(&loaded, &r.old) >= 1, "{loaded:?}");
    assert_eq!(
        count_loaded(&loaded, &r.new),
        0,
        "strongSwan loaded the second CA of a one-file bundle: the defect appears FIXED \
         upstream; one file per CA is still correct, but revisit this test\n{loaded:?}"
    );
    let active = ActiveIdentity::load(&r.a.cert.cert, &r.bundle).unwrap();
    assert_eq!(
        active.ca_serials,
        vec![serial_of(&r.old), serial_of(&r.new)]
    );
    let tunnels = r.a.monitor.as_ref().unwrap().tunnels().await.unwrap();
    let certs = parse_listcerts(&r.a.node.ipsec(&["listcerts"]).unwrap());
    let ack = monitor::acknowledge(&active, &tunnels, &certs, &loaded, &monitor::digest_file);
    println!("acknowledgement with the one-file bundle: {ack:?}");
    assert!(!ack.configuration_applied, "{ack:?}");
    let missing = format!("IKE daemon has not loaded CA serial {}", serial_of(&r.new));
    assert!(ack.mismatches.contains(&missing), "{ack:?}");

    for (from, to, who) in [(&r.a, &r.b, "A→B"), (&r.b, &r.a, "B→A")] {
        let (outcome, waited) = initiate(&from.node, from.lease.mark, &to.node);
        let Some(Outcome::AuthFailed(line)) = outcome else {
            panic!(
                "{who}: expected an authentication failure, got {outcome:?}\n{}\n{}",
                from.node.diagnostics(),
                to.node.diagnostics()
            )
        };
        println!("one-file bundle, {who}: authentication failed after {waited:?}: {line}");
        tear_down(&from.node, &to.node);
    }
    // A (trusting only the old CA) is where B's leaf is rejected.
    let a_log = r.a.node.charon_log();
    assert!(
        a_log.contains("no trusted RSA public key found for 'chass-b'"),
        "{a_log}"
    );
    assert!(
        !r.b.node
            .charon_log()
            .contains("no trusted RSA public key found for 'chass-a'"),
        "B trusts the old CA (first in the file): A's leaf must verify there"
    );

    // The fix on the same nodes: the agent's install, one file per CA
    // (the earlier one-file copy is the agent's own and goes).
    for n in [&r.a, &r.b] {
        let got = ike::install_trust_bundle(
            &ike_config(&n.node).cacerts_dir,
            &ike::read_trust_bundle(&r.bundle).unwrap(),
        )
        .unwrap();
        assert_eq!(got.files.len(), 2, "{got:?}");
        n.node.ipsec(&["rereadcacerts"]).unwrap();
        assert!(
            !n.node
                .cacerts_files()
                .unwrap()
                .contains(&LEGACY_TRUST_FILE.to_string())
        );
    }
    tear_down(&r.a.node, &r.b.node);
    let (outcome, waited) = initiate(&r.a.node, r.a.lease.mark, &r.b.node);
    let Some(Outcome::Established(sa)) = outcome else {
        panic!(
            "after the agent's install: {outcome:?}\n{}\n{}",
            r.a.node.diagnostics(),
            r.b.node.diagnostics()
        )
    };
    println!("after the agent's install, A→B: IKE_SA {sa:?} ESTABLISHED after {waited:?}");
    println!("total {:?}", t0.elapsed());
}

/// The fix through the agent's own path: the IKE port's trust install,
/// then `MonitorAdapter`'s acknowledgement; the bundle goes one file per CA
/// (patched monitor too); both CAs are
/// loaded, IKE_SAs come up initiated from A and from B, and retiring the
/// old CA removes only the agent's file of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_bundle_is_installed_per_ca_and_peers_of_both_cas_authenticate() {
    let t0 = Instant::now();
    let script = patched_script();
    let r = rotation("koi-cab2").await;
    // A file that is not the agent's: it must survive every install.
    let operator = CaFiles::create("operator's own CA").unwrap();
    let operator_file = ike_config(&r.a.node).cacerts_dir.join("operator-root.pem");
    std::fs::copy(&operator.cert, &operator_file).unwrap();
    r.a.node.ipsec(&["rereadcacerts"]).unwrap();

    let mut ma = start_monitor(&r.a, script).await;
    let mut mb = start_monitor(&r.b, script).await;
    println!(
        "two nodes up (agent's monitor port) after {:?}",
        t0.elapsed()
    );

    // Before the agent's install, the monitor's own `cacert=` (the bundle
    // as one file) gives at most the old CA: no acknowledgement.
    let before = cacerts(&r.a);
    println!("listcacerts before the install: {before:?}");
    assert_eq!(count_loaded(&before, &r.new), 0, "{before:?}");
    let active = ActiveIdentity::load(&r.a.cert.cert, &r.bundle).unwrap();
    let ack = monitor::acknowledge(&active, &[], &[], &before, &monitor::digest_file);
    assert!(!ack.configuration_applied, "{ack:?}");

    // The agent's path: install and reread (IKE port), then check.
    for (n, m) in [(&r.a, &mut ma), (&r.b, &mut mb)] {
        let t = Instant::now();
        install_trust(n, &keys(n, &r.bundle)).await;
        let ack = m.acknowledge(&keys(n, &r.bundle)).await.unwrap();
        println!(
            "{}: install + rereadcacerts + acknowledgement {:?}: {ack:?}",
            n.node.chassis(),
            t.elapsed()
        );
        assert!(ack.configuration_applied, "{ack:?}");
        let loaded = cacerts(n);
        assert_eq!(count_loaded(&loaded, &r.old), 1, "{loaded:?}");
        assert_eq!(count_loaded(&loaded, &r.new), 1, "{loaded:?}");
        let mut want = vec![
            format!(
                "{CA_FILE_PREFIX}{}.pem",
                &r.old.ca().certificate.digest().to_hex()[..16]
            ),
            format!(
                "{CA_FILE_PREFIX}{}.pem",
                &r.new.ca().certificate.digest().to_hex()[..16]
            ),
        ];
        want.sort();
        assert_eq!(own_files(n), want);
    }
    assert!(operator_file.exists());
    assert_eq!(count_loaded(&cacerts(&r.a), &operator), 1);

    connect(&r);
    // With tunnels: paths, digests, leaf and every CA.
    let (ack, waited) = acknowledged(&r.a, &mut ma, &keys(&r.a, &r.bundle)).await;
    println!("A acknowledged with its tunnel after {waited:?}: {ack:?}");
    assert!(ack.configuration_applied, "{ack:?}");
    // The monitor's `cacert=` loads the bundle's first CA once more:
    // charon keeps one copy.
    let loaded = cacerts(&r.a);
    println!(
        "listcacerts with the monitor's ca section and the agent's files: old {} new {} (all: {loaded:?})",
        count_loaded(&loaded, &r.old),
        count_loaded(&loaded, &r.new)
    );
    assert_eq!(count_loaded(&loaded, &r.old), 1, "{loaded:?}");
    assert_eq!(count_loaded(&loaded, &r.new), 1, "{loaded:?}");

    for (from, to, who) in [(&r.a, &r.b, "A→B"), (&r.b, &r.a, "B→A")] {
        let (outcome, waited) = initiate(&from.node, from.lease.mark, &to.node);
        let Some(Outcome::Established(sa)) = outcome else {
            panic!(
                "{who}: {outcome:?}\n{}\n{}",
                from.node.diagnostics(),
                to.node.diagnostics()
            )
        };
        println!("rotation bundle, {who}: IKE_SA {sa:?} ESTABLISHED after {waited:?}");
        let initiated = from.node.charon_log().contains(&format!(
            "initiating IKE_SA {}",
            Tunnel::to(&to.node, 0).name
        ));
        assert!(initiated, "{who}: {} did not initiate", from.node.chassis());
        tear_down(&from.node, &to.node);
    }

    // Retirement on A: bundle [new] only; the old CA's file goes, the
    // operator's stays.
    let retired = r.a.node.dir().join("ca-retired.pem");
    write_trust_bundle(&retired, &[&r.new]).unwrap();
    set_ca_cert(&r.a, &retired);
    let (ack, waited) = acknowledged(&r.a, &mut ma, &keys(&r.a, &retired)).await;
    println!("A acknowledged the retirement after {waited:?}: {ack:?}");
    assert!(ack.configuration_applied, "{ack:?}");
    assert_eq!(
        own_files(&r.a),
        vec![format!(
            "{CA_FILE_PREFIX}{}.pem",
            &r.new.ca().certificate.digest().to_hex()[..16]
        )]
    );
    assert!(operator_file.exists());
    let loaded = cacerts(&r.a);
    println!(
        "listcacerts after the retirement and rereadcacerts: old {} new {} operator {}",
        count_loaded(&loaded, &r.old),
        count_loaded(&loaded, &r.new),
        count_loaded(&loaded, &operator)
    );
    // rereadcacerts drops a CA whose file is gone (measured): a retired CA
    // stops being trusted without restarting the IKE daemon.
    assert_eq!(count_loaded(&loaded, &r.old), 0, "{loaded:?}");
    assert_eq!(count_loaded(&loaded, &r.new), 1, "{loaded:?}");
    assert_eq!(count_loaded(&loaded, &operator), 1, "{loaded:?}");

    ma.stop().await.unwrap();
    mb.stop().await.unwrap();
    println!("total {:?}", t0.elapsed());
}

/// One CA per critical extension, as `openssl req -addext` writes it: every
/// extension of `IKE_CRITICAL_EXTENSIONS` and some the daemon refuses.
/// (name, OID, the `-addext` arguments).
const CRITICAL_EXTENSION_CAS: &[(&str, &str, &[&str])] = &[
    ("ski", "2.5.29.14", &["subjectKeyIdentifier=critical,hash"]),
    (
        "ku",
        "2.5.29.15",
        &["keyUsage=critical,keyCertSign,cRLSign"],
    ),
    (
        "san",
        "2.5.29.17",
        &["subjectAltName=critical,DNS:ca.example"],
    ),
    (
        "ian",
        "2.5.29.18",
        &["issuerAltName=critical,DNS:ca.example"],
    ),
    ("bc", "2.5.29.19", &[]),
    (
        "nc",
        "2.5.29.30",
        &["nameConstraints=critical,permitted;DNS:example.com"],
    ),
    (
        "crldp",
        "2.5.29.31",
        &["crlDistributionPoints=critical,URI:http://ca.example/crl"],
    ),
    ("cp", "2.5.29.32", &["certificatePolicies=critical,1.2.3.4"]),
    (
        "pm",
        "2.5.29.33",
        &[
            "certificatePolicies=1.2.3.4",
            "policyMappings=critical,1.2.3.4:1.2.3.5",
        ],
    ),
    (
        "aki",
        "2.5.29.35",
        &["authorityKeyIdentifier=critical,keyid:always"],
    ),
    (
        "pc",
        "2.5.29.36",
        &["policyConstraints=critical,requireExplicitPolicy:0"],
    ),
    (
        "eku",
        "2.5.29.37",
        &["extendedKeyUsage=critical,serverAuth"],
    ),
    ("iap", "2.5.29.54", &["inhibitAnyPolicy=critical,0"]),
    (
        "aia",
        "1.3.6.1.5.5.7.1.1",
        &["authorityInfoAccess=critical,OCSP;URI:http://ca.example/ocsp"],
    ),
    (
        "ipab",
        "1.3.6.1.5.5.7.1.7",
        &["sbgp-ipAddrBlock=critical,IPv4:10.0.0.0/8"],
    ),
    (
        "nscert",
        "2.16.840.1.113730.1.1",
        &["nsCertType=critical,sslCA"],
    ),
    (
        "tlsf",
        "1.3.6.1.5.5.7.1.24",
        &["1.3.6.1.5.5.7.1.24=critical,DER:3003020105"],
    ),
    (
        "sia",
        "1.3.6.1.5.5.7.1.11",
        &["subjectInfoAccess=critical,caRepository;URI:http://ca.example/repo"],
    ),
    (
        "fcrl",
        "2.5.29.46",
        &["freshestCRL=critical,URI:http://ca.example/delta"],
    ),
    (
        "asid",
        "1.3.6.1.5.5.7.1.8",
        &["sbgp-autonomousSysNum=critical,AS:1"],
    ),
    ("sda", "2.5.29.9", &["2.5.29.9=critical,DER:3000"]),
    (
        "private",
        "1.3.6.1.4.1.99999.1",
        &["1.3.6.1.4.1.99999.1=critical,DER:0500"],
    ),
];

/// The agent's parser and the real charon agree on every CA above: the
/// parser accepts exactly the CAs that `ipsec listcacerts` shows loaded.
/// A CA the daemon refuses is refused before activation (the trust bundle
/// holding it is `TrustBundleInvalid` and the previous trust is kept);
/// when strongSwan's list changes, this test says which entry differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cas_the_agent_accepts_are_exactly_the_cas_charon_loads() {
    use kube_ovn_ipsec_api::pki::{Certificate, IKE_CRITICAL_EXTENSIONS};
    let r = rotation("koi-cab3").await;
    let tested: Vec<&str> = CRITICAL_EXTENSION_CAS.iter().map(|c| c.1).collect();
    for (oid, name) in IKE_CRITICAL_EXTENSIONS {
        assert!(tested.contains(oid), "no CA here tests {name} ({oid})");
    }
    let files = tempfile::tempdir().unwrap();
    let key = files.path().join("ca.key");
    testbed::netns::run(
        std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&key),
    )
    .unwrap();
    let dir = ike_config(&r.a.node).cacerts_dir;
    let mut ours = Vec::new();
    for (name, _, addext) in CRITICAL_EXTENSION_CAS {
        let pem = dir.join(format!("critical-{name}.pem"));
        let mut cmd = std::process::Command::new("openssl");
        cmd.args(["req", "-x509", "-new", "-days", "30", "-key"])
            .arg(&key)
            .args(["-subj", &format!("/CN=critical-{name}")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"]);
        for a in *addext {
            cmd.args(["-addext", a]);
        }
        testbed::netns::run(cmd.arg("-out").arg(&pem)).unwrap();
        let accepted = Certificate::from_pem(&std::fs::read(&pem).unwrap());
        ours.push((name, accepted));
    }
    r.a.node.ipsec(&["rereadcacerts"]).unwrap();
    let loaded = cacerts(&r.a);
    let mut disagree = Vec::new();
    for (name, accepted) in &ours {
        let subject = format!("CN=critical-{name}");
        let by_charon = loaded
            .iter()
            .any(|c| c.subject.trim_matches('"') == subject);
        println!(
            "{name:8} charon {:8} agent {}",
            if by_charon { "loads" } else { "refuses" },
            match accepted {
                Ok(_) => "accepts".to_string(),
                Err(e) => format!("refuses: {e}"),
            }
        );
        if by_charon != accepted.is_ok() {
            disagree.push(*name);
        }
    }
    assert!(
        disagree.is_empty(),
        "the agent and charon disagree on {disagree:?}\n{loaded:?}"
    );
    assert!(
        ours.iter().any(|(_, a)| a.is_err()),
        "no CA was refused: the test shows nothing"
    );
}
