//! Identity flow with fakes, under paused tokio time.

use super::*;
use crate::clock::TokioClock;
use crate::keydir::{KeyDirState, STATE_FILE};
use crate::metrics::NoopMetrics;
use crate::ovsdb_writer::{OvsdbWriter, OvsdbWriterArgs};
use crate::renewal_timer::{RenewalTimer, RenewalTimerArgs, RenewalTimerMsg, Schedule};
use crate::status::timestamp;
use crate::testing::{CsrScript, FakeCsrApi, FakeOvsdb, Tamper, TestCa};
use kube_ovn_ipsec_api::csr::csr_name;
use kube_ovn_ipsec_api::pki::TrustBundle;
use kube_ovn_ipsec_api::status::Phase;
use kube_ovn_ipsec_api::status::Reason;
use ractor::Actor;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::UNIX_EPOCH;
use tokio::time::Instant;

const BASE: u64 = 1_800_000_000;
const DAY: u32 = 24 * 3600;

struct Harness {
    _tmp: Option<tempfile::TempDir>,
    key_dir: PathBuf,
    ca: Arc<TestCa>,
    clock: Arc<TokioClock>,
    csr: FakeCsrApi,
    ovsdb: FakeOvsdb,
    board: StatusBoard,
    bus: Bus,
    trust: tokio::sync::watch::Sender<Option<crate::identity::TrustSource>>,
    lifetime: u32,
    identity: Option<ActorRef<IdentityMsg>>,
    others: Vec<ractor::ActorCell>,
}

fn uid(s: &str) -> Uid {
    Uid::new(s).unwrap()
}

impl Harness {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let key_dir = tmp.path().join("keys");
        Self::with_key_dir(Some(tmp), key_dir)
    }

    fn with_key_dir(tmp: Option<tempfile::TempDir>, key_dir: PathBuf) -> Self {
        let clock = Arc::new(TokioClock::starting_at(
            UNIX_EPOCH + Duration::from_secs(BASE),
        ));
        let ca = Arc::new(TestCa::p256("kube-ovn ipsec test CA"));
        Harness {
            _tmp: tmp,
            key_dir,
            csr: FakeCsrApi::new(ca.clone(), clock.clone()),
            ca,
            ovsdb: FakeOvsdb::with_other_config(&[("dpdk-init", "false"), ("hw-offload", "true")]),
            board: StatusBoard::new(clock.clone()),
            clock,
            bus: Bus::default(),
            trust: tokio::sync::watch::channel(None).0,
            lifetime: DAY,
            identity: None,
            others: Vec::new(),
        }
    }

    fn config(&self) -> IdentityConfig {
        let mut c = IdentityConfig::new(
            "node-1".into(),
            uid("3f1c2a9e-0000-4000-8000-000000000001"),
            uid("7d0e5b1c-0000-4000-8000-000000000002"),
            Chassis::new("chassis-node-1").unwrap(),
            self.key_dir.clone(),
        );
        c.key_type = KeyType::EcdsaP256;
        c.expiration_seconds = self.lifetime;
        c.request_timeout = Duration::from_secs(1);
        c
    }

    async fn start_identity(&mut self) -> ActorRef<IdentityMsg> {
        let args = IdentityArgs {
            config: self.config(),
            csr_api: Arc::new(self.csr.clone()),
            ovsdb: Arc::new(self.ovsdb.clone()),
            clock: self.clock.clone(),
            board: self.board.clone(),
            metrics: Arc::new(NoopMetrics),
            bus: self.bus.clone(),
            trust: self.trust.subscribe(),
        };
        let (r, _) = Actor::spawn(None, IdentityActor, args).await.unwrap();
        self.identity = Some(r.clone());
        r
    }

    async fn start_all(&mut self) -> ActorRef<IdentityMsg> {
        let (w, _) = Actor::spawn(
            None,
            OvsdbWriter,
            OvsdbWriterArgs {
                gate: crate::gate::ProtectionGate::default(),
                board: self.board.clone(),
                verify_period: Duration::from_secs(2),
                ovsdb: Arc::new(self.ovsdb.clone()),
                metrics: Arc::new(NoopMetrics),
                bus: self.bus.clone(),
            },
        )
        .await
        .unwrap();
        let (t, _) = Actor::spawn(
            None,
            RenewalTimer,
            RenewalTimerArgs {
                node_uid: self.config().node_uid,
                clock: self.clock.clone(),
                board: self.board.clone(),
                metrics: Arc::new(NoopMetrics),
                bus: self.bus.clone(),
            },
        )
        .await
        .unwrap();
        self.others = vec![w.get_cell(), t.get_cell()];
        self.trust.send_replace(Some(self.ca.trust_pem().into()));
        self.start_identity().await
    }

    fn timer(&self) -> ActorRef<RenewalTimerMsg> {
        self.others[1].clone().into()
    }

    async fn schedule(&self) -> Option<Schedule> {
        ractor::call_t!(self.timer(), RenewalTimerMsg::Schedule, 1_000).unwrap()
    }

    async fn stop_identity(&mut self) {
        if let Some(id) = self.identity.take() {
            id.stop_and_wait(None, Some(Duration::from_secs(1)))
                .await
                .unwrap();
        }
    }

    async fn stop(mut self) {
        self.stop_identity().await;
        for c in self.others.drain(..) {
            c.stop(None);
        }
        assert!(
            self.csr.unexpected().is_empty(),
            "unexpected CSR calls: {:?}",
            self.csr.unexpected()
        );
    }

    fn state(&self) -> KeyDirState {
        serde_json::from_slice(&std::fs::read(self.key_dir.join(STATE_FILE)).unwrap()).unwrap()
    }

    /// Polls (in virtual time) until `f` holds; fails after `limit`.
    async fn until(&self, what: &str, limit: Duration, mut f: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            if f(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; status {:?}",
                self.board.snapshot()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn until_generation(&self, g: u64, limit: Duration) {
        self.until(&format!("generation {g}"), limit, |h| {
            h.board.snapshot().generation == Some(g) && h.board.identity_ready().is_ok()
        })
        .await;
    }

    fn ovsdb_points_at(&self, g: u64) -> bool {
        let oc = self.ovsdb.other_config();
        let dir = self.key_dir.join(crate::keydir::generation_dir_name(g));
        ["private_key", "certificate", "ca_cert"]
            .iter()
            .all(|k| oc.get(*k).is_some_and(|p| Path::new(p).starts_with(&dir)))
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o777
}

#[tokio::test(start_paused = true)]
async fn cold_start_activates_then_renewal_activates_second_generation() {
    let mut h = Harness::new();
    h.csr.then(CsrScript::Issue).then(CsrScript::Issue);
    h.start_all().await;
    h.until_generation(1, Duration::from_secs(10)).await;

    // The CSR as the controller sees it.
    let subs = h.csr.submissions();
    let sub = &subs[0];
    assert!(sub.name.starts_with("ovn-ipsec-"));
    assert_eq!(sub.signer_name, "kubeovn.io/signer");
    assert_eq!(sub.usages, vec!["ipsec tunnel".to_string()]);
    assert_eq!(sub.expiration_seconds, DAY);
    assert_eq!(sub.annotations["kube-ovn.io/ipsec-node"], "node-1");
    assert_eq!(
        sub.annotations["kube-ovn.io/ipsec-node-uid"],
        "3f1c2a9e-0000-4000-8000-000000000001"
    );
    assert_eq!(
        sub.annotations["kube-ovn.io/ipsec-chassis"],
        "chassis-node-1"
    );
    assert_eq!(sub.annotations["kube-ovn.io/ipsec-generation"], "1");
    let trust = TrustBundle::from_pem(&h.ca.trust_pem()).unwrap();
    let cfg = h.config();
    assert_eq!(
        sub.name,
        csr_name(
            &cfg.node_uid,
            &cfg.pod_uid,
            DAY,
            &trust.digest(),
            &sub.request_pem
        )
    );

    // OVSDB: all three keys on generation 1, other keys untouched.
    assert!(h.ovsdb_points_at(1));
    let oc = h.ovsdb.other_config();
    assert_eq!(oc["dpdk-init"], "false");
    assert_eq!(oc["hw-offload"], "true");
    assert_eq!(mode(&h.key_dir), 0o700);
    assert_eq!(mode(&h.key_dir.join("gen-000001/private.key")), 0o600);
    let st = h.state();
    assert_eq!(st.active.as_ref().unwrap().generation, 1);
    assert!(st.pending.is_none());
    let s = h.board.snapshot();
    assert_eq!(s.phase, Phase::Active);
    assert_eq!(s.chassis.as_ref().unwrap().as_str(), "chassis-node-1");

    // Renewal point inside [40 %, 60 %] of the lifetime.
    let sched = h.schedule().await.unwrap();
    assert_eq!(sched.generation, 1);
    let now = timestamp(h.clock.now());
    let frac = sched.renew_at.secs_since(now) as f64 / f64::from(DAY);
    assert!(
        (0.39..=0.61).contains(&frac),
        "renewal at {frac} of the lifetime"
    );
    tokio::time::sleep(Duration::from_secs(
        u64::try_from(sched.renew_at.secs_since(now)).unwrap() - 10,
    ))
    .await;
    assert_eq!(
        h.board.snapshot().generation,
        Some(1),
        "not before the renewal point"
    );
    h.until_generation(2, Duration::from_secs(60)).await;
    assert!(h.ovsdb_points_at(2));
    assert_eq!(h.ovsdb.transactions(), 2);
    let st = h.state();
    assert_eq!(st.active.as_ref().unwrap().generation, 2);
    assert_eq!(
        st.retired.iter().map(|r| r.generation).collect::<Vec<_>>(),
        vec![1]
    );
    assert!(
        h.key_dir.join("gen-000001").exists(),
        "kept for the grace period"
    );
    // After the grace period generation 1 is collected (OVSDB is on 2).
    tokio::time::sleep(Duration::from_secs(3700)).await;
    h.until("generation 1 collected", Duration::from_secs(10), |h| {
        !h.key_dir.join("gen-000001").exists()
    })
    .await;
    assert!(h.key_dir.join("gen-000002").exists());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn denial_surfaces_reason_and_retries_with_backoff() {
    let mut h = Harness::new();
    h.csr
        .then(CsrScript::Deny("NodeUIDMismatch".into()))
        .then(CsrScript::Deny("NodeUIDMismatch".into()))
        .then(CsrScript::Issue);
    h.start_all().await;
    h.until("denial in status", Duration::from_secs(5), |h| {
        h.board.snapshot().reason == Some(Reason::CsrDenied)
    })
    .await;
    let t0 = Instant::now();
    assert_eq!(h.board.snapshot().phase, Phase::Pending);
    assert!(h.board.identity_ready().is_err());
    h.until_generation(3, Duration::from_secs(30)).await;
    // Two retries: 1 s then 2 s.
    assert!(
        Instant::now() - t0 >= Duration::from_secs(3),
        "{:?}",
        Instant::now() - t0
    );
    assert_eq!(h.csr.objects(), 3, "each retry is a new key and CSR");
    assert_eq!(h.ovsdb.transactions(), 1);
    assert_eq!(h.board.snapshot().reason, None);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn mismatching_certificates_are_rejected() {
    let mut h = Harness::new();
    h.csr
        .then(CsrScript::IssueTampered(Tamper::OtherKey))
        .then(CsrScript::IssueTampered(Tamper::WrongSan))
        .then(CsrScript::Issue);
    h.start_all().await;
    h.until("rejection in status", Duration::from_secs(5), |h| {
        h.board.snapshot().reason == Some(Reason::CertificateMismatch)
    })
    .await;
    h.until_generation(3, Duration::from_secs(30)).await;
    // Never activated a rejected certificate.
    assert_eq!(h.ovsdb.transactions(), 1);
    assert!(h.ovsdb_points_at(3));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn restart_resumes_pending_csr_with_the_same_key() {
    let mut h = Harness::new();
    h.csr.then(CsrScript::Hang);
    let id = h.start_all().await;
    h.until("CSR submitted", Duration::from_secs(5), |h| {
        h.csr.objects() == 1
    })
    .await;
    let before = snapshot(&id).await.unwrap();
    let (g, name) = before.pending.clone().unwrap();
    let st = h.state();
    let rec = st.pending.as_ref().unwrap();
    assert_eq!(rec.csr_name, name);
    assert_eq!(rec.key_digest, before.pending_key_digest.clone().unwrap());
    assert_eq!(h.board.snapshot().reason, Some(Reason::CsrPending));

    h.stop_identity().await;
    let id = h.start_identity().await;
    let after = snapshot(&id).await.unwrap();
    assert_eq!(after.pending, Some((g, name.clone())));
    assert_eq!(after.pending_key_digest, before.pending_key_digest);
    h.until("resubmitted", Duration::from_secs(5), |h| {
        h.csr.submissions().len() >= 2
    })
    .await;
    assert!(h.csr.submissions().iter().all(|s| s.name == name));
    assert_eq!(h.csr.objects(), 1, "no new CSR");
    // The controller gets to it late.
    h.csr.decide(&name, CsrScript::Issue);
    h.until_generation(g, Duration::from_secs(60)).await;
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn corrupt_state_file_is_moved_aside_and_a_fresh_identity_requested() {
    let mut h = Harness::new();
    std::fs::create_dir_all(&h.key_dir).unwrap();
    std::fs::write(h.key_dir.join(STATE_FILE), b"\x00garbage").unwrap();
    h.csr.then(CsrScript::Issue);
    h.start_all().await;
    h.until_generation(1, Duration::from_secs(10)).await;
    let aside: Vec<_> = std::fs::read_dir(&h.key_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(h.key_dir.join(&aside[0])).unwrap(),
        b"\x00garbage",
        "moved, never deleted"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn full_key_dir_reports_key_dir_full_without_crashing() {
    let full = crate::keydir::tests::FullFs::new();
    full.fill();
    let mut h = Harness::with_key_dir(None, full.dir.clone());
    let _id = h.start_all().await;
    h.until("KeyDirFull", Duration::from_secs(5), |h| {
        h.board.snapshot().reason == Some(Reason::KeyDirFull)
    })
    .await;
    // Retrying, not crash-looping; never reported as read-only.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(h.board.snapshot().reason, Some(Reason::KeyDirFull));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn read_only_key_dir_reports_key_dir_read_only_without_crashing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = crate::keydir::tests::unwritable_dir(tmp.path());
    let mut h = Harness::with_key_dir(Some(tmp), dir);
    let id = h.start_all().await;
    h.until("KeyDirReadOnly", Duration::from_secs(5), |h| {
        let s = h.board.snapshot();
        s.phase == Phase::Failed && s.reason == Some(Reason::KeyDirReadOnly)
    })
    .await;
    // Still alive and retrying, not crash-looping; nothing was requested.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let snap = snapshot(&id).await.unwrap();
    assert!(!snap.key_dir_open);
    assert!(h.csr.submissions().is_empty());
    assert_eq!(h.board.snapshot().reason, Some(Reason::KeyDirReadOnly));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_renewal_keeps_identity_until_expiry_flips_readyz() {
    let mut h = Harness::new();
    h.lifetime = 3600;
    h.csr
        .then(CsrScript::Issue)
        .otherwise(CsrScript::Deny("SignerOffline".into()));
    h.start_all().await;
    h.until_generation(1, Duration::from_secs(10)).await;
    let sched = h.schedule().await.unwrap();
    let now = timestamp(h.clock.now());
    tokio::time::sleep(Duration::from_secs(
        u64::try_from(sched.renew_at.secs_since(now)).unwrap() + 5,
    ))
    .await;
    h.until("renewal denied", Duration::from_secs(10), |h| {
        h.board.snapshot().reason == Some(Reason::CsrDenied)
    })
    .await;
    // Still the same valid identity, still ready.
    let s = h.board.snapshot();
    assert_eq!((s.phase, s.generation), (Phase::Active, Some(1)));
    assert_eq!(h.board.identity_ready(), Ok(()));
    assert!(h.ovsdb_points_at(1));
    let attempts = h.csr.objects();
    // Retries continue with backoff until expiry …
    let left = u64::try_from(sched.expires.secs_since(timestamp(h.clock.now()))).unwrap();
    tokio::time::sleep(Duration::from_secs(left - 2)).await;
    assert!(h.csr.objects() > attempts + 5, "kept retrying");
    assert_eq!(h.board.identity_ready(), Ok(()));
    // … and expiry makes the phase Expired and readyz false.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.board.identity_ready(), Err(Reason::Expired));
    assert_eq!(h.board.snapshot().phase, Phase::Expired);
    assert_eq!(
        h.state().active.unwrap().generation,
        1,
        "identity never replaced"
    );
    assert!(h.key_dir.join("gen-000001/private.key").exists());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn trust_changes_garbage_kept_untrusted_renews_compatible_refreshes() {
    let mut h = Harness::new();
    h.csr.then(CsrScript::Issue);
    let id = h.start_all().await;
    h.until_generation(1, Duration::from_secs(10)).await;
    let old_trust = h.board.trust().unwrap();

    // Garbage: old trust kept, reason shown, still ready.
    id.send_message(IdentityMsg::TrustBundle(
        (b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_vec()).into(),
    ))
    .unwrap();
    h.until("invalid trust reason", Duration::from_secs(5), |h| {
        h.board.snapshot().reason == Some(Reason::TrustBundleInvalid)
    })
    .await;
    assert_eq!(h.board.trust(), Some(old_trust));
    assert_eq!(h.board.identity_ready(), Ok(()));

    // A rotation bundle (old + new CA): the leaf still verifies, so the new
    // trust is activated as a trust-only generation with the same cert.
    let ca2 = Arc::new(TestCa::p256("kube-ovn ipsec test CA 2"));
    let mut both = h.ca.trust_pem();
    both.extend_from_slice(&ca2.trust_pem());
    id.send_message(IdentityMsg::TrustBundle((both).into()))
        .unwrap();
    h.until_generation(2, Duration::from_secs(10)).await;
    assert_eq!(h.csr.objects(), 1, "no CSR for a trust-only generation");
    let st = h.state();
    assert_eq!(
        st.active.as_ref().unwrap().certificate_digest,
        h.board.snapshot().certificate_digest.unwrap().to_hex()
    );

    // Only the new CA: the leaf no longer verifies: renewal at once, long
    // before the renewal point.
    h.csr.set_ca(ca2.clone());
    h.csr.then(CsrScript::Issue);
    id.send_message(IdentityMsg::TrustBundle((ca2.trust_pem()).into()))
        .unwrap();
    h.until_generation(3, Duration::from_secs(10)).await;
    assert_eq!(h.csr.objects(), 2);
    h.stop().await;
}

/// Logs of the whole test binary, captured by one global subscriber: a
/// scoped (thread-local) one misses events when tests run in parallel,
/// because tracing caches callsite interest process-wide.
fn capture() -> &'static Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::OnceLock;
    static CAPTURE: OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        #[derive(Clone)]
        struct W(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(std::sync::Mutex::new(Vec::new()));
        let w = W(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buf
    })
}

#[tokio::test(start_paused = true)]
async fn status_and_logs_never_contain_pem() {
    let cap = capture();
    let mut h = Harness::new();
    h.csr
        .then(CsrScript::Deny(
            "-----BEGIN CERTIFICATE----- smuggled".into(),
        ))
        .then(CsrScript::IssueTampered(Tamper::WrongSan))
        .then(CsrScript::Issue)
        .then(CsrScript::Issue);
    let id = h.start_all().await;
    h.until_generation(3, Duration::from_secs(30)).await;
    id.send_message(IdentityMsg::TrustBundle((b"garbage".to_vec()).into()))
        .unwrap();
    let sched = h.schedule().await.unwrap();
    let left = u64::try_from(sched.renew_at.secs_since(timestamp(h.clock.now()))).unwrap();
    tokio::time::sleep(Duration::from_secs(left + 5)).await;
    h.until_generation(4, Duration::from_secs(30)).await;
    let status = serde_json::to_string(&h.board.snapshot()).unwrap();
    h.stop().await;

    let logs = String::from_utf8(cap.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("CSR denied"), "capture works");
    assert!(!logs.contains("-----BEGIN"), "PEM in logs");
    assert!(!logs.contains("PRIVATE KEY"), "key in logs");
    assert!(!status.contains("-----BEGIN"), "PEM in status: {status}");
}

#[tokio::test(start_paused = true)]
async fn trust_changed_while_down_is_activated_after_restart() {
    let mut h = Harness::new();
    h.csr.then(CsrScript::Issue);
    h.start_all().await;
    h.until_generation(1, Duration::from_secs(10)).await;
    h.stop_identity().await;

    let ca2 = TestCa::p256("kube-ovn ipsec test CA 2");
    let mut both = h.ca.trust_pem();
    both.extend_from_slice(&ca2.trust_pem());
    h.trust.send_replace(Some(both.clone().into()));
    h.start_identity().await;
    h.until_generation(2, Duration::from_secs(10)).await;
    assert_eq!(h.csr.objects(), 1, "trust-only: no CSR");
    let ca_file =
        TrustBundle::from_pem(&std::fs::read(h.key_dir.join("gen-000002/ca.pem")).unwrap())
            .unwrap();
    assert_eq!(
        ca_file.digest(),
        TrustBundle::from_pem(&both).unwrap().digest()
    );
    assert!(h.ovsdb_points_at(2));
    h.stop().await;
}
