//! The node coordinator (SPEC §7): follows the cluster's coordination
//! record, grants the protection actor its arm permit when the record asks
//! this node to arm, and publishes the node's signed receipt.
//!
//! What to do for a record is [`plan::plan`] (pure). The actor adds the
//! evidence: the identity it signs with (from the identity actor's `Ready`
//! and `Active` events: the issued generation in `Prepare`, the active one
//! once there is one), the node's status flags from the board, the trust
//! digest it holds and its Pod's template hash. The receipt is a signed
//! copy of what `/status` says — the coordinator reads the board to report
//! it, never to decide what to arm.
//!
//! A joiner (a node the `Enabled` record does not list) is granted its
//! permit only once the receipt it published for the record is visible
//! and a fresh read of the record ([`ReceiptPort::current_record`], not
//! the follower's watch, which may lag) still has it joining: the
//! controller's disable takes in every Node that shows such a receipt, so
//! a joiner never arms where a disable that already started cannot see
//! it.
//!
//! A receipt is published when its content changes (record generation,
//! epoch or phase, the flags, the certificate, the trust) and again every
//! `refresh` while the record still waits on it, so it stays fresh (the
//! controller accepts receipts observed within the last 2 minutes).
//! Publication failures are logged and retried on the next tick.

pub mod plan;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use kube_ovn_ipsec_api::clock::Clock;
use kube_ovn_ipsec_api::coordination::{
    CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::pki::Certificate;
use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::watch;

use self::plan::{RecordView, plan};
use crate::bus::{Bus, IdentityEvent};
use crate::error::Result;
use crate::gate::ArmPermit;
use crate::keydir::{CsrBinding, identity_paths_in};
use crate::status::{StatusBoard, timestamp};

/// Publishes this node's signed receipt.
#[async_trait]
pub trait ReceiptPort: Send + Sync + std::fmt::Debug + 'static {
    /// Signs `receipt` with the private key in `key` — which must be the
    /// key of `certificate` — and publishes it as this Node's
    /// `kube-ovn.io/ipsec-receipt` annotation with a resourceVersion
    /// precondition. The key is read here and never leaves the port.
    async fn publish(
        &self,
        receipt: &Receipt,
        key: &std::path::Path,
        certificate: &Certificate,
    ) -> Result<()>;

    /// A fresh read of the coordination record (not the follower's
    /// watch): what a joiner arms on, after its receipt is visible.
    async fn current_record(&self) -> Result<RecordView>;
}

/// Who this node is, as a receipt names it.
#[derive(Debug, Clone)]
pub struct NodeSelf {
    /// The Node's name.
    pub node_name: String,
    /// The Node's UID.
    pub node_uid: Uid,
    /// This agent's Pod UID.
    pub pod_uid: Uid,
    /// The template hash of this Pod (`controller-revision-hash`); without
    /// it no receipt can be published.
    pub template_hash: Option<String>,
}

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct NodeCoordinatorArgs {
    /// Who this node is.
    pub me: NodeSelf,
    /// The record as the runtime's follower last saw it.
    pub record: watch::Receiver<RecordView>,
    /// Granted when the record asks this node to arm.
    pub permit: ArmPermit,
    /// Signs and publishes receipts.
    pub port: Arc<dyn ReceiptPort>,
    /// The node's status (what a receipt reports).
    pub board: StatusBoard,
    /// Identity events.
    pub bus: Bus,
    /// Wall clock (`observed`).
    pub clock: Arc<dyn Clock>,
    /// The key directory (where a generation's private key is).
    pub key_dir: PathBuf,
    /// Republish an owed receipt this often (and re-evaluate this often).
    pub refresh: Duration,
}

/// Messages of the node coordinator.
#[derive(Debug)]
pub enum CoordinatorMsg {
    /// Re-evaluate (record, board or timer changed).
    Evaluate,
    /// A generation was issued and awaits activation.
    Issued(Box<SigningIdentity>),
    /// A generation is active.
    Active(Box<SigningIdentity>),
}

/// An identity a receipt can be signed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningIdentity {
    /// The generation.
    pub generation: u64,
    /// Its leaf.
    pub certificate: Certificate,
    /// The CSR it was issued for.
    pub csr: Option<CsrBinding>,
}

/// What a published receipt said, minus the time: a change republishes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    generation: u64,
    epoch: u64,
    phase: CoordinationPhase,
    template_hash: String,
    trust_hash: Sha256Digest,
    status: ReceiptStatus,
}

/// The node coordinator's state.
#[derive(Debug)]
pub struct CoordinatorState {
    args: NodeCoordinatorArgs,
    issued: Option<SigningIdentity>,
    active: Option<SigningIdentity>,
    last: Option<(Published, SystemTime)>,
    /// The waiting reason last logged (logged once per change).
    logged_wait: Option<String>,
    /// Why an owed receipt could not be published, last logged.
    blocked: Option<String>,
    tasks: Vec<JoinHandle<()>>,
}

/// The node coordinator actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeCoordinator;

impl CoordinatorState {
    /// The identity to sign with: the active one, else the issued one.
    fn signer(&self) -> Option<&SigningIdentity> {
        self.active.as_ref().or(self.issued.as_ref())
    }
}

async fn evaluate(state: &mut CoordinatorState) {
    let view = state.args.record.borrow().clone();
    let status = state.args.board.snapshot();
    let armed_ready = status.protection_armed
        && status.configuration_applied
        && status.runtime_healthy
        && state.args.board.readyz().is_ok();
    let me = &state.args.me;
    let p = plan(&view, &me.node_name, &me.node_uid, armed_ready);
    if p.arm && !state.args.permit.is_granted() {
        tracing::info!(
            "coordination asks this node to arm: lease, guards, identity activation, IKE"
        );
        state.args.permit.grant();
    }
    let now = state.args.clock.now();
    let signer = state.signer().cloned();
    let prepared = signer
        .as_ref()
        .filter(|_| p.prepare)
        .filter(|s| timestamp(now) < s.certificate.not_after())
        .map(|s| {
            (
                s.generation,
                s.certificate.digest(),
                s.certificate.not_after(),
            )
        });
    state.args.board.set_coordination_prepare(prepared);
    let wait = p.waiting.as_ref().map(|(r, why)| format!("{r:?}: {why}"));
    if wait != state.logged_wait {
        if let Some(w) = &wait {
            tracing::info!(waiting = %w, "coordination");
        }
        state.logged_wait = wait;
    }
    if let (Some(phase), RecordView::Present(record)) = (p.receipt, &view) {
        publish_owed(state, phase, record).await;
        if p.join {
            join_when_claimed(state, record).await;
        }
    }
}

/// A joiner's permit, once its receipt for `record` is published (the
/// patch succeeded, so the controller's next read of the Node sees it) and
/// a fresh read of the record still has this node joining or arming.
async fn join_when_claimed(state: &mut CoordinatorState, record: &CoordinationRecord) {
    if state.args.permit.is_granted() {
        return;
    }
    let claimed = state
        .last
        .as_ref()
        .is_some_and(|(p, _)| (p.generation, p.epoch) == (record.generation, record.epoch));
    if !claimed {
        return;
    }
    let fresh = match state.args.port.current_record().await {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "reading the coordination record before joining failed; retried");
            return;
        }
    };
    let me = &state.args.me;
    let p = plan(&fresh, &me.node_name, &me.node_uid, false);
    if p.join || p.arm {
        tracing::info!(
            "joining: the receipt is visible and the record still asks; arming: lease, guards, identity activation, IKE"
        );
        state.args.permit.grant();
    } else {
        tracing::info!(waiting = ?p.waiting, "the record moved on before this joiner armed; not arming");
    }
}

/// Logs at WARN why an owed receipt cannot be published, once per reason:
/// the coordinator re-evaluates every few hundred milliseconds.
fn cannot_publish(state: &mut CoordinatorState, why: String) {
    if state.blocked.as_deref() != Some(why.as_str()) {
        tracing::warn!(reason = %why, "a receipt is owed but cannot be published");
        state.blocked = Some(why);
    }
}

/// Signs and publishes the receipt `phase` owed for `record`, when its
/// content changed or it is due for a refresh.
async fn publish_owed(
    state: &mut CoordinatorState,
    phase: CoordinationPhase,
    record: &CoordinationRecord,
) {
    let status = state.args.board.snapshot();
    let now = state.args.clock.now();
    let signer = state.signer().cloned();
    let Some(signer) = signer else {
        tracing::debug!("a receipt is owed but no identity is issued yet");
        return;
    };
    let Some(template_hash) = state.args.me.template_hash.clone() else {
        cannot_publish(
            state,
            "this Pod's template hash is unknown (POD_TEMPLATE_HASH)".into(),
        );
        return;
    };
    let Some(trust_hash) = state.args.board.trust() else {
        tracing::debug!("a receipt is owed but no trust bundle is held yet");
        return;
    };
    let Some(csr) = signer.csr.clone() else {
        cannot_publish(
            state,
            format!(
                "the key directory does not record the CSR of generation {}; it is recorded \
                 from the next renewal on",
                signer.generation
            ),
        );
        return;
    };
    let (Ok(csr_uid), identity_ready) = (
        Uid::new(csr.uid.clone()),
        timestamp(now) < signer.certificate.not_after(),
    ) else {
        cannot_publish(
            state,
            format!("the recorded UID of CSR {} is not a UID", csr.name),
        );
        return;
    };
    let me = &state.args.me;
    let body = Published {
        generation: record.generation,
        epoch: record.epoch,
        phase,
        template_hash,
        trust_hash,
        status: ReceiptStatus {
            identity_ready,
            capability_verified: true,
            protection_armed: status.protection_armed,
            configuration_applied: status.configuration_applied,
            runtime_healthy: status.runtime_healthy,
            certificate_digest: signer.certificate.digest(),
        },
    };
    let due = match &state.last {
        Some((last, at)) => {
            *last != body || now.duration_since(*at).unwrap_or_default() >= state.args.refresh
        }
        None => true,
    };
    if !due {
        return;
    }
    let receipt = Receipt {
        generation: body.generation,
        epoch: body.epoch,
        phase: body.phase,
        node_name: me.node_name.clone(),
        node_uid: me.node_uid.clone(),
        pod_uid: me.pod_uid.clone(),
        csr_name: csr.name.clone(),
        csr_uid,
        template_hash: body.template_hash.clone(),
        trust_hash: body.trust_hash,
        observed: timestamp(now),
        status: body.status.clone(),
    };
    let key = identity_paths_in(&state.args.key_dir, signer.generation).private_key;
    match state
        .args
        .port
        .publish(&receipt, &key, &signer.certificate)
        .await
    {
        Ok(()) => {
            tracing::info!(
                generation = receipt.generation,
                epoch = receipt.epoch,
                phase = receipt.phase.as_str(),
                identity = signer.generation,
                armed = receipt.status.protection_armed,
                applied = receipt.status.configuration_applied,
                healthy = receipt.status.runtime_healthy,
                "coordination receipt published"
            );
            state.last = Some((body, now));
            state.blocked = None;
        }
        Err(e) => {
            tracing::warn!(error = %e, phase = phase.as_str(), "publishing the coordination receipt failed; retried");
        }
    }
}

impl Actor for NodeCoordinator {
    type Msg = CoordinatorMsg;
    type State = CoordinatorState;
    type Arguments = NodeCoordinatorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        args: NodeCoordinatorArgs,
    ) -> std::result::Result<CoordinatorState, ActorProcessingErr> {
        // The active identity now, then every change; an issued one comes
        // again with the identity actor's activation watchdog.
        args.bus
            .identity
            .subscribe_with_current(myself.clone(), |e| match e {
                IdentityEvent::Ready(r) => {
                    Some(CoordinatorMsg::Issued(Box::new(SigningIdentity {
                        generation: r.generation,
                        certificate: *r.certificate,
                        csr: r.csr,
                    })))
                }
                IdentityEvent::Active(a) => {
                    Some(CoordinatorMsg::Active(Box::new(SigningIdentity {
                        generation: a.generation,
                        certificate: a.certificate,
                        csr: a.csr,
                    })))
                }
                _ => None,
            });
        let mut tasks = Vec::new();
        {
            let mut record = args.record.clone();
            let me = myself.clone();
            tasks.push(tokio::spawn(async move {
                while record.changed().await.is_ok() {
                    if me.cast(CoordinatorMsg::Evaluate).is_err() {
                        break;
                    }
                }
            }));
        }
        {
            let mut board = args.board.subscribe();
            let me = myself.clone();
            tasks.push(tokio::spawn(async move {
                while board.changed().await.is_ok() {
                    if me.cast(CoordinatorMsg::Evaluate).is_err() {
                        break;
                    }
                    // The board changes on every guard read-back: a
                    // receipt needs no finer grain than this.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }));
        }
        tasks.push(
            myself.send_interval(args.refresh.min(Duration::from_secs(5)), || {
                CoordinatorMsg::Evaluate
            }),
        );
        myself.send_message(CoordinatorMsg::Evaluate)?;
        Ok(CoordinatorState {
            args,
            issued: None,
            active: None,
            last: None,
            logged_wait: None,
            blocked: None,
            tasks,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<CoordinatorMsg>,
        state: &mut CoordinatorState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        for t in state.tasks.drain(..) {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Evaluate => {}
            CoordinatorMsg::Issued(i) => {
                if state
                    .active
                    .as_ref()
                    .is_none_or(|a| a.generation < i.generation)
                {
                    state.issued = Some(*i);
                }
            }
            CoordinatorMsg::Active(a) => {
                if state
                    .issued
                    .as_ref()
                    .is_some_and(|i| i.generation <= a.generation)
                {
                    state.issued = None;
                }
                state.active = Some(*a);
            }
        }
        evaluate(state).await;
        Ok(())
    }
}

// The coordinator in the whole tree (permit, receipts, readiness) is
// tested with the tunnel actors: `tree::tunnel_tests`.
