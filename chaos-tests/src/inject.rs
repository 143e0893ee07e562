//! Where faults land: decorators of the agent's adapters (handed to it
//! through `runtime::agent::Seams`) that report when the armed point is
//! reached and hold the caller there while the test kills the victim.
//!
//! The same decorators serve a whole process: a switch made with
//! [`Injector::stopping`] is armed through a file ([`StopFile`]) the test
//! writes, and stops the process (SIGSTOP) at the point the file names
//! instead of holding one caller; the test SIGKILLs a victim there
//! (`src/bin/kube-ovn-ipsec-chaos.rs`).
//!
//! A kill of the calling actor itself lands while the decorator holds it:
//! ractor cancels the handler at that await, so the call's effect is done
//! (or, before the inner call, not done) and the actor never sees the
//! result: exactly a crash at that point. A kill of another actor lands
//! while this one is stopped at the point.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use actors::Result;
use actors::coordinator::ReceiptPort;
use actors::coordinator::plan::RecordView;
use actors::ports::{
    Acknowledgement, CsrApi, CsrOutcome, CsrRef, CsrSubmission, GuardReadback, LeaseSummary,
    MonitorPort, OvsdbIdentity, OvsdbIdentityKeys, ProtectionPort, RunningMonitor, RunningProcess,
    SaSummary,
};
use async_trait::async_trait;
use kube_ovn_ipsec_api::coordination::{CoordinationPhase, Receipt};
use kube_ovn_ipsec_api::pki::Certificate;
use kube_ovn_ipsec_runtime::agent::Adapters;
use tokio::sync::oneshot;

use crate::plan::Point;

/// The moment the armed point was reached.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    /// The point.
    pub point: Point,
    /// When.
    pub at: Instant,
}

#[derive(Debug)]
struct Arming {
    point: Point,
    hit: oneshot::Sender<Hit>,
}

/// What a crossing of the armed point does.
#[derive(Debug, Clone, Copy)]
enum OnHit {
    /// Hold the caller this long (an in-process agent: the test kills an
    /// actor meanwhile).
    Hold(Duration),
    /// Stop the whole process at the point the file names (the test kills
    /// a victim, then SIGKILLs or continues the process).
    StopProcess,
}

/// One agent's fault switch: armed at one point at a time; the decorators
/// consult it.
#[derive(Debug)]
pub struct Injector {
    armed: Mutex<Option<Arming>>,
    on_hit: OnHit,
    /// Where a stopping switch is armed.
    file: Option<StopFile>,
}

impl Injector {
    /// A switch that holds a caller at the hit point for `hold`: long
    /// enough for the test to kill the victim there.
    pub fn new(hold: Duration) -> Arc<Injector> {
        Arc::new(Injector {
            armed: Mutex::new(None),
            on_hit: OnHit::Hold(hold),
            file: None,
        })
    }

    /// A switch that stops this process ([`stop_process`]) when a point is
    /// crossed that `file` names at that moment.
    pub fn stopping(file: StopFile) -> Arc<Injector> {
        Arc::new(Injector {
            armed: Mutex::new(None),
            on_hit: OnHit::StopProcess,
            file: Some(file),
        })
    }

    /// Arms `point` (replacing an earlier arming); the receiver fires at
    /// the next crossing.
    pub fn arm(&self, point: Point) -> oneshot::Receiver<Hit> {
        let (hit, rx) = oneshot::channel();
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arming { point, hit });
        rx
    }

    /// Nothing armed any more.
    pub fn disarm(&self) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Reports a crossing of `point`; true when it was the armed one.
    /// A stopping switch stops the process here — for
    /// [`Point::OvsdbSent`] a moment later, from another thread, so the
    /// stop races the transaction as a kill does in-process.
    fn crossed(&self, point: Point) -> bool {
        if let Some(file) = &self.file {
            if !file.take(point.name()) {
                return false;
            }
            if point == Point::OvsdbSent {
                std::thread::spawn(move || {
                    // A thread of its own, not the executor's.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(Duration::from_millis(1));
                    stop_process(point.name());
                });
            } else {
                stop_process(point.name());
            }
            return true;
        }
        let arming = {
            let mut g = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_ref() {
                Some(a) if a.point == point => g.take(),
                _ => None,
            }
        };
        match arming {
            Some(a) => a
                .hit
                .send(Hit {
                    point,
                    at: Instant::now(),
                })
                .is_ok(),
            None => false,
        }
    }

    /// Reports a crossing and, when it was the armed point, holds the
    /// caller there.
    async fn hold_at(&self, point: Point) {
        if self.crossed(point)
            && let OnHit::Hold(hold) = self.on_hit
        {
            tokio::time::sleep(hold).await;
        }
    }

    /// Wraps every adapter of `a` with this switch.
    pub fn wrap(self: &Arc<Self>, a: Adapters) -> Adapters {
        Adapters {
            csr_api: Arc::new(FaultyCsr {
                inner: a.csr_api,
                at: self.clone(),
            }),
            ovsdb: Arc::new(FaultyOvsdb {
                inner: a.ovsdb,
                at: self.clone(),
            }),
            protection: Arc::new(FaultyProtection {
                inner: a.protection,
                at: self.clone(),
            }),
            ike: a.ike,
            monitor: Arc::new(FaultyMonitorPort {
                inner: a.monitor,
                at: self.clone(),
            }),
            receipts: a.receipts.map(|inner| -> Arc<dyn ReceiptPort> {
                Arc::new(FaultyReceipts {
                    inner,
                    at: self.clone(),
                })
            }),
        }
    }

    /// Whether a stopping switch's file names the receipt point of
    /// `phase`; if so the process stops there.
    fn crossed_receipt(&self, phase: CoordinationPhase) {
        if let Some(file) = &self.file {
            let point = receipt_point(phase);
            if file.take(&point) {
                stop_process(&point);
            }
        }
    }
}

/// The point just after this node's receipt answering `phase` (`Prepare`,
/// `Arm`) with a status that satisfies the barrier is on its Node:
/// "Prepare receipt published". Only a stopping switch stops there (the
/// coordinated agents run as processes).
pub fn receipt_point(phase: CoordinationPhase) -> String {
    format!("{phase:?} receipt published")
}

/// The line a stopped process writes to its stderr before it stops, with
/// the point's name after it.
pub const STOPPED: &str = "chaos: stopped at ";

/// The file that arms a process's stop (`CHAOS_STOP_FILE`): the test
/// writes a point's name into it; the process, crossing that point, removes
/// the file and stops. Absent or naming another point: nothing happens, so
/// the test arms the next fault only once it is ready for it.
#[derive(Debug, Clone)]
pub struct StopFile(pub std::path::PathBuf);

impl StopFile {
    /// Arms `point` (a name of [`Point`] or of the cleanup's points).
    pub fn arm(&self, point: &str) -> std::io::Result<()> {
        std::fs::write(&self.0, point)
    }

    /// Whether the file names `point`; if so it is removed (one stop per
    /// arming).
    pub fn take(&self, point: &str) -> bool {
        let named = std::fs::read_to_string(&self.0).is_ok_and(|s| s.trim() == point);
        named && std::fs::remove_file(&self.0).is_ok()
    }
}

/// Stops this whole process (SIGSTOP) at `point`, after saying so on
/// stderr: every thread halts where it is, and the test that waits for the
/// stop SIGKILLs the process — a crash exactly there.
pub fn stop_process(point: &str) {
    eprintln!("{STOPPED}{point}");
    // No one to report a failure to: the test sees that the process never
    // stopped.
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
}

#[derive(Debug)]
struct FaultyCsr {
    inner: Arc<dyn CsrApi>,
    at: Arc<Injector>,
}

#[async_trait]
impl CsrApi for FaultyCsr {
    async fn submit(&self, csr: &CsrSubmission) -> Result<CsrRef> {
        self.at.hold_at(Point::KeyPersisted).await;
        let r = self.inner.submit(csr).await;
        if r.is_ok() {
            self.at.hold_at(Point::CsrCreated).await;
        }
        r
    }

    async fn wait(&self, name: &str, timeout: Duration) -> Result<CsrOutcome> {
        let r = self.inner.wait(name, timeout).await;
        if matches!(r, Ok(CsrOutcome::Issued { .. })) {
            self.at.hold_at(Point::CertificateReceived).await;
        }
        r
    }
}

#[derive(Debug)]
struct FaultyOvsdb {
    inner: Arc<dyn OvsdbIdentity>,
    at: Arc<Injector>,
}

#[async_trait]
impl OvsdbIdentity for FaultyOvsdb {
    async fn read(&self) -> Result<OvsdbIdentityKeys> {
        self.inner.read().await
    }

    async fn activate(&self, new: &OvsdbIdentityKeys) -> Result<()> {
        self.at.hold_at(Point::Verified).await;
        // Not held: the kill races the transaction on the wire.
        self.at.crossed(Point::OvsdbSent);
        let r = self.inner.activate(new).await;
        if r.is_ok() {
            self.at.hold_at(Point::OvsdbCommitted).await;
        }
        r
    }
}

#[derive(Debug)]
struct FaultyProtection {
    inner: Arc<dyn ProtectionPort>,
    at: Arc<Injector>,
}

#[async_trait]
impl ProtectionPort for FaultyProtection {
    async fn obtain_lease(&self, allocate: bool) -> Result<Option<LeaseSummary>> {
        self.inner.obtain_lease(allocate).await
    }

    async fn evaluate_guards(&self) -> Result<GuardReadback> {
        let r = self.inner.evaluate_guards().await;
        if r.as_ref().is_ok_and(|g| g.armed) {
            self.at.hold_at(Point::GuardArmed).await;
        }
        r
    }

    async fn publish_lease(&self) -> Result<Vec<String>> {
        self.inner.publish_lease().await
    }

    async fn observe_sas(&self) -> Result<SaSummary> {
        self.inner.observe_sas().await
    }
}

#[derive(Debug)]
struct FaultyMonitorPort {
    inner: Arc<dyn MonitorPort>,
    at: Arc<Injector>,
}

#[async_trait]
impl MonitorPort for FaultyMonitorPort {
    async fn start(&self) -> Result<Box<dyn RunningMonitor>> {
        let inner = self.inner.start().await?;
        Ok(Box::new(FaultyMonitor {
            inner,
            at: self.at.clone(),
        }))
    }
}

#[derive(Debug)]
struct FaultyMonitor {
    inner: Box<dyn RunningMonitor>,
    at: Arc<Injector>,
}

#[async_trait]
impl RunningProcess for FaultyMonitor {
    fn pid(&self) -> u32 {
        self.inner.pid()
    }

    fn try_exited(&mut self) -> Option<String> {
        self.inner.try_exited()
    }

    async fn probe(&mut self) -> Result<()> {
        self.inner.probe().await
    }

    async fn stop(&mut self) -> Result<()> {
        self.inner.stop().await
    }

    fn probe_again_within(&self) -> Option<Duration> {
        self.inner.probe_again_within()
    }
}

#[async_trait]
impl RunningMonitor for FaultyMonitor {
    async fn acknowledge(&mut self, keys: &OvsdbIdentityKeys) -> Result<Acknowledgement> {
        let r = self.inner.acknowledge(keys).await;
        if r.as_ref().is_ok_and(|a| a.configuration_applied) {
            self.at.hold_at(Point::MonitorReadBack).await;
        }
        r
    }
    async fn rebuild(&mut self) -> Result<Vec<String>> {
        self.inner.rebuild().await
    }
}

#[derive(Debug)]
struct FaultyReceipts {
    inner: Arc<dyn ReceiptPort>,
    at: Arc<Injector>,
}

#[async_trait]
impl ReceiptPort for FaultyReceipts {
    async fn publish(
        &self,
        receipt: &Receipt,
        key: &std::path::Path,
        certificate: &Certificate,
    ) -> Result<()> {
        let r = self.inner.publish(receipt, key, certificate).await;
        // A receipt is republished as the node progresses; the point is
        // the one the barrier counts.
        if r.is_ok() && receipt.status.satisfies(receipt.phase) {
            self.at.crossed_receipt(receipt.phase);
        }
        r
    }

    async fn current_record(&self) -> Result<RecordView> {
        self.inner.current_record().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_armed_point_fires_and_only_once() {
        let i = Injector::new(Duration::from_millis(1));
        let mut rx = i.arm(Point::CsrCreated);
        assert!(!i.crossed(Point::KeyPersisted));
        assert!(rx.try_recv().is_err(), "another point fired");
        assert!(i.crossed(Point::CsrCreated));
        assert_eq!(rx.try_recv().unwrap().point, Point::CsrCreated);
        assert!(!i.crossed(Point::CsrCreated), "fired twice");
        let _rx = i.arm(Point::GuardArmed);
        i.disarm();
        assert!(!i.crossed(Point::GuardArmed));
    }

    #[test]
    fn a_stop_file_fires_once_and_only_for_the_point_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let f = StopFile(dir.path().join("stop-at"));
        assert!(!f.take("verified"), "fired with no file");
        f.arm("verified").unwrap();
        assert!(!f.take("CSR created"), "fired for another point");
        assert!(f.take("verified"));
        assert!(!f.take("verified"), "fired twice for one arming");
    }
}
