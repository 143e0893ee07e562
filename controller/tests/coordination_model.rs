//! A model check of the cluster coordination protocol, enable AND disable
//! (SPEC §7, §8, §4 "Order" and "Marks follow IPsec intent"), that drives
//! the controller's real decision function,
//! [`controller::coordination::machine::decide`], and the real
//! record-side receipt checks: [`evidence::claims`] (over
//! [`Receipt::check_against`]) for the `Prepare`/`Arm` barriers and
//! admissions, [`evidence::release_claims`] (over
//! [`ReleaseReceipt::check_against`]) for the `Release` barrier.
//!
//! # What is modelled
//!
//! One state holds the stored record, `NB_Global.ipsec`, `SB_Global.ipsec`,
//! the live trust digest, the operator's intent, the running controller's
//! intent (`--enable-ipsec`), the DaemonSet's template (the agent shape or
//! the cleanup shape), and per node:
//! * its kube-ovn-cni Pod: none (the DaemonSet deleted the old one and has
//!   not created the new one yet), an agent Pod, or a cleanup Pod with its
//!   `ipsec-cleanup` init container running, proceeding (its checks passed
//!   against one record), failed (non-zero exit) or done (exit 0);
//! * the agent's local progress (`Idle`, `Prepared`, `Armed`; only in an
//!   agent Pod), the receipt it last sent, the receipt annotation on its
//!   Node and the receipt patches in flight;
//! * what the node holds, which survives Pods: XFRM guards, the lease
//!   published in OVSDB, the identity paths in OVSDB, an activated identity
//!   in the key directory (the release receipt's signer; cleanup keeps it),
//!   the IKE daemon (alive or gone), tunnels with IPsec intent, this
//!   project's SAs and policies, and foreign state (never to be removed);
//! * its release receipt annotation, and the operator's retirement request.
//!
//! The steps, interleaved in every order:
//!
//! * **controller pass**: build an [`Observation`] as the leader's loop does
//!   (the running controller's intent, the live DaemonSet with its template
//!   hash and shape, the live trust, the nodes with a DaemonSet Pod as
//!   scheduled, every Node, per target the verdict on its receipt, while
//!   `Enabled` per scheduled non-target its admission verdict, in `Release`
//!   per target its release verdict, the retirement requests, NB and SB
//!   with their row UUIDs where the loop reads them, while the intent is
//!   off the *claimants* — every Node that is not a target and whose
//!   annotations, as they are on the Node, claim state by the real
//!   [`evidence::claims_state`] (an enable-side receipt, no release
//!   receipt answering its epoch or a later one) —, a fresh challenge),
//!   call `decide` and remember a `Write`/`SetNb`. `Hold` and `Idle` change
//!   nothing.
//! * **controller performs** the remembered decision (a record write, which
//!   also consumes the retirements it carried out, or an NB write);
//!   **controller restarts** (the remembered decision is lost).
//! * **northd syncs**: `SB_Global.ipsec` takes NB's value (the SB lag).
//! * **ovn-controller syncs** a node's tunnels: they carry IPsec intent
//!   exactly while SB is true and the node's lease is published (the
//!   output-protection patch), one node at a time, later than SB.
//! * **the operator flips the intent** (a bounded number of times), and then
//!   in either order (with [`ProtocolModel::chart_first`]; otherwise the
//!   controller first): **the controller runs with the new intent** (a new
//!   controller process: the remembered decision is lost) and **the chart
//!   changes the DaemonSet's template** (the cleanup shape to disable, the
//!   agent shape to re-enable; each shape keeps its template hash, as a
//!   ControllerRevision does).
//! * **the DaemonSet rolls** one node at a time (`maxSurge: 0`,
//!   `maxUnavailable: 1`, an unavailable Pod of the old template is replaced
//!   at once): it deletes a node's old Pod, then, in a later step, creates
//!   one of the current template. A cleanup Pod is available once its init
//!   container completed; an agent Pod at once.
//! * **a node's agent acts** on the current record per SPEC (as in the
//!   enable model: `Prepare` receipt, arming in `Arm` — guards, then the
//!   lease, the identity activated, the IKE daemon started — and an `Arm`
//!   receipt, re-arming in `Enabled` after a restart), and does nothing on
//!   the disable side (arming is never undone by the record). A joiner (a
//!   node the `Enabled` record does not list) sends its `Prepare` receipt,
//!   arms only once that receipt is visible on its Node and the record,
//!   read in that step, is still `Enabled` (the coordinator's permit: a
//!   disable that starts later sees its claim), then sends its `Arm`
//!   receipt. **The agent restarts** (its progress and its IKE daemon are
//!   lost; what the node holds stays). Receipt patches
//!   **land** in any order or are **lost**, as in the enable model.
//! * **the IKE daemon of a deleted agent Pod exits** (later than the Pod);
//!   while the IKE daemon is alive and the tunnels have intent it installs
//!   this project's SAs (they stay after it exits: crash orphans).
//! * **the cleanup init container checks** (docs/cleanup.md): no activated
//!   identity and nothing held: exit 0 at once, nothing touched, no
//!   receipt. A target of a record that is not `Disabled` proceeds only
//!   when the record it reads is `Release`, its Pod's template is the one
//!   `Release` froze, the tunnels converged (no intent) and the IKE daemon
//!   is gone; else it waits (a bounded wait and the kubelet's restart look
//!   alike). Any other node (not a target, or the record `Disabled`) that
//!   holds nothing exits 0 at once; one that holds guards, a lease,
//!   identity paths or SAs waits while the record is `Prepare`, `Arm`,
//!   `Enabled` or `Disabling`, and once it is `Cleanup`, `Release` or
//!   `Disabled` after a disable (NB and SB were read false before `Cleanup`
//!   was written) proceeds after the same tunnel and IKE checks, *unasked*.
//!   (The node's code waits in `Cleanup` too: its behaviours are a subset
//!   of these, so every property checked here holds for it.) **It
//!   withdraws** in a later step, for the record it read: drains this
//!   project's SAs, withdraws the lease, removes its guards, clears the
//!   identity paths, publishes the release receipt for (generation, epoch,
//!   challenge, phase, Pod, template) if it has an identity to sign with
//!   (unasked, nobody waits for it: it ends the node's claim), exits 0.
//!   **It fails** (from the budget) either before withdrawing anything, or
//!   after publishing (its last step, removing the evidence files, fails);
//!   the **kubelet restarts** a failed init container. A completed init
//!   container never runs again for its Pod.
//! * **the operator** deletes a cleanup Pod whose init container completed
//!   with a receipt that no longer answers the `Release` record (what the
//!   controller's write says to do when the disable went back to
//!   `Disabling`; the DaemonSet creates a new Pod, whose init container runs
//!   again), and retires a target that cannot sign a release receipt (its
//!   init container completed with nothing to release: it never activated
//!   an identity, so it holds nothing; docs/cleanup.md).
//! * **someone turns NB true** behind the controller's back while the record
//!   is `Release` (from the budget).
//! * as in the enable model: **the trust rotates**, **the joiner is
//!   scheduled**.
//!
//! Release verdicts are the controller's evidence checks without the
//! signature and the CSR (unit-tested with real keys in
//! `coordination::evidence`): the receipt's Pod must be the node's live Pod,
//! from the frozen template, its init container terminated with exit 0, and
//! then the real [`evidence::release_claims`]. Barrier receipts likewise
//! need their Pod live and of the frozen template before
//! [`evidence::claims`].
//!
//! Faults, flips and operator NB writes come from a budget in the state,
//! and each node holds a bounded number of patches in flight, so the state
//! space is finite. Nodes other than the joiner are interchangeable, so the
//! model keeps one state per permutation of them
//! ([`ProtocolModel::canonicalise`]).
//!
//! Not modelled: signatures, CSR binding and freshness (the receipts are
//! genuine and fresh; `coordination::evidence`'s tests own those; a claim
//! is judged unverified, as the controller does), the agent's watch lag
//! (an agent reads the current record in the step it acts, as the joiner's
//! fresh read does), unreadable NB/SB, replaced `NB_Global`/`SB_Global`
//! rows, a re-created DaemonSet, Nodes deleted or re-created (`machine`'s
//! unit tests own those), annotations removed by hand (a Node re-created
//! or stripped of its receipt is what the cleanup's unasked release is
//! for; here the controller takes every node holding state in by
//! `Cleanup`, so the unasked release is a fallback the checks do not rely
//! on), a crash inside the agent's arming or inside the cleanup's
//! withdrawal (each is one step here; the cleanup's order makes a re-run
//! repeat it), SAs removed by a graceful IKE shutdown (the model keeps
//! every SA until the cleanup drains it), foreign state carrying the
//! lease's mark or reqid (the cleanup refuses it; `runtime`'s tests own
//! that), a second controller replica (leader election and the
//! resourceVersion precondition are the shell's).
//!
//! # Properties
//!
//! Safety (`always`):
//! * [`NB_GUARDED`]: `NB_Global.ipsec` is never true while any frozen target
//!   lacks armed guards, unless someone else turned NB on.
//! * [`TUNNELS_GUARDED`]: no node's tunnels have IPsec intent while it has
//!   no guards, unless someone else turned NB on.
//! * [`BARRIER_EPOCH`]: every barrier completion (`Prepare → Arm`,
//!   `SetNb(true)` in `Arm`, `Arm → Enabled`) was decided while every
//!   target's annotation was a receipt of the record's own generation,
//!   epoch and phase; every admission while the admitted node's annotation
//!   was an `Arm` receipt of the `Enabled` record's generation and epoch.
//! * [`ENABLED_CONFIRMED`]: the record is `Enabled` only with NB and SB true
//!   and every target guarded.
//! * [`RELEASE_EVIDENCE`]: `Release → Disabled` was decided while every
//!   target's release annotation answered the record's generation, epoch
//!   and challenge, from its live Pod, whose init container completed.
//! * [`DISABLED_RELEASED`]: `Disabled` is never written while a target of
//!   the `Release` record holds guards or this project's SAs without a
//!   release receipt that passes the controller's checks.
//! * [`CLEAN_AFTER_DISABLED`]: while the record is `Disabled` after a
//!   disable (and before a re-enable writes `Prepare`), no node at all holds
//!   guards, a published lease, identity paths or this project's SAs.
//! * [`GUARDS_KEPT_WHILE_ON`]: a node never withdraws its guards while NB or
//!   SB reads true, unless someone else turned NB on (the node reads the
//!   record and its tunnels, not NB: see
//!   [`an_nb_write_behind_the_controllers_back_races_a_release`]).
//! * [`FOREIGN_KEPT`]: foreign state is never removed.
//! * [`WRITES_CHANGE_SOMETHING`]: no record write changes only the epoch
//!   (such a write repeats on every pass: a livelock).
//! * [`DECIDE_OK`]: `decide` never returns an error.
//!
//! Liveness. Stateright's `eventually` reports only at terminal states and
//! treats a state reached twice (a join in the graph, or a cycle) as not
//! terminal, so alone it can miss counterexamples. The sound check here is
//! the pair:
//! * [`PROGRESS`] (`always`): every step strictly decreases a ranking
//!   ([`ProtocolModel::rank`]: the budget, the operator's changes not yet
//!   applied, the record's epoch and NB and SB following the intent, the
//!   controller's pending decision, the rollout, the cleanups, the
//!   retirements, the agents' receipts, leftover IKE daemons, tunnels
//!   behind SB). It is checked on every explored transition, including
//!   those into states already seen, so the reachable graph has no cycle;
//!   the checker finishing (asserted) shows it is finite (an epoch beyond
//!   [`EPOCH_CAP`] counts as a stalled step, so a livelock that keeps
//!   writing new epochs is reported, not explored forever).
//! * [`TERMINAL_INTENDED`] (`always`): every state in which no step changes
//!   anything has the record where the final intent wants it: `Enabled`
//!   with every scheduled node a target, or `Disabled`.
//!
//! Together: every maximal behaviour, whatever the scheduling, reaches the
//! operator's last intent (AF `Enabled` after a re-enable that stays,
//! AF `Disabled` after a disable that stays: no one-way door), with no
//! fairness assumption, for the budget given. The operator steps above are
//! part of that: the checks show they suffice, and
//! [`the_disable_needs_the_operators_steps`] shows which are needed.
//!
//! The checks are not vacuous: [`the_model_catches_broken_decisions`] and
//! [`the_model_catches_broken_disable_decisions`] run the model over
//! deliberately broken wrappers of `decide` (one blind to the claimants),
//! [`the_model_catches_broken_cleanups`] over broken node cleanups,
//! [`the_model_catches_a_joiner_arming_before_its_claim_is_visible`] over
//! a joiner that does not wait for its claim, and assert the checker finds
//! the counterexamples;
//! [`the_progress_check_catches_a_cycle`] does the same for the ranking.
//! `sometimes` properties show the disable and the re-enable happen at all.
//!
//! Which cases the earlier findings in `decide` came from, now checks:
//! a target whose Pod the chart's rollout removed before the controller saw
//! the intent ([`a_target_without_a_pod_is_still_asked_for_its_release`]),
//! a joiner armed for an admission that never came
//! ([`a_joiner_armed_for_admission_is_asked_for_its_release`]), a
//! retirement request left over from `Release` when the operator
//! re-enables ([`a_retirement_left_over_from_release_is_carried_out_once`];
//! [`protocol_model_n3`] keeps requests across flips too), a re-enable
//! before NB is off with a joiner
//! ([`a_reenable_before_nb_is_off_keeps_an_unarmed_joiner_out`]).
//!
//! A finding in the real `decide` is fixed before it lands; its case then
//! stays among these checks.
//!
//! # Running
//!
//! `cargo test -p kube-ovn-ipsec-controller --test coordination_model -- --nocapture`
//! prints the states explored and the time of each check, and the traces
//! of the open findings. The long modes:
//! `cargo test --release -p kube-ovn-ipsec-controller --test coordination_model -- --ignored --nocapture`
//! runs [`enable_model_long`] and [`protocol_model_long`]; their docs list
//! the environment variables that set the size and the budget.
// Test helpers outside #[test] fns panic on failure on purpose.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The test reports how long the check took: wall-clock time is the point.
#![allow(clippy::disallowed_methods)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use controller::coordination::evidence::{self, Answer};
use controller::coordination::machine::{
    Decision, LiveDaemonSet, Observation, Verdict, decide, retirements_done,
};
use kube_ovn_ipsec_api::SignatureAlgorithm;
use kube_ovn_ipsec_api::canonical::to_canonical_vec;
use kube_ovn_ipsec_api::coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, Receipt, ReceiptStatus, ReleaseReceipt,
    ReleaseStatus,
};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::time::Timestamp;
use stateright::{Checker, Expectation, HasDiscoveries, Model, Path, Property};
use uuid::Uuid;

/// Safety: NB on only while every frozen target is guarded.
const NB_GUARDED: &str = "NB_Global.ipsec is never true while a frozen target lacks armed guards";
/// Safety: no tunnel with intent and no guards.
const TUNNELS_GUARDED: &str = "no node's tunnels have IPsec intent while it has no guards";
/// Safety: barriers complete only on receipts of their own epoch.
const BARRIER_EPOCH: &str = "a barrier completes only on receipts of the record's epoch and phase";
/// Safety: `Enabled` is confirmed.
const ENABLED_CONFIRMED: &str = "Enabled only with NB and SB true and every target guarded";
/// Safety: the release barrier completes only on receipts answering it.
const RELEASE_EVIDENCE: &str = "Disabled is decided only on release receipts answering the record's \
     generation, epoch and challenge from a live Pod whose init container completed";
/// Safety: nothing held by a target without a valid release receipt.
const DISABLED_RELEASED: &str = "Disabled is never written while a target holds guards or project \
     SAs without a valid release receipt";
/// Safety: after `Disabled`, no node holds anything of this project.
const CLEAN_AFTER_DISABLED: &str = "while Disabled after a disable, no node holds guards, a lease, \
     identity paths or project SAs";
/// Safety: guards stay while the switch may be on.
const GUARDS_KEPT_WHILE_ON: &str = "a node never withdraws its guards while NB or SB reads true \
     (unless NB was turned on behind the controller's back)";
/// Safety, strict form: also without that exception (see
/// [`an_nb_write_behind_the_controllers_back_races_a_release`]).
const GUARDS_KEPT_WHILE_ON_STRICT: &str =
    "a node never withdraws its guards while NB or SB reads true";
/// Safety: every write changes something besides the epoch (one that
/// does not repeats on the next pass, and the next: a livelock).
const WRITES_CHANGE_SOMETHING: &str =
    "the controller never writes a record that differs from the stored one only in its epoch";
/// Safety: foreign state is never removed.
const FOREIGN_KEPT: &str = "foreign state is never removed";
/// Safety: the decision never fails on a record it wrote itself.
const DECIDE_OK: &str = "decide never returns an error";
/// Liveness, part one: no cycles.
const PROGRESS: &str = "every step decreases the ranking (no cycle)";
/// Liveness, part two: nothing is stuck short of the final intent.
const TERMINAL_INTENDED: &str = "every terminal state is the final intent: Enabled with every \
     scheduled node a target, or Disabled";
/// Stateright's `eventually` form of the enable side's liveness claim.
const REACHES_ENABLED: &str = "the record eventually reaches Enabled";
/// The model can enable at all (guards against a vacuous model).
const CAN_ENABLE: &str = "Enabled is reachable";
/// The model can disable at all.
const CAN_DISABLE: &str = "Disabled is reachable after a disable";
/// The model can re-enable after a disable started.
const CAN_REENABLE: &str = "Enabled is reachable again after a disable";
/// With the joiner: it can join after the NB flip and still be admitted
/// (guards against a model whose joiner always comes early).
const ADMITTED_AFTER_FLIP: &str = "a node joining after the NB flip is admitted";

/// The DaemonSet's template hash with the `ipsec` container.
const AGENT_TEMPLATE: &str = "tmpl-agent";
/// The DaemonSet's template hash with the `ipsec-cleanup` init container.
const CLEANUP_TEMPLATE: &str = "tmpl-cleanup";
/// An epoch no behaviour of the model should reach: beyond it a step
/// counts as stalled (a livelock writing new epochs), so the check ends.
const EPOCH_CAP: u64 = 48;

/// The signature of [`decide`], so a test can swap in a broken wrapper.
type DecideFn = fn(&CoordinationRecord, &Observation) -> controller::error::Result<Decision>;

/// The node's cleanup as docs/cleanup.md has it, or a broken one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeCleanup {
    /// As documented.
    Spec,
    /// Broken: withdraws in `Release` without waiting for its tunnels.
    IgnoresTunnels,
    /// Broken: withdraws as soon as the record is on the disable side,
    /// without waiting for its tunnels.
    Early,
    /// Broken: flushes every SA and policy, foreign ones too.
    Flush,
}

/// Agent-local progress, lost on restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Agent {
    /// Started (or no agent: not an agent Pod), nothing done for the
    /// current record.
    Idle,
    /// Identity ready and capability gate passed.
    Prepared,
    /// Guards armed, lease published, identity activated, IKE started.
    Armed,
}

/// The receipt status flags ([`ReceiptStatus`] without the digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Flags {
    identity: bool,
    capability: bool,
    armed: bool,
    applied: bool,
    healthy: bool,
}

impl Flags {
    /// What an agent in `agent` with guards `guards` reports.
    fn of(agent: Agent, guards: bool) -> Flags {
        let up = agent != Agent::Idle;
        let running = agent == Agent::Armed;
        Flags {
            identity: up,
            capability: up,
            armed: guards,
            applied: running,
            healthy: running,
        }
    }

    fn status(self) -> ReceiptStatus {
        ReceiptStatus {
            identity_ready: self.identity,
            capability_verified: self.capability,
            protection_armed: self.armed,
            configuration_applied: self.applied,
            runtime_healthy: self.healthy,
            certificate_digest: Sha256Digest::from_bytes([0xc0; 32]),
        }
    }
}

/// A receipt as the model tracks it: what the record-side checks read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Rcpt {
    generation: u64,
    epoch: u64,
    phase: CoordinationPhase,
    /// The trust bundle the agent used (see [`trust_digest`]).
    trust: u8,
    flags: Flags,
    /// Sent from the node's live Pod (false once the DaemonSet deleted it).
    live_pod: bool,
}

/// `phase`'s place in [`CoordinationPhase::ALL`]: a total order on phases
/// (the type has none), so states holding them have one canonical form.
fn phase_index(phase: CoordinationPhase) -> usize {
    CoordinationPhase::ALL
        .iter()
        .position(|p| *p == phase)
        .unwrap_or(usize::MAX)
}

impl Rcpt {
    /// A total order, so in-flight sets have one canonical form.
    fn key(&self) -> (u64, u64, usize, u8, Flags, bool) {
        (
            self.generation,
            self.epoch,
            phase_index(self.phase),
            self.trust,
            self.flags,
            self.live_pod,
        )
    }
}

impl PartialOrd for Rcpt {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rcpt {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// What a release receipt answers: the record's generation, epoch,
/// challenge (by [`challenge_id`]) and phase. A target's cleanup answers
/// `Release`; a node releasing unasked says what it read (`Cleanup`,
/// `Release` or `Disabled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RelKey {
    generation: u64,
    epoch: u64,
    challenge: u64,
    phase: CoordinationPhase,
}

impl RelKey {
    fn key(&self) -> (u64, u64, u64, usize) {
        (
            self.generation,
            self.epoch,
            self.challenge,
            phase_index(self.phase),
        )
    }
}

impl PartialOrd for RelKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RelKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// A release receipt annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RelRcpt {
    key: RelKey,
    /// Published by the node's live Pod (false once it was deleted).
    live_pod: bool,
}

/// The `ipsec-cleanup` init container of a cleanup Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Init {
    /// Running, or waiting to be restarted: checking, or waiting for the
    /// record, the tunnels or the IKE daemon.
    Running,
    /// Every check passed reading the record with this key: withdrawing.
    Proceeding(RelKey),
    /// Terminated with a non-zero exit code.
    Failed,
    /// Terminated with exit 0: never runs again for this Pod.
    Done,
}

/// A node's kube-ovn-cni Pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Pod {
    /// None: the DaemonSet deleted the old Pod and has not created the new
    /// one (the node is not scheduled to, as the controller counts it).
    Gap,
    /// With the `ipsec` container (the agent).
    Agent,
    /// With the `ipsec-cleanup` init container.
    Cleanup(Init),
}

impl Pod {
    /// Whether the DaemonSet counts it available.
    fn available(self) -> bool {
        matches!(self, Pod::Agent | Pod::Cleanup(Init::Done))
    }

    /// `Some(true)` for a cleanup Pod, `Some(false)` for an agent Pod.
    fn cleanup(self) -> Option<bool> {
        match self {
            Pod::Gap => None,
            Pod::Agent => Some(false),
            Pod::Cleanup(_) => Some(true),
        }
    }
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Node {
    pod: Pod,
    agent: Agent,
    /// The XFRM guards are in the kernel: survive Pods and restarts; only
    /// the cleanup removes them.
    guards: bool,
    /// The lease is published in OVSDB.
    lease: bool,
    /// The identity paths are set in OVSDB.
    identity: bool,
    /// The key directory has an activated identity (what the cleanup signs
    /// with; the cleanup keeps it).
    signer: bool,
    /// An IKE daemon is alive on the node.
    ike: bool,
    /// The node's tunnels carry IPsec intent (ovn-controller).
    intent: bool,
    /// This project's SAs and policies are in the kernel.
    sas: bool,
    /// Someone else's SAs and policies are in the kernel.
    foreign: bool,
    /// The receipt this agent last sent (agent memory).
    sent: Option<Rcpt>,
    /// The receipt annotation on the Node now.
    annotation: Option<Rcpt>,
    /// Receipt patches sent and not landed yet, sorted.
    in_flight: Vec<Rcpt>,
    /// The release receipt annotation on the Node now.
    release: Option<RelRcpt>,
    /// The operator asked to retire it.
    retire: bool,
}

impl Node {
    /// Holds anything of this project that the cleanup withdraws.
    fn holds(&self) -> bool {
        self.guards || self.lease || self.identity || self.sas
    }
}

/// The stored record, shared (it changes only when the controller writes,
/// so most steps copy a pointer) and hashed field by field
/// ([`CoordinationRecord`] has no `Hash`; the checker fingerprints states
/// by their hash).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rec(Arc<CoordinationRecord>);

impl Hash for Rec {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // Destructured in full so that a new record field fails to compile
        // here instead of silently merging distinct states.
        let CoordinationRecord {
            version,
            generation,
            epoch,
            phase,
            daemon_set_uid,
            template_hash,
            trust_hash,
            targets,
            challenge,
            nb_global_uuid,
            sb_global_uuid,
        } = &*self.0;
        (version, generation, epoch, phase).hash(h);
        (daemon_set_uid, template_hash, trust_hash, targets).hash(h);
        (challenge, nb_global_uuid, sb_global_uuid).hash(h);
    }
}

/// What the annotations were when a barrier completed, a joiner was
/// admitted, or the release barrier completed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Completion {
    Barrier {
        /// The receipts' phase it needed: the barrier's (`Prepare` or
        /// `Arm`), `Arm` for an admission.
        phase: CoordinationPhase,
        generation: u64,
        epoch: u64,
        /// Per node it relied on (every target; for an admission, the
        /// admitted), (generation, epoch, phase) of its annotation.
        evidence: Vec<Option<(u64, u64, CoordinationPhase)>>,
    },
    Release {
        /// The `Release` record's.
        key: RelKey,
        /// Per target, its release annotation and whether its Pod's init
        /// container had completed.
        evidence: Vec<Option<(RelRcpt, bool)>>,
    },
}

/// A decided step not yet performed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    Write(Rec),
    SetNb(bool),
}

/// The controller's memory between deciding and performing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pending {
    step: Step,
    /// Set when this step completes a barrier.
    completion: Option<Completion>,
}

/// The faults and operator actions still allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Budget {
    node_restarts: u8,
    controller_restarts: u8,
    losses: u8,
    rotations: u8,
    /// Operator intent flips (disable, re-enable, ...).
    flips: u8,
    /// NB turned on behind the controller's back during `Release`.
    external_nb: u8,
    /// Cleanup init containers exiting non-zero.
    cleanup_failures: u8,
}

impl Budget {
    fn total(&self) -> u32 {
        u32::from(self.node_restarts)
            + u32::from(self.controller_restarts)
            + u32::from(self.losses)
            + u32::from(self.rotations)
            + u32::from(self.flips)
            + u32::from(self.external_nb)
            + u32::from(self.cleanup_failures)
    }
}

/// Events a property is about, remembered once they happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Seen {
    /// A node withdrew its guards while NB or SB read true.
    withdrew_while_on: bool,
    /// ... and no one else had turned NB on.
    withdrew_while_on_unexcused: bool,
    /// `Disabled` was written while a target held guards or SAs without a
    /// valid release receipt.
    disabled_unreleased: bool,
    /// A pass decided a write that changes nothing but the epoch.
    empty_write: bool,
}

/// The whole cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    record: Rec,
    nb: bool,
    sb: bool,
    /// The live trust bundle (1 or 2; see [`trust_digest`]).
    trust: u8,
    /// The operator's intent.
    desired: bool,
    /// The running controller's intent (`--enable-ipsec`).
    want: bool,
    /// The DaemonSet's template is the cleanup shape.
    chart_cleanup: bool,
    /// NB was turned on behind the controller's back, and what it set off
    /// is not over yet (see the end of [`ProtocolModel::step`]).
    external: bool,
    nodes: Vec<Node>,
    pending: Option<Pending>,
    completions: Vec<Completion>,
    budget: Budget,
    /// With [`ProtocolModel::joiner`]: the last node is scheduled.
    joined: bool,
    /// It was scheduled while `NB_Global.ipsec` was true.
    joined_after_flip: bool,
    seen: Seen,
    /// `decide` failed on some pass (the message).
    decide_error: Option<String>,
    /// Some step did not decrease the ranking (the step).
    stalled: Option<String>,
}

/// A step of the system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Observe, decide, remember a `Write`/`SetNb`.
    ControllerPass,
    /// Perform the remembered decision.
    ControllerPerform,
    /// Crash between deciding and performing.
    ControllerRestart,
    /// SB takes NB's value.
    NorthdSync,
    /// Node `i`'s agent acts on the record (and sends its receipt).
    NodeAct(usize),
    /// Node `i`'s agent restarts.
    NodeRestart(usize),
    /// In-flight patch `k` of node `i` lands.
    Land(usize, usize),
    /// In-flight patch `k` of node `i` is lost.
    Lose(usize, usize),
    /// The trust bundle rotates.
    RotateTrust,
    /// The joiner becomes scheduled.
    Join,
    /// The operator flips the intent.
    FlipIntent,
    /// A controller with the operator's intent runs.
    IntentSeen,
    /// The chart sets the DaemonSet's template to the operator's intent.
    ChartApply,
    /// Someone turns NB on behind the controller's back.
    ExternalNb,
    /// The DaemonSet deletes node `i`'s Pod of the old template.
    Evict(usize),
    /// The DaemonSet creates node `i`'s Pod of the current template.
    Create(usize),
    /// Node `i`'s IKE daemon, whose agent is gone, exits.
    IkeExit(usize),
    /// Node `i`'s ovn-controller applies SB and the lease to its tunnels.
    OvnController(usize),
    /// Node `i`'s cleanup init container checks (exits 0, or proceeds).
    CleanupCheck(usize),
    /// Node `i`'s cleanup withdraws and publishes its release receipt.
    CleanupWithdraw(usize),
    /// Node `i`'s cleanup exits non-zero: `true` after publishing.
    CleanupFail(usize, bool),
    /// The kubelet restarts node `i`'s failed init container.
    KubeletRestart(usize),
    /// The operator deletes node `i`'s completed cleanup Pod.
    OperatorRerun(usize),
    /// The operator asks to retire node `i`.
    OperatorRetire(usize),
}

/// [`ProtocolModel::rank`]: budget; the operator's changes not yet
/// applied; record epoch, targets (fewer), NB following the intent, SB
/// following NB, joined (each rises, hence reversed); no decision pending;
/// the rollout; the cleanups; the retirements to request; the agents'
/// receipts; leftover IKE daemons; tunnels behind SB and the lease.
type Rank = (
    u32,
    u32,
    Reverse<(u64, Reverse<usize>, bool, bool, bool)>,
    bool,
    [u32; 6],
);

/// The model: how many nodes, the budget, the decision under test, and
/// which behaviours are explored.
#[derive(Clone)]
struct ProtocolModel {
    names: Vec<String>,
    uids: Vec<Uid>,
    /// Per node, its agent's Pod UID and CSR UID (receipt fields the
    /// record-side checks do not compare).
    pods: Vec<(Uid, Uid)>,
    faults: Budget,
    /// Most receipt patches one node may have in flight (0: a patch lands
    /// as it is sent).
    in_flight_cap: usize,
    /// The joiner's own cap, when it differs.
    joiner_in_flight_cap: Option<usize>,
    decide: DecideFn,
    cleanup: NodeCleanup,
    /// The last node is not scheduled at first and joins (once) at any
    /// moment: before the enable, into a barrier, after the NB flip, or
    /// while `Enabled`. It follows the agent's contract: a frozen target
    /// like any other; otherwise nothing until the record is `Enabled`,
    /// then a `Prepare` receipt, arming once that receipt is visible on
    /// its Node and the record (read in the same step) is still `Enabled`,
    /// and an `Arm` receipt, each for the record's current epoch.
    joiner: bool,
    /// The joiner's agent arms only once its receipt for the record is
    /// visible on its Node (the coordinator's permit); `false` is a broken
    /// agent that arms as soon as it sent its `Prepare` receipt.
    joiner_waits_for_claim: bool,
    /// The DaemonSet's template may change before a controller with the
    /// new intent runs (a chart upgrade changes both; the DaemonSet
    /// controller reacts at once, the controller's Deployment rolls and
    /// elects a leader). Otherwise the controller sees the intent first.
    chart_first: bool,
    /// ovn-controller applies SB to a node's tunnels in a step of its own
    /// (otherwise with SB's). The enable model keeps them together: the
    /// guards are armed before any SB change there.
    tunnel_lag: bool,
    /// Start from a settled `Enabled` cluster (every node armed, NB and SB
    /// true) rather than from nothing.
    start_enabled: bool,
    /// The IKE daemon of a deleted agent Pod exits in a step of its own
    /// (otherwise with its Pod).
    ike_lingers: bool,
    /// The DaemonSet creates a node's new Pod in a step of its own after
    /// deleting the old one, so a pass can see the node without a Pod
    /// (otherwise it replaces the Pod in one step).
    pod_gaps: bool,
    /// [`EPOCH_CAP`], or lower to find a livelock sooner.
    epoch_cap: u64,
    /// The operator withdraws every retirement request when flipping the
    /// intent (`retire-node NAME --withdraw`). Otherwise a request can
    /// outlast the `Release` it was made for (see
    /// [`a_retirement_left_over_from_release_is_carried_out_once`]).
    withdraw_retirements_on_flip: bool,
}

fn trust_digest(t: u8) -> Sha256Digest {
    Sha256Digest::from_bytes([t; 32])
}

fn now() -> Timestamp {
    Timestamp::from_unix(1_750_000_000).unwrap()
}

/// The challenge a `Disabling` written from a record of epoch `id - 1`
/// carries: a fresh one for every such write, as a random one would be.
fn challenge(id: u64) -> Challenge {
    let mut bytes = [0x5a; 32];
    bytes[..8].copy_from_slice(&id.to_be_bytes());
    Challenge::from_bytes(bytes)
}

fn challenge_id(c: &Challenge) -> u64 {
    u64::from_be_bytes(c.as_bytes()[..8].try_into().unwrap())
}

/// The record's release key (`None` without a challenge).
fn rel_key(record: &CoordinationRecord) -> Option<RelKey> {
    Some(RelKey {
        generation: record.generation,
        epoch: record.epoch,
        challenge: challenge_id(record.challenge.as_ref()?),
        phase: record.phase,
    })
}

/// `doc` as a Node annotation carries it (`payload.algorithm.signature`),
/// with a placeholder signature: what the controller decodes, unverified,
/// to judge a claim ([`evidence::claims_state`] verifies nothing).
fn envelope<T: serde::Serialize>(doc: &T) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(to_canonical_vec(doc).unwrap()),
        SignatureAlgorithm::EcdsaP256Sha256.name(),
        URL_SAFE_NO_PAD.encode([0x51]),
    )
}

const NB_ROW: Uuid = Uuid::from_u128(0x4e42);
const SB_ROW: Uuid = Uuid::from_u128(0x5342);

fn refused(check: &'static str, message: &str) -> Verdict {
    Verdict::Refused {
        check,
        message: message.into(),
    }
}

impl ProtocolModel {
    /// The enable model: intent on throughout, no rollout, no cleanup.
    fn new(nodes: usize, faults: Budget, decide: DecideFn) -> Self {
        ProtocolModel {
            names: (0..nodes).map(|i| format!("node-{i}")).collect(),
            uids: (0..nodes)
                .map(|i| Uid::new(format!("uid-node-{i}")).unwrap())
                .collect(),
            pods: (0..nodes)
                .map(|i| {
                    (
                        Uid::new(format!("pod-{i}")).unwrap(),
                        Uid::new(format!("csr-uid-{i}")).unwrap(),
                    )
                })
                .collect(),
            faults,
            in_flight_cap: 2,
            joiner_in_flight_cap: None,
            decide,
            cleanup: NodeCleanup::Spec,
            joiner: false,
            joiner_waits_for_claim: true,
            chart_first: false,
            tunnel_lag: false,
            start_enabled: false,
            ike_lingers: false,
            pod_gaps: false,
            epoch_cap: EPOCH_CAP,
            withdraw_retirements_on_flip: false,
        }
    }

    /// `nodes` nodes, the last of them the joiner. The others hold one
    /// receipt patch in flight, the joiner two (so its `Prepare` receipt
    /// can land after its `Arm` receipt): the barrier's reorderings with
    /// two in flight per node are the plain mixes', and one keeps this
    /// model within CI's time.
    fn with_joiner(nodes: usize, faults: Budget, decide: DecideFn) -> Self {
        ProtocolModel {
            joiner: true,
            in_flight_cap: 1,
            joiner_in_flight_cap: Some(2),
            ..ProtocolModel::new(nodes, faults, decide)
        }
    }

    /// The whole protocol: the intent flips `faults.flips` times, the
    /// DaemonSet rolls (with gaps), ovn-controller lags SB, a deleted
    /// agent Pod's IKE daemon exits later; receipt patches land at once
    /// (late and lost ones are the enable model's: set
    /// [`ProtocolModel::in_flight_cap`] for them).
    fn protocol(nodes: usize, faults: Budget, decide: DecideFn) -> Self {
        ProtocolModel {
            in_flight_cap: 0,
            tunnel_lag: true,
            ike_lingers: true,
            pod_gaps: true,
            ..ProtocolModel::new(nodes, faults, decide)
        }
    }

    /// Most receipt patches node `i` may have in flight.
    fn cap(&self, i: usize) -> usize {
        match self.joiner_in_flight_cap {
            Some(c) if self.joiner && i == self.names.len() - 1 => c,
            _ => self.in_flight_cap,
        }
    }

    fn index(&self, name: &str) -> usize {
        self.names.iter().position(|n| n == name).unwrap()
    }

    /// How many Nodes exist (the joiner's only once it joined).
    fn existing(&self, s: &State) -> usize {
        if self.joiner && !s.joined {
            self.names.len() - 1
        } else {
            self.names.len()
        }
    }

    /// Whether node `i` exists and has a DaemonSet Pod: what the leader's
    /// loop counts as scheduled.
    fn is_scheduled(&self, s: &State, i: usize) -> bool {
        i < self.existing(s) && s.nodes[i].pod != Pod::Gap
    }

    fn template(cleanup: bool) -> &'static str {
        if cleanup {
            CLEANUP_TEMPLATE
        } else {
            AGENT_TEMPLATE
        }
    }

    fn daemon_set(s: &State) -> LiveDaemonSet {
        LiveDaemonSet {
            uid: Uid::new("ds-uid-1").unwrap(),
            template_hash: Self::template(s.chart_cleanup).into(),
            cleanup_shape: s.chart_cleanup,
        }
    }

    /// The controller's verdict on node `i`'s barrier receipt `ann`: the
    /// Pod binding (live, of the frozen template; an agent Pod's receipt),
    /// then the real record-side checks [`evidence::judge`] ends with,
    /// [`evidence::claims`], as a target's barrier receipt or as an
    /// admission. Signature, CSR and freshness: all genuine here.
    fn verdict(
        &self,
        record: &CoordinationRecord,
        i: usize,
        ann: Option<Rcpt>,
        admission: bool,
    ) -> Verdict {
        let Some(r) = ann else {
            return Verdict::Missing;
        };
        if !r.live_pod {
            return refused("ReceiptPodNotLive", "the receipt's Pod was deleted");
        }
        if record.template_hash.as_deref() != Some(AGENT_TEMPLATE) {
            return refused(
                "ReceiptTemplateMismatch",
                "the Pod runs another template than the frozen one",
            );
        }
        let receipt = self.receipt_doc(i, r);
        let answer = if admission {
            Answer::Admission {
                node: &self.names[i],
                uid: &self.uids[i],
            }
        } else {
            Answer::Barrier
        };
        evidence::claims(record, answer, &receipt, now())
    }

    /// The controller's verdict on node `i`'s release receipt, as
    /// `evidence::judge_release` has it minus signature and CSR: the
    /// receipt's Pod is the node's live Pod, of the frozen template, its
    /// init container terminated with exit 0; then the real
    /// [`evidence::release_claims`] (over [`ReleaseReceipt::check_against`]).
    fn release_verdict(&self, s: &State, record: &CoordinationRecord, i: usize) -> Verdict {
        let n = &s.nodes[i];
        let Some(r) = n.release else {
            return Verdict::Missing;
        };
        // Only a cleanup Pod publishes one, and it stays live until the
        // DaemonSet or the operator deletes it.
        let Pod::Cleanup(init) = n.pod else {
            return refused("ReleaseReceiptPodNotLive", "the receipt's Pod was deleted");
        };
        if !r.live_pod {
            return refused("ReleaseReceiptPodNotLive", "the receipt's Pod was deleted");
        }
        if record.template_hash.as_deref() != Some(CLEANUP_TEMPLATE) {
            return refused(
                "ReleaseReceiptTemplateMismatch",
                "the Pod runs another template than the frozen one",
            );
        }
        match init {
            Init::Done => {}
            Init::Failed => return refused("ReleaseInitFailed", "exited with code 4"),
            Init::Running | Init::Proceeding(_) => {
                return refused("ReleaseInitNotTerminated", "is running");
            }
        }
        evidence::release_claims(record, &self.release_doc(s, i, r), now())
    }

    /// Node `i`'s barrier receipt `r` as its agent signs it.
    fn receipt_doc(&self, i: usize, r: Rcpt) -> Receipt {
        Receipt {
            generation: r.generation,
            epoch: r.epoch,
            phase: r.phase,
            node_name: self.names[i].clone(),
            node_uid: self.uids[i].clone(),
            pod_uid: self.pods[i].0.clone(),
            csr_name: format!("csr-{i}"),
            csr_uid: self.pods[i].1.clone(),
            template_hash: AGENT_TEMPLATE.into(),
            trust_hash: trust_digest(r.trust),
            observed: now(),
            status: r.flags.status(),
        }
    }

    /// Node `i`'s release receipt `r` as its cleanup signs it.
    fn release_doc(&self, s: &State, i: usize, r: RelRcpt) -> ReleaseReceipt {
        ReleaseReceipt {
            generation: r.key.generation,
            epoch: r.key.epoch,
            phase: r.key.phase,
            node_name: self.names[i].clone(),
            node_uid: self.uids[i].clone(),
            pod_uid: Uid::new(format!("cleanup-pod-{i}")).unwrap(),
            csr_name: format!("csr-{i}"),
            csr_uid: self.pods[i].1.clone(),
            template_hash: CLEANUP_TEMPLATE.into(),
            trust_hash: trust_digest(s.trust),
            observed: now(),
            challenge: challenge(r.key.challenge),
            status: ReleaseStatus {
                lease_withdrawn: true,
                guards_removed: true,
                identity_cleared: true,
                drained: true,
                boot_id: Uuid::from_u128(0xb007),
                certificate_digest: Sha256Digest::from_bytes([0xc0; 32]),
            },
            certificate: String::new(),
        }
    }

    /// The claimants `coordination::run` reads while the intent is off
    /// (the only passes whose `decide` takes them in): every existing Node
    /// that is not a target of the stored record and whose annotations, as
    /// they are on the Node now, claim state by the real
    /// [`evidence::claims_state`]. Encoding only non-targets keeps this off
    /// the model's hot path (they are few).
    fn claimants(&self, s: &State) -> BTreeMap<String, Uid> {
        if s.want {
            return BTreeMap::new();
        }
        (0..self.existing(s))
            .filter(|i| !self.is_target(s, *i))
            .filter(|i| {
                let n = &s.nodes[*i];
                let receipt = n.annotation.map(|r| envelope(&self.receipt_doc(*i, r)));
                let release = n.release.map(|r| envelope(&self.release_doc(s, *i, r)));
                evidence::claims_state(&self.uids[*i], receipt.as_deref(), release.as_deref())
            })
            .map(|i| (self.names[i].clone(), self.uids[i].clone()))
            .collect()
    }

    /// What the leader's loop reads in one pass (`coordination::run`).
    fn observe(&self, s: &State) -> Observation {
        use CoordinationPhase::*;
        let record = &s.record.0;
        let nodes: BTreeMap<String, Uid> = (0..self.existing(s))
            .map(|i| (self.names[i].clone(), self.uids[i].clone()))
            .collect();
        let scheduled: BTreeMap<String, Uid> = (0..self.existing(s))
            .filter(|i| self.is_scheduled(s, *i))
            .map(|i| (self.names[i].clone(), self.uids[i].clone()))
            .collect();
        let targets = || record.targets.keys().map(|name| (name, self.index(name)));
        // As the loop reads them: NB from Prepare on, SB from Arm on.
        let nb = (record.phase != Disabled).then_some(s.nb);
        let sb =
            matches!(record.phase, Arm | Enabled | Disabling | Cleanup | Release).then_some(s.sb);
        Observation {
            want_enabled: s.want,
            daemon_set: Some(Self::daemon_set(s)),
            trust: Some(trust_digest(s.trust)),
            scheduled,
            nodes,
            receipts: if matches!(record.phase, Prepare | Arm) {
                targets()
                    .map(|(name, i)| {
                        let v = self.verdict(record, i, s.nodes[i].annotation, false);
                        (name.clone(), v)
                    })
                    .collect()
            } else {
                BTreeMap::new()
            },
            admissions: if record.phase == Enabled {
                (0..self.existing(s))
                    .filter(|i| self.is_scheduled(s, *i) && !self.is_target(s, *i))
                    .map(|i| {
                        let v = self.verdict(record, i, s.nodes[i].annotation, true);
                        (self.names[i].clone(), v)
                    })
                    .collect()
            } else {
                BTreeMap::new()
            },
            retirements: self.retirements(s),
            nb_ipsec: nb,
            sb_ipsec: sb,
            nb_global_uuid: nb.map(|_| NB_ROW),
            sb_global_uuid: sb.map(|_| SB_ROW),
            releases: if record.phase == Release {
                targets()
                    .map(|(name, i)| (name.clone(), self.release_verdict(s, record, i)))
                    .collect()
            } else {
                BTreeMap::new()
            },
            claimants: self.claimants(s),
            fresh_challenge: challenge(record.epoch + 1),
        }
    }

    /// The operator's retirement requests: name → the frozen UID.
    fn retirements(&self, s: &State) -> BTreeMap<String, Uid> {
        (0..self.names.len())
            .filter(|i| s.nodes[*i].retire)
            .map(|i| (self.names[i].clone(), self.uids[i].clone()))
            .collect()
    }

    /// Every target of the record has its guards armed.
    fn targets_guarded(&self, s: &State) -> bool {
        s.record
            .0
            .targets
            .keys()
            .all(|n| s.nodes[self.index(n)].guards)
    }

    fn is_target(&self, s: &State, i: usize) -> bool {
        s.record.0.targets.contains_key(&self.names[i])
    }

    /// Whether node `i` is scheduled, not a target, and the record is
    /// `Enabled`: its agent asks for admission.
    fn admitting(&self, s: &State, i: usize) -> bool {
        self.is_scheduled(s, i)
            && !self.is_target(s, i)
            && s.record.0.phase == CoordinationPhase::Enabled
    }

    /// The receipt an agent in `agent` with guards `guards` sends now for
    /// the current record, as its barrier (or admission) `phase`.
    fn receipt_now(s: &State, phase: CoordinationPhase, agent: Agent, guards: bool) -> Rcpt {
        Rcpt {
            generation: s.record.0.generation,
            epoch: s.record.0.epoch,
            phase,
            trust: s.trust,
            flags: Flags::of(agent, guards),
            live_pod: true,
        }
    }

    /// Whether a joiner's receipt for the current record is visible on
    /// node `i`'s Node, from its live Pod: what its agent waits for before
    /// it arms (the coordinator's permit), so a disable that starts after
    /// it armed sees its claim.
    fn claim_visible(&self, s: &State, i: usize) -> bool {
        let record = &s.record.0;
        s.nodes[i].annotation.is_some_and(|a| {
            a.live_pod && (a.generation, a.epoch) == (record.generation, record.epoch)
        })
    }

    /// What node `i`'s agent does on the current record: its state and
    /// guards afterwards, and the receipt it then stands behind (`None`:
    /// the phase has no barrier). `None` overall: nothing to do (no agent
    /// Pod, no record yet, disable side, or waiting to be admitted).
    fn target(&self, s: &State, i: usize) -> Option<(Agent, bool, Option<Rcpt>)> {
        let n = &s.nodes[i];
        if n.pod != Pod::Agent {
            return None;
        }
        let record = &s.record.0;
        let receipt = |phase, agent, guards| Self::receipt_now(s, phase, agent, guards);
        if self.admitting(s, i) {
            // The agent's admission: a Prepare receipt once its identity
            // and capability are ready; once that receipt is visible on its
            // Node (the claim a disable takes in) and a fresh read of the
            // record (this step's) still shows `Enabled`, it arms on its
            // own (safe under an encrypted switch: no tunnel without its
            // lease) and sends its Arm receipt; each for the epoch it sees.
            let prepare = receipt(CoordinationPhase::Prepare, Agent::Prepared, n.guards);
            return Some(match n.agent {
                Agent::Idle => (Agent::Prepared, n.guards, Some(prepare)),
                Agent::Prepared if self.joiner_waits_for_claim && !self.claim_visible(s, i) => {
                    // Waits for the patch to land (re-sent if it was lost
                    // or the epoch moved).
                    (Agent::Prepared, n.guards, Some(prepare))
                }
                Agent::Prepared | Agent::Armed => (
                    Agent::Armed,
                    true,
                    Some(receipt(CoordinationPhase::Arm, Agent::Armed, true)),
                ),
            });
        }
        if !self.is_target(s, i) {
            return None;
        }
        match record.phase {
            CoordinationPhase::Prepare => {
                // Nothing is disarmed on the enable side: an agent armed in
                // an earlier epoch of this cycle stays armed.
                let agent = if n.agent == Agent::Armed {
                    Agent::Armed
                } else {
                    Agent::Prepared
                };
                Some((
                    agent,
                    n.guards,
                    Some(receipt(CoordinationPhase::Prepare, agent, n.guards)),
                ))
            }
            CoordinationPhase::Arm => Some((
                Agent::Armed,
                true,
                Some(receipt(CoordinationPhase::Arm, Agent::Armed, true)),
            )),
            CoordinationPhase::Enabled => Some((Agent::Armed, true, None)),
            _ => None,
        }
    }

    /// Whether node `i`'s agent would send its receipt now, and whether it
    /// has anything to do at all.
    fn node_work(&self, s: &State, i: usize) -> Option<(Agent, bool, Option<Rcpt>)> {
        let (agent, guards, receipt) = self.target(s, i)?;
        let n = &s.nodes[i];
        let send = receipt.filter(|r| {
            n.sent != Some(*r) || (n.annotation != Some(*r) && !n.in_flight.contains(r))
        });
        if send.is_some() && self.cap(i) > 0 && n.in_flight.len() >= self.cap(i) {
            // The agent's patch queue is full; landing or loss drains it.
            return None;
        }
        if agent == n.agent && guards == n.guards && send.is_none() {
            return None;
        }
        Some((agent, guards, send))
    }

    /// What node `i`'s cleanup init container does on its next check
    /// (docs/cleanup.md): `Done` (exit 0, nothing touched, no receipt),
    /// `Proceeding` (every check passed), or `None` (it waits).
    fn cleanup_check(&self, s: &State, i: usize) -> Option<Init> {
        let n = &s.nodes[i];
        if n.pod != Pod::Cleanup(Init::Running) {
            return None;
        }
        // Nothing held and no identity: nothing to release. (Arming
        // activates the identity, so a node without one holds nothing.)
        if !n.signer && !n.holds() {
            return Some(Init::Done);
        }
        let record = &s.record.0;
        if record.phase == CoordinationPhase::Disabled || !self.is_target(s, i) {
            // Not asked to release anything. Holding nothing, it is done.
            // Holding state (a joiner armed for an admission the disable
            // did not see, a target a cohort dropped), it waits while the
            // switch may be on, and once the controller has confirmed NB
            // and SB off (it wrote `Cleanup` on both reading false; then
            // `Release`, `Disabled`) it releases on its own after the same
            // local checks, so nothing stays behind and it does not wait
            // for a release nobody asks for.
            if !n.holds() {
                return Some(Init::Done);
            }
            let off = matches!(
                record.phase,
                CoordinationPhase::Cleanup
                    | CoordinationPhase::Release
                    | CoordinationPhase::Disabled
            ) && record.challenge.is_some();
            return (off && !n.intent && !n.ike)
                .then(|| Init::Proceeding(rel_key(record).unwrap()));
        }
        let release = record.phase == CoordinationPhase::Release
            && record.template_hash.as_deref() == Some(CLEANUP_TEMPLATE);
        let proceed = match self.cleanup {
            NodeCleanup::Spec | NodeCleanup::Flush => release && !n.intent && !n.ike,
            NodeCleanup::IgnoresTunnels => release && !n.ike,
            NodeCleanup::Early => record.phase.is_disable_side() && !n.ike,
        };
        proceed.then(|| Init::Proceeding(rel_key(record).unwrap()))
    }

    /// Node `i`'s cleanup withdraws, in docs/cleanup.md's order, and
    /// publishes its release receipt for the record it read (`key`) if it
    /// has an identity to sign with (a target that proceeded always has:
    /// holding anything means it armed; a node releasing unasked may not).
    fn withdraw(&self, s: &mut State, i: usize, key: RelKey) {
        let (nb, sb, external) = (s.nb, s.sb, s.external);
        let n = &mut s.nodes[i];
        if n.guards && (nb || sb) {
            s.seen.withdrew_while_on = true;
            if !external {
                s.seen.withdrew_while_on_unexcused = true;
            }
        }
        n.sas = false;
        if self.cleanup == NodeCleanup::Flush {
            n.foreign = false;
        }
        n.lease = false;
        n.guards = false;
        n.identity = false;
        if n.signer {
            n.release = Some(RelRcpt {
                key,
                live_pod: true,
            });
        }
    }

    /// Node `i`'s Pod is deleted and replaced by `pod`: its agent is gone,
    /// and the receipts it sent no longer name a live Pod.
    fn replace_pod(s: &mut State, i: usize, pod: Pod) {
        let n = &mut s.nodes[i];
        n.pod = pod;
        n.agent = Agent::Idle;
        n.sent = None;
        let dead = |r: &mut Rcpt| r.live_pod = false;
        n.annotation.iter_mut().for_each(dead);
        n.in_flight.iter_mut().for_each(dead);
        n.in_flight.sort();
        if let Some(r) = &mut n.release {
            r.live_pod = false;
        }
    }

    /// Whether `Release` holds on node `i`'s completed cleanup Pod for good:
    /// it can sign (it has an activated identity) but its release receipt
    /// is not this Pod's answer to this record (the disable went back to
    /// `Disabling`, or the init container completed when the node was not
    /// asked yet). Its init container never runs again by itself.
    fn needs_rerun(&self, s: &State, i: usize) -> bool {
        let record = &s.record.0;
        let n = &s.nodes[i];
        record.phase == CoordinationPhase::Release
            && self.is_target(s, i)
            && n.pod == Pod::Cleanup(Init::Done)
            && n.signer
            && !n
                .release
                .is_some_and(|r| r.live_pod && Some(r.key) == rel_key(record))
    }

    /// Whether the operator deletes node `i`'s cleanup Pod (the DaemonSet
    /// then creates a new one, whose init container runs): what the
    /// controller's write says to do when `Release` went back to
    /// `Disabling`, and what its status shows for such a node.
    fn rerun_wanted(&self, s: &State, i: usize) -> bool {
        s.chart_cleanup && self.needs_rerun(s, i)
    }

    /// Whether the operator retires node `i`: `Release` holds on it with no
    /// release receipt, its init container completed with nothing to
    /// release (no activated identity to sign with: it never armed, so it
    /// holds nothing; docs/cleanup.md says to retire it).
    fn retire_wanted(&self, s: &State, i: usize) -> bool {
        let n = &s.nodes[i];
        // Not for a disable the operator abandoned.
        !s.desired
            && s.record.0.phase == CoordinationPhase::Release
            && self.is_target(s, i)
            && n.pod == Pod::Cleanup(Init::Done)
            && n.release.is_none()
            && !n.signer
            && !n.retire
    }

    /// The ranking every step must decrease (lexicographically): see
    /// [`Rank`].
    fn rank(&self, s: &State) -> Rank {
        let budget = s.budget.total() + u32::from(self.joiner && !s.joined);
        let operator = u32::from(s.want != s.desired) + u32::from(s.chart_cleanup == s.desired);
        let record = &s.record.0;
        let progress = Reverse((
            record.epoch,
            Reverse(record.targets.len()),
            s.nb == s.want,
            s.sb == s.nb,
            s.joined,
        ));
        let key = rel_key(record);
        let mut per_node = [0u32; 6];
        for (i, n) in s.nodes.iter().enumerate() {
            // The rollout: a Pod of the old template, then none.
            per_node[0] += match n.pod.cleanup() {
                None => 1,
                Some(c) if c != s.chart_cleanup => 2,
                Some(_) => 0,
            };
            // The cleanup: a receipt that will not answer the record needs
            // the operator's re-run; a failed init container the kubelet.
            per_node[1] += match n.pod {
                Pod::Cleanup(Init::Proceeding(k)) if Some(k) == key => 1,
                Pod::Cleanup(Init::Proceeding(_)) => 6,
                Pod::Cleanup(Init::Done) if self.needs_rerun(s, i) => 5,
                Pod::Cleanup(Init::Failed) => 4,
                Pod::Cleanup(Init::Running) => 3,
                _ => 0,
            };
            per_node[2] += u32::from(self.retire_wanted(s, i));
            per_node[3] += self.node_rank(s, i);
            per_node[4] += u32::from(n.ike && n.agent != Agent::Armed);
            per_node[5] += u32::from(self.tunnel_lag && n.intent != (s.sb && n.lease));
        }
        (budget, operator, progress, s.pending.is_none(), per_node)
    }

    /// Per node: 16·(admission stages left: a `Prepare` receipt, then
    /// arming) + 4·(stale receipts in flight) + 2·(work left) + (copies of
    /// the current receipt in flight) + (annotation not current) +
    /// 2·(annotation not current and no copy in flight). Acting, re-sending
    /// and every landing each decrease it by at least one; an admission
    /// stage outweighs the rest (at most 13 with two in flight), which
    /// the stage's step may raise. Between the stages (a joiner waiting for
    /// its `Prepare` receipt to be visible) the current receipt is that
    /// one, whether or not it is visible yet: its landing is the progress,
    /// and a stale receipt landing over it costs what it would elsewhere.
    fn node_rank(&self, s: &State, i: usize) -> u32 {
        let n = &s.nodes[i];
        let stages = if self.admitting(s, i) && n.pod == Pod::Agent {
            match n.agent {
                Agent::Idle => 2,
                Agent::Prepared => 1,
                Agent::Armed => 0,
            }
        } else {
            0
        };
        16 * stages + self.receipt_rank(s, i)
    }

    /// [`Self::node_rank`] without the admission stages.
    fn receipt_rank(&self, s: &State, i: usize) -> u32 {
        let n = &s.nodes[i];
        let count = |pred: &dyn Fn(&Rcpt) -> bool| n.in_flight.iter().filter(|r| pred(r)).count();
        let goal = if self.admitting(s, i) && n.pod == Pod::Agent && n.agent == Agent::Prepared {
            let prepare = Self::receipt_now(s, CoordinationPhase::Prepare, n.agent, n.guards);
            Some((n.agent, n.guards, Some(prepare)))
        } else {
            self.target(s, i)
        };
        let Some((agent, guards, receipt)) = goal else {
            return 4 * count(&|_| true) as u32;
        };
        let work =
            agent != n.agent || guards != n.guards || (receipt.is_some() && n.sent != receipt);
        let Some(r) = receipt else {
            return 4 * count(&|_| true) as u32 + 2 * u32::from(work);
        };
        let stale = count(&|x| *x != r) as u32;
        let copies = count(&|x| *x == r) as u32;
        let not_current = n.annotation != Some(r);
        4 * stale
            + 2 * u32::from(work)
            + copies
            + u32::from(not_current)
            + 2 * u32::from(not_current && copies == 0)
    }

    /// Symmetry reduction: nodes other than the joiner differ only by name,
    /// so states that differ by a permutation of them (their names in the
    /// records' targets permuted alike) behave alike; the model keeps one,
    /// the one with those nodes sorted by whether the stored and the
    /// pending record target them, then by their state. Every property is
    /// symmetric (each quantifies over all targets or all nodes; the
    /// evidence is sorted too). A consequence for reading a counterexample:
    /// a node index in an action refers to the node order of the state
    /// before it. (Stateright's own `symmetry_fn` keeps indices stable but
    /// only in its DFS checker, which runs about twice as slowly here.)
    fn canonicalise(&self, s: &mut State) {
        let alike = s.nodes.len() - usize::from(self.joiner);
        let pending_targets = match &s.pending {
            Some(Pending {
                step: Step::Write(r),
                ..
            }) => Some(Arc::clone(&r.0)),
            _ => None,
        };
        let member = |r: &CoordinationRecord, j: usize| r.targets.contains_key(&self.names[j]);
        let key = |j: usize| {
            (
                !member(&s.record.0, j),
                pending_targets.as_ref().map(|r| !member(r, j)),
                &s.nodes[j],
            )
        };
        let mut order: Vec<usize> = (0..alike).collect();
        order.sort_by(|a, b| key(*a).cmp(&key(*b)));
        if order.iter().enumerate().any(|(p, j)| p != *j) {
            // Old index → new position.
            let mut pos: Vec<usize> = (0..s.nodes.len()).collect();
            for (p, j) in order.iter().enumerate() {
                pos[*j] = p;
            }
            let nodes = order
                .iter()
                .map(|j| s.nodes[*j].clone())
                .collect::<Vec<_>>();
            s.nodes.splice(..alike, nodes);
            let rename = |r: &Rec| -> Option<Rec> {
                // Only a target set the permutation changes needs a new
                // record (the UIDs follow the names: no Node is re-created).
                let moved =
                    r.0.targets
                        .keys()
                        .any(|n| !r.0.targets.contains_key(&self.names[pos[self.index(n)]]));
                moved.then(|| {
                    let mut next = (*r.0).clone();
                    next.targets =
                        r.0.targets
                            .keys()
                            .map(|n| {
                                let p = pos[self.index(n)];
                                (self.names[p].clone(), self.uids[p].clone())
                            })
                            .collect();
                    Rec(Arc::new(next))
                })
            };
            if let Some(r) = rename(&s.record) {
                s.record = r;
            }
            if let Some(Pending {
                step: Step::Write(r),
                ..
            }) = &mut s.pending
                && let Some(renamed) = rename(r)
            {
                *r = renamed;
            }
        }
        for c in &mut s.completions {
            match c {
                Completion::Barrier { evidence, .. } => {
                    evidence.sort_by_key(|e| e.map(|(g, ep, p)| (g, ep, p.as_str())));
                }
                Completion::Release { evidence, .. } => evidence.sort(),
            }
        }
    }

    /// Whether no step changes `s`. Every step but the controller's pass
    /// changes the state when enabled; the pass only on a `Write`/`SetNb`.
    fn is_terminal(&self, s: &State) -> bool {
        let mut actions = Vec::new();
        self.actions(s, &mut actions);
        match actions.as_slice() {
            [] => true,
            [Action::ControllerPass] => self.step(s, &Action::ControllerPass).is_none(),
            _ => false,
        }
    }

    /// Whether `action` can change `s`, short of deciding: every step but
    /// the controller's pass is known from the state alone.
    fn enabled(&self, s: &State, action: &Action) -> bool {
        let all_available = || (0..self.existing(s)).all(|j| s.nodes[j].pod.available());
        match *action {
            Action::ControllerPass => s.pending.is_none(),
            Action::ControllerPerform => s.pending.is_some(),
            Action::ControllerRestart => s.pending.is_some() && s.budget.controller_restarts > 0,
            Action::NorthdSync => s.sb != s.nb,
            Action::NodeAct(i) => self.node_work(s, i).is_some(),
            Action::NodeRestart(i) => {
                let n = &s.nodes[i];
                s.budget.node_restarts > 0
                    && n.pod == Pod::Agent
                    && (n.agent != Agent::Idle || n.sent.is_some())
            }
            Action::Land(i, k) => k < s.nodes[i].in_flight.len(),
            Action::Lose(i, k) => k < s.nodes[i].in_flight.len() && s.budget.losses > 0,
            // `Disabled` freezes whatever is live, and in `Enabled` only a
            // joiner's admission reads the trust, release receipts do not
            // compare it: a rotation elsewhere would only duplicate states.
            Action::RotateTrust => {
                s.budget.rotations > 0
                    && match s.record.0.phase {
                        CoordinationPhase::Prepare | CoordinationPhase::Arm => true,
                        CoordinationPhase::Enabled => {
                            self.joiner && s.joined && !self.is_target(s, self.names.len() - 1)
                        }
                        _ => false,
                    }
            }
            Action::Join => self.joiner && !s.joined,
            Action::FlipIntent => s.budget.flips > 0,
            Action::IntentSeen => s.want != s.desired,
            Action::ChartApply => {
                s.chart_cleanup == s.desired && (self.chart_first || s.want == s.desired)
            }
            Action::ExternalNb => {
                s.budget.external_nb > 0 && !s.nb && s.record.0.phase == CoordinationPhase::Release
            }
            Action::Evict(i) => {
                let pod = s.nodes[i].pod;
                i < self.existing(s)
                    && pod.cleanup().is_some_and(|c| c != s.chart_cleanup)
                    && (!pod.available() || all_available())
            }
            Action::Create(i) => i < self.existing(s) && s.nodes[i].pod == Pod::Gap,
            Action::IkeExit(i) => s.nodes[i].ike && s.nodes[i].agent != Agent::Armed,
            Action::OvnController(i) => {
                let n = &s.nodes[i];
                self.tunnel_lag && n.intent != (s.sb && n.lease)
            }
            Action::CleanupCheck(i) => self.cleanup_check(s, i).is_some(),
            Action::CleanupWithdraw(i) => {
                matches!(s.nodes[i].pod, Pod::Cleanup(Init::Proceeding(_)))
            }
            Action::CleanupFail(i, _) => {
                s.budget.cleanup_failures > 0
                    && matches!(s.nodes[i].pod, Pod::Cleanup(Init::Proceeding(_)))
            }
            Action::KubeletRestart(i) => s.nodes[i].pod == Pod::Cleanup(Init::Failed),
            Action::OperatorRerun(i) => self.rerun_wanted(s, i),
            Action::OperatorRetire(i) => self.retire_wanted(s, i),
        }
    }

    /// The controller's pass: decide, and remember what it would do.
    fn pass(&self, s: &State, next: &mut State) -> Option<()> {
        let o = self.observe(s);
        let decision = match (self.decide)(&s.record.0, &o) {
            Ok(d) => d,
            Err(e) => {
                next.decide_error = Some(e.to_string());
                return Some(());
            }
        };
        let record = &s.record.0;
        let evidence = |names: &mut dyn Iterator<Item = &String>| {
            names
                .map(|name| {
                    s.nodes[self.index(name)]
                        .annotation
                        .map(|r| (r.generation, r.epoch, r.phase))
                })
                .collect()
        };
        let barrier = |phase| Completion::Barrier {
            phase,
            generation: record.generation,
            epoch: record.epoch,
            evidence: evidence(&mut record.targets.keys()),
        };
        let (step, completion) = match decision {
            Decision::Write { record: to, .. } => {
                let mut same = (*to).clone();
                same.epoch = record.epoch;
                next.seen.empty_write |= same == **record;
                let mut admitted = to
                    .targets
                    .keys()
                    .filter(|n| !record.targets.contains_key(*n))
                    .peekable();
                use CoordinationPhase::*;
                let completion = match (record.phase, to.phase) {
                    (Prepare, Arm) | (Arm, Enabled) => Some(barrier(record.phase)),
                    (Enabled, Enabled) if admitted.peek().is_some() => Some(Completion::Barrier {
                        phase: Arm,
                        generation: record.generation,
                        epoch: record.epoch,
                        evidence: evidence(&mut admitted),
                    }),
                    (Release, Disabled) => Some(Completion::Release {
                        key: rel_key(record).unwrap(),
                        evidence: record
                            .targets
                            .keys()
                            .map(|name| {
                                let n = &s.nodes[self.index(name)];
                                n.release.map(|r| (r, n.pod == Pod::Cleanup(Init::Done)))
                            })
                            .collect(),
                    }),
                    _ => None,
                };
                (Step::Write(Rec(Arc::new(*to))), completion)
            }
            Decision::SetNb(v) => {
                let completes = v && record.phase != CoordinationPhase::Enabled;
                (Step::SetNb(v), completes.then(|| barrier(record.phase)))
            }
            Decision::Hold { .. } | Decision::Idle => return None,
        };
        next.pending = Some(Pending { step, completion });
        Some(())
    }

    /// The controller performs its pending write: `Disabled` is checked
    /// against what the targets hold now, and the retirements the write
    /// carried out are consumed (`coordination::run` does both in one
    /// store).
    fn perform(&self, s: &State, next: &mut State) -> Option<()> {
        let pending = next.pending.take()?;
        match pending.step {
            Step::Write(to) => {
                let stored = &s.record.0;
                if to.0.phase == CoordinationPhase::Disabled
                    && stored.phase == CoordinationPhase::Release
                {
                    let unreleased = stored.targets.keys().any(|name| {
                        let i = self.index(name);
                        let n = &s.nodes[i];
                        (n.guards || n.sas)
                            && self.release_verdict(s, stored, i) != Verdict::Satisfied
                    });
                    next.seen.disabled_unreleased |= unreleased;
                }
                for name in retirements_done(stored, &to.0, &self.retirements(s)) {
                    next.nodes[self.index(&name)].retire = false;
                }
                next.record = to;
            }
            Step::SetNb(v) => next.nb = v,
        }
        next.completions.extend(pending.completion);
        Some(())
    }

    /// The state after `action`, `None` when it changes nothing.
    fn step(&self, s: &State, action: &Action) -> Option<State> {
        if !self.enabled(s, action) {
            return None;
        }
        let mut next = s.clone();
        match *action {
            Action::ControllerPass => self.pass(s, &mut next)?,
            Action::ControllerPerform => self.perform(s, &mut next)?,
            Action::ControllerRestart => {
                next.pending = None;
                next.budget.controller_restarts -= 1;
            }
            Action::NorthdSync => next.sb = s.nb,
            Action::NodeAct(i) => {
                let (agent, guards, send) = self.node_work(s, i)?;
                let n = &mut next.nodes[i];
                n.agent = agent;
                n.guards = guards;
                if agent == Agent::Armed {
                    // Guards first, then the lease, the identity
                    // activated, the IKE daemon started (SPEC §4 "Order").
                    n.lease = true;
                    n.identity = true;
                    n.signer = true;
                    n.ike = true;
                }
                if let Some(r) = send {
                    n.sent = Some(r);
                    if self.cap(i) == 0 {
                        // No patch in flight: it lands at once.
                        n.annotation = Some(r);
                    } else {
                        n.in_flight.push(r);
                        n.in_flight.sort();
                    }
                }
            }
            Action::NodeRestart(i) => {
                let n = &mut next.nodes[i];
                n.agent = Agent::Idle;
                n.sent = None;
                n.ike = false;
                next.budget.node_restarts -= 1;
            }
            Action::Land(i, k) => {
                let n = &mut next.nodes[i];
                n.annotation = Some(n.in_flight.remove(k));
            }
            Action::Lose(i, k) => {
                next.nodes[i].in_flight.remove(k);
                next.budget.losses -= 1;
            }
            Action::RotateTrust => {
                next.trust = 3 - s.trust;
                next.budget.rotations -= 1;
            }
            Action::Join => {
                next.joined = true;
                next.joined_after_flip = s.nb;
                // Its first Pod is of the DaemonSet's current template.
                if s.chart_cleanup {
                    let last = self.names.len() - 1;
                    next.nodes[last].pod = Pod::Cleanup(Init::Running);
                }
            }
            Action::FlipIntent => {
                next.desired = !s.desired;
                next.budget.flips -= 1;
                if self.withdraw_retirements_on_flip {
                    next.nodes.iter_mut().for_each(|n| n.retire = false);
                }
            }
            Action::IntentSeen => {
                // A new controller process: nothing decided survives.
                next.want = s.desired;
                next.pending = None;
            }
            Action::ChartApply => next.chart_cleanup = !s.desired,
            Action::ExternalNb => {
                next.nb = true;
                next.external = true;
                next.budget.external_nb -= 1;
            }
            Action::Evict(i) => {
                let pod = match (self.pod_gaps, s.chart_cleanup) {
                    (true, _) => Pod::Gap,
                    (false, true) => Pod::Cleanup(Init::Running),
                    (false, false) => Pod::Agent,
                };
                Self::replace_pod(&mut next, i, pod);
                if !self.ike_lingers {
                    next.nodes[i].ike = false;
                }
            }
            Action::Create(i) => {
                next.nodes[i].pod = if s.chart_cleanup {
                    Pod::Cleanup(Init::Running)
                } else {
                    Pod::Agent
                };
            }
            Action::IkeExit(i) => next.nodes[i].ike = false,
            Action::OvnController(i) => {
                let n = &mut next.nodes[i];
                n.intent = s.sb && n.lease;
            }
            Action::CleanupCheck(i) => {
                next.nodes[i].pod = Pod::Cleanup(self.cleanup_check(s, i)?);
            }
            Action::CleanupWithdraw(i) => {
                let Pod::Cleanup(Init::Proceeding(key)) = s.nodes[i].pod else {
                    return None;
                };
                self.withdraw(&mut next, i, key);
                next.nodes[i].pod = Pod::Cleanup(Init::Done);
            }
            Action::CleanupFail(i, after_publish) => {
                let Pod::Cleanup(Init::Proceeding(key)) = s.nodes[i].pod else {
                    return None;
                };
                if after_publish {
                    self.withdraw(&mut next, i, key);
                }
                next.nodes[i].pod = Pod::Cleanup(Init::Failed);
                next.budget.cleanup_failures -= 1;
            }
            Action::KubeletRestart(i) => next.nodes[i].pod = Pod::Cleanup(Init::Running),
            Action::OperatorRerun(i) => {
                Self::replace_pod(&mut next, i, Pod::Cleanup(Init::Running));
            }
            Action::OperatorRetire(i) => next.nodes[i].retire = true,
        }
        // What follows at once: tunnels (without the lag), SAs from a live
        // IKE daemon on tunnels with intent, the end of an NB write
        // behind the controller's back.
        for n in &mut next.nodes {
            if !self.tunnel_lag {
                n.intent = next.sb && n.lease;
            }
            n.sas |= n.ike && n.intent;
        }
        // An NB write behind the controller's back is over once NB and SB
        // read false, no tunnel carries intent and no cleanup acts on
        // checks it made meanwhile.
        if !next.nb
            && !next.sb
            && next
                .nodes
                .iter()
                .all(|n| !n.intent && !matches!(n.pod, Pod::Cleanup(Init::Proceeding(_))))
        {
            next.external = false;
        }
        Some(next)
    }

    /// The settled `Enabled` cluster [`ProtocolModel::start_enabled`]
    /// starts from: generation 1, every node armed with its `Arm` receipt
    /// landed, NB and SB true, SAs up.
    fn enabled_start(&self, mut s: State) -> State {
        use CoordinationPhase::*;
        let mut record = CoordinationRecord::initial()
            .transition(Prepare, None)
            .unwrap();
        record.daemon_set_uid = Some(Self::daemon_set(&s).uid);
        record.template_hash = Some(AGENT_TEMPLATE.into());
        record.trust_hash = Some(trust_digest(s.trust));
        record.targets = (0..self.existing(&s))
            .map(|i| (self.names[i].clone(), self.uids[i].clone()))
            .collect();
        let arm = record.transition(Arm, None).unwrap();
        let receipt = Rcpt {
            generation: arm.generation,
            epoch: arm.epoch,
            phase: Arm,
            trust: s.trust,
            flags: Flags::of(Agent::Armed, true),
            live_pod: true,
        };
        s.record = Rec(Arc::new(arm.transition(Enabled, None).unwrap()));
        s.nb = true;
        s.sb = true;
        let existing = self.existing(&s);
        for n in &mut s.nodes[..existing] {
            n.agent = Agent::Armed;
            (n.guards, n.lease, n.identity, n.signer) = (true, true, true, true);
            (n.ike, n.intent, n.sas) = (true, true, true);
            n.sent = Some(receipt);
            n.annotation = Some(receipt);
        }
        s
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let node = Node {
            pod: Pod::Agent,
            agent: Agent::Idle,
            guards: false,
            lease: false,
            identity: false,
            signer: false,
            ike: false,
            intent: false,
            sas: false,
            foreign: true,
            sent: None,
            annotation: None,
            in_flight: Vec::new(),
            release: None,
            retire: false,
        };
        let s = State {
            record: Rec(Arc::new(CoordinationRecord::initial())),
            nb: false,
            sb: false,
            trust: 1,
            desired: true,
            want: true,
            chart_cleanup: false,
            external: false,
            nodes: vec![node; self.names.len()],
            pending: None,
            completions: Vec::new(),
            budget: self.faults,
            joined: false,
            joined_after_flip: false,
            seen: Seen::default(),
            decide_error: None,
            stalled: None,
        };
        vec![if self.start_enabled {
            self.enabled_start(s)
        } else {
            s
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.decide_error.is_some() || s.stalled.is_some() {
            // Already a counterexample: do not explore past it.
            return;
        }
        let mut candidates = vec![
            Action::ControllerPass,
            Action::ControllerPerform,
            Action::ControllerRestart,
            Action::NorthdSync,
            Action::RotateTrust,
            Action::Join,
            Action::FlipIntent,
            Action::IntentSeen,
            Action::ChartApply,
            Action::ExternalNb,
        ];
        for (i, n) in s.nodes.iter().enumerate() {
            candidates.extend([
                Action::NodeAct(i),
                Action::NodeRestart(i),
                Action::Evict(i),
                Action::Create(i),
                Action::IkeExit(i),
                Action::OvnController(i),
                Action::CleanupCheck(i),
                Action::CleanupWithdraw(i),
                Action::CleanupFail(i, false),
                Action::CleanupFail(i, true),
                Action::KubeletRestart(i),
                Action::OperatorRerun(i),
                Action::OperatorRetire(i),
            ]);
            for k in 0..n.in_flight.len() {
                // Equal copies give equal successors: one of each.
                if k > 0 && n.in_flight[k] == n.in_flight[k - 1] {
                    continue;
                }
                candidates.push(Action::Land(i, k));
                candidates.push(Action::Lose(i, k));
            }
        }
        actions.extend(candidates.into_iter().filter(|a| self.enabled(s, a)));
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = self.step(s, &action)?;
        if next.decide_error.is_none() {
            if next.record.0.epoch > self.epoch_cap {
                let cap = self.epoch_cap;
                next.stalled = Some(format!("{action:?}: the epoch passed {cap}"));
            } else if self.rank(&next) >= self.rank(s) {
                next.stalled = Some(format!("{action:?}"));
            }
        }
        self.canonicalise(&mut next);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(NB_GUARDED, |m: &ProtocolModel, s: &State| {
                !s.nb || s.external || m.targets_guarded(s)
            }),
            Property::always(TUNNELS_GUARDED, |_, s: &State| {
                s.external || s.nodes.iter().all(|n| !n.intent || n.guards)
            }),
            Property::always(BARRIER_EPOCH, |_, s: &State| {
                s.completions.iter().all(|c| match c {
                    Completion::Barrier {
                        phase,
                        generation,
                        epoch,
                        evidence,
                    } => evidence
                        .iter()
                        .all(|e| *e == Some((*generation, *epoch, *phase))),
                    Completion::Release { .. } => true,
                })
            }),
            Property::always(ENABLED_CONFIRMED, |m: &ProtocolModel, s: &State| {
                s.record.0.phase != CoordinationPhase::Enabled
                    || (s.nb && s.sb && m.targets_guarded(s))
            }),
            Property::always(RELEASE_EVIDENCE, |_, s: &State| {
                s.completions.iter().all(|c| match c {
                    Completion::Release { key, evidence } => evidence.iter().all(|e| {
                        *e == Some((
                            RelRcpt {
                                key: *key,
                                live_pod: true,
                            },
                            true,
                        ))
                    }),
                    Completion::Barrier { .. } => true,
                })
            }),
            Property::always(DISABLED_RELEASED, |_, s: &State| {
                !s.seen.disabled_unreleased
            }),
            Property::always(CLEAN_AFTER_DISABLED, |_, s: &State| {
                let r = &s.record.0;
                r.phase != CoordinationPhase::Disabled
                    || r.generation == 0
                    || s.nodes.iter().all(|n| !n.holds())
            }),
            Property::always(GUARDS_KEPT_WHILE_ON, |_, s: &State| {
                !s.seen.withdrew_while_on_unexcused
            }),
            Property::always(WRITES_CHANGE_SOMETHING, |_, s: &State| !s.seen.empty_write),
            Property::always(FOREIGN_KEPT, |_, s: &State| {
                s.nodes.iter().all(|n| n.foreign)
            }),
            Property::always(DECIDE_OK, |_, s: &State| s.decide_error.is_none()),
            Property::always(PROGRESS, |_, s: &State| s.stalled.is_none()),
            Property::always(TERMINAL_INTENDED, |m: &ProtocolModel, s: &State| {
                let phase = s.record.0.phase;
                !m.is_terminal(s)
                    || if s.want {
                        phase == CoordinationPhase::Enabled
                            && (0..m.existing(s))
                                .all(|i| !m.is_scheduled(s, i) || m.is_target(s, i))
                    } else {
                        phase == CoordinationPhase::Disabled
                    }
            }),
            Property::sometimes(CAN_ENABLE, |_, s: &State| {
                s.record.0.phase == CoordinationPhase::Enabled
            }),
        ];
        if self.faults.flips == 0 {
            properties.push(Property::eventually(REACHES_ENABLED, |_, s: &State| {
                s.record.0.phase == CoordinationPhase::Enabled
            }));
        } else {
            properties.push(Property::sometimes(CAN_DISABLE, |_, s: &State| {
                s.record.0.phase == CoordinationPhase::Disabled && s.record.0.generation > 0
            }));
        }
        if self.faults.flips >= 2 {
            properties.push(Property::sometimes(CAN_REENABLE, |_, s: &State| {
                // Generations: 1 enable, 2 disable, 3 the re-enable.
                s.record.0.phase == CoordinationPhase::Enabled && s.record.0.generation >= 3
            }));
        }
        if self.joiner {
            properties.push(Property::sometimes(
                ADMITTED_AFTER_FLIP,
                |m: &ProtocolModel, s: &State| {
                    s.joined_after_flip && m.is_target(s, m.names.len() - 1)
                },
            ));
        }
        properties
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

const fn budget(node_restarts: u8, controller_restarts: u8, losses: u8, rotations: u8) -> Budget {
    Budget {
        node_restarts,
        controller_restarts,
        losses,
        rotations,
        flips: 0,
        external_nb: 0,
        cleanup_failures: 0,
    }
}

/// `base` with `flips` intent flips, `external_nb` NB writes behind the
/// controller's back and `cleanup_failures` failed cleanups.
const fn with_disable(base: Budget, flips: u8, external_nb: u8, cleanup_failures: u8) -> Budget {
    Budget {
        flips,
        external_nb,
        cleanup_failures,
        ..base
    }
}

/// Explores the whole state space and asserts every property; returns the
/// states explored.
fn check_all(model: ProtocolModel, label: &str) -> usize {
    let nodes = model.names.len();
    let faults = model.faults;
    let started = Instant::now();
    let checker = model.checker().threads(threads()).spawn_bfs().join();
    let took = started.elapsed();
    println!(
        "{label}: N={nodes}, faults {faults:?}: {} states explored ({} unique), max depth {}, in {took:.2?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
    );
    assert!(checker.is_done(), "{label}: the check did not finish");
    // Stateright's own assertion prints whole states; a compact trace of
    // each counterexample is what one reads.
    let mut failed = Vec::new();
    for p in checker.model().properties() {
        match (p.expectation, checker.discovery(p.name)) {
            (Expectation::Sometimes, None) => failed.push(format!("{}: never", p.name)),
            (Expectation::Always | Expectation::Eventually, Some(path)) => {
                println!("{label}: counterexample for {:?}:", p.name);
                print_path(&path);
                let last = path.last_state();
                if let Some(why) = last.stalled.as_ref().or(last.decide_error.as_ref()) {
                    println!("  ({why})");
                }
                failed.push(p.name.to_owned());
            }
            _ => {}
        }
    }
    assert!(failed.is_empty(), "{label}: {failed:?}");
    checker.unique_state_count()
}

/// Prints a counterexample step by step: each action, then the record,
/// NB/SB and what each node holds after it.
fn print_path(path: &Path<State, Action>) {
    let states = path.clone().into_states();
    let actions = path.clone().into_actions();
    for (k, s) in states.iter().enumerate() {
        if k > 0 {
            println!("    -> {:?}", actions[k - 1]);
        }
        let r = &s.record.0;
        let nodes: Vec<String> = s
            .nodes
            .iter()
            .map(|n| {
                let held: String = [
                    (n.guards, 'g'),
                    (n.lease, 'l'),
                    (n.identity, 'i'),
                    (n.sas, 's'),
                    (n.ike, 'k'),
                    (n.intent, 't'),
                ]
                .iter()
                .map(|(b, c)| if *b { *c } else { '-' })
                .collect();
                format!("{:?}/{:?}/{held}", n.pod, n.agent)
            })
            .collect();
        println!(
            "  {} gen {} epoch {} targets {:?} | NB {} SB {} | intent {} chart {} | {}",
            r.phase,
            r.generation,
            r.epoch,
            r.targets.keys().collect::<Vec<_>>(),
            s.nb,
            s.sb,
            s.want,
            if s.chart_cleanup { "cleanup" } else { "agent" },
            nodes.join(" "),
        );
    }
}

/// Runs `model` until it finds a counterexample for each of `want`, and
/// returns them (panicking if one is missing).
fn find(
    model: ProtocolModel,
    label: &str,
    want: &[&'static str],
) -> BTreeMap<&'static str, Path<State, Action>> {
    let want: BTreeSet<&'static str> = want.iter().copied().collect();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AllOf(want.clone()))
        .spawn_bfs()
        .join();
    println!(
        "{label}: {} states explored in {:.2?}",
        checker.state_count(),
        started.elapsed()
    );
    want.into_iter()
        .map(|property| {
            let path = checker
                .discovery(property)
                .unwrap_or_else(|| panic!("{label}: no counterexample for {property:?}"));
            println!(
                "  {property}: counterexample of {} steps",
                path.clone().into_actions().len()
            );
            (property, path)
        })
        .collect()
}

/// N=3, two patches in flight per node, in three fault mixes (all of them
/// at once is the long mode's, about a million states):
/// * a trust rotation (a re-freeze to a new `Prepare` epoch) with a node
///   restart: a node's receipts of the old epoch, sent twice across the
///   restart, land late against the new barrier;
/// * a trust rotation with a lost receipt and a controller crash between
///   deciding and writing;
/// * no rotation, but two node restarts, two losses, two controller
///   crashes.
#[test]
fn enable_model_n3() {
    let started = Instant::now();
    let mut states = 0;
    for (label, faults) in [
        ("stale epochs", budget(1, 0, 0, 1)),
        ("stale epochs, loss, crash", budget(0, 1, 1, 1)),
        ("restarts and losses", budget(2, 2, 2, 0)),
    ] {
        states += check_all(ProtocolModel::new(3, faults, decide), label);
    }
    println!(
        "enable_model_n3: {states} unique states in all, {:.2?}",
        started.elapsed()
    );
}

/// `KOI_MODEL_NODES` nodes (default 4) with every fault at once: a node
/// restart, a controller crash, a lost receipt and a trust rotation
/// (`KOI_MODEL_FAULTS=r,c,l,t` overrides). N=4: about 8.1 million states,
/// three minutes and 1.2 GB in a release build on two cores.
/// `KOI_MODEL_JOINER=1` makes the last node the joiner, with two receipts
/// in flight for every node.
#[test]
#[ignore = "long: run with --ignored, in release"]
fn enable_model_long() {
    let nodes = env_nodes();
    let faults = std::env::var("KOI_MODEL_FAULTS").ok().map(|v| {
        let f: Vec<u8> = v.split(',').map(|x| x.parse().unwrap()).collect();
        budget(f[0], f[1], f[2], f[3])
    });
    let mut model = ProtocolModel::new(nodes, faults.unwrap_or(budget(1, 1, 1, 1)), decide);
    if std::env::var("KOI_MODEL_JOINER").is_ok_and(|v| v == "1") {
        model.joiner = true;
    }
    check_all(model, "enable_model_long");
}

fn env_nodes() -> usize {
    std::env::var("KOI_MODEL_NODES")
        .ok()
        .map(|v| v.parse().expect("KOI_MODEL_NODES must be a number"))
        .unwrap_or(4)
}

/// One check of the whole protocol: where it starts, its budget, and which
/// of the model's finer interleavings it keeps (each mix keeps CI's time;
/// the long mode keeps them all).
struct Mix {
    label: &'static str,
    faults: Budget,
    /// From a settled `Enabled` cluster rather than from nothing.
    from_enabled: bool,
    /// A pass can see a node without a Pod during a rollout.
    gaps: bool,
    /// ovn-controller lags SB, a deleted agent Pod's IKE daemon exits later.
    lags: bool,
    /// Receipt patches in flight per node.
    in_flight: usize,
}

impl Mix {
    fn model(&self) -> ProtocolModel {
        let mut m = ProtocolModel::protocol(3, self.faults, decide);
        m.start_enabled = self.from_enabled;
        m.pod_gaps = self.gaps;
        m.tunnel_lag = self.lags;
        m.ike_lingers = self.lags;
        m.in_flight_cap = self.in_flight;
        m
    }
}

/// The whole protocol, N=3, in mixes that each stay within CI's time:
/// * a disable at any moment from nothing (into the first barrier, after
///   the flip, in `Enabled`; targets that never armed are retired), with a
///   node restart, a controller crash and a receipt patch in flight;
/// * a disable and a re-enable at any moment from nothing (the re-enable
///   abandons the disable wherever it is: `Disabling`, `Cleanup`,
///   `Release`, or after `Disabled`), with a controller crash;
/// * from `Enabled`, a disable and a re-enable with the rollout's gaps (the
///   re-enable's `Prepare` restarts as nodes lose and regain their Pods);
/// * from `Enabled`, a disable with NB turned on behind the controller's
///   back during `Release` (back to `Disabling` with a new challenge: the
///   completed cleanups must run again) and a controller crash;
/// * from `Enabled`, a disable and a re-enable with NB turned on during
///   `Release`;
/// * from `Enabled`, a disable with two failed cleanups (before
///   withdrawing, or after publishing the receipt), a node restart, a
///   controller crash and a lost receipt.
///
/// The operator's retirement requests stay when the intent flips (a
/// request can outlast the `Release` it was made for).
#[test]
fn protocol_model_n3() {
    let started = Instant::now();
    let mut states = 0;
    let mixes = [
        Mix {
            label: "disable",
            faults: with_disable(budget(1, 1, 0, 0), 1, 0, 0),
            from_enabled: false,
            gaps: true,
            lags: true,
            in_flight: 1,
        },
        Mix {
            label: "disable, re-enable",
            faults: with_disable(budget(0, 1, 0, 0), 2, 0, 0),
            from_enabled: false,
            gaps: false,
            lags: true,
            in_flight: 0,
        },
        Mix {
            label: "disable, re-enable, rollout gaps",
            faults: with_disable(budget(0, 0, 0, 0), 2, 0, 0),
            from_enabled: true,
            gaps: true,
            lags: false,
            in_flight: 0,
        },
        Mix {
            label: "disable, NB on during Release",
            faults: with_disable(budget(0, 1, 0, 0), 1, 1, 0),
            from_enabled: true,
            gaps: true,
            lags: true,
            in_flight: 0,
        },
        Mix {
            label: "disable, re-enable, NB on during Release",
            faults: with_disable(budget(0, 0, 0, 0), 2, 1, 0),
            from_enabled: true,
            gaps: false,
            lags: true,
            in_flight: 0,
        },
        Mix {
            label: "disable, failed cleanups",
            faults: with_disable(budget(1, 1, 1, 0), 1, 0, 2),
            from_enabled: true,
            gaps: true,
            lags: true,
            in_flight: 1,
        },
    ];
    for mix in mixes {
        states += check_all(mix.model(), mix.label);
    }
    println!(
        "protocol_model_n3: {states} unique states in all, {:.2?}",
        started.elapsed()
    );
}

/// The whole protocol from nothing, with the rollout's gaps:
/// `KOI_MODEL_NODES` nodes (default 3), `KOI_MODEL_PROTOCOL=r,c,l,t,f,x,k`
/// the budget (node restarts, controller crashes, losses, rotations,
/// intent flips, NB writes behind the controller's back, failed cleanups;
/// default `0,1,0,0,2,0,0`: a crash, a disable and a re-enable: millions
/// of states, minutes in release on two cores),
/// `KOI_MODEL_IN_FLIGHT` receipt patches in flight (default 0). Switches
/// (`=1`): `KOI_MODEL_LAGS` adds ovn-controller's lag behind SB and
/// lingering IKE daemons (every interleaving the model has: far larger);
/// `KOI_MODEL_NO_GAPS` drops the gaps; `KOI_MODEL_FROM_ENABLED` starts from
/// `Enabled`; `KOI_MODEL_JOINER` adds the joiner and
/// `KOI_MODEL_CHART_FIRST` lets the template change before the controller
/// sees the intent; `KOI_MODEL_WITHDRAW_RETIREMENTS` has the operator
/// withdraw retirement requests when flipping the intent;
/// `KOI_MODEL_EPOCH_CAP` lowers [`EPOCH_CAP`].
#[test]
#[ignore = "long: run with --ignored, in release"]
fn protocol_model_long() {
    let nodes = std::env::var("KOI_MODEL_NODES")
        .ok()
        .map(|v| v.parse().expect("KOI_MODEL_NODES must be a number"))
        .unwrap_or(3);
    let f: Vec<u8> = std::env::var("KOI_MODEL_PROTOCOL")
        .unwrap_or_else(|_| "0,1,0,0,2,0,0".into())
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let faults = with_disable(budget(f[0], f[1], f[2], f[3]), f[4], f[5], f[6]);
    let mut model = ProtocolModel::protocol(nodes, faults, decide);
    let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    model.chart_first = flag("KOI_MODEL_CHART_FIRST");
    model.joiner = flag("KOI_MODEL_JOINER");
    model.start_enabled = flag("KOI_MODEL_FROM_ENABLED");
    model.tunnel_lag = flag("KOI_MODEL_LAGS");
    model.ike_lingers = flag("KOI_MODEL_LAGS");
    model.pod_gaps = !flag("KOI_MODEL_NO_GAPS");
    model.withdraw_retirements_on_flip = flag("KOI_MODEL_WITHDRAW_RETIREMENTS");
    if let Ok(cap) = std::env::var("KOI_MODEL_EPOCH_CAP") {
        model.epoch_cap = cap.parse().unwrap();
    }
    if let Ok(cap) = std::env::var("KOI_MODEL_IN_FLIGHT") {
        model.in_flight_cap = cap.parse().unwrap();
    }
    check_all(model, "protocol_model_long");
}

/// A decision that takes "no receipt" for a satisfied barrier.
fn decide_counting_missing(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    for name in record.targets.keys() {
        let v = o.receipts.entry(name.clone()).or_insert(Verdict::Missing);
        if *v == Verdict::Missing {
            *v = Verdict::Satisfied;
        }
    }
    decide(record, &o)
}

/// A decision that accepts receipts of another generation, epoch or phase.
fn decide_ignoring_epoch(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    for v in o.receipts.values_mut() {
        if matches!(
            v,
            Verdict::Refused {
                check: "ReceiptEpochMismatch",
                ..
            }
        ) {
            *v = Verdict::Satisfied;
        }
    }
    decide(record, &o)
}

/// A decision that flips NB as soon as the `Prepare` barrier completes.
fn decide_flipping_nb_in_prepare(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let d = decide(record, o)?;
    match &d {
        Decision::Write { record: to, .. }
            if record.phase == CoordinationPhase::Prepare
                && to.phase == CoordinationPhase::Arm
                && o.nb_ipsec == Some(false) =>
        {
            Ok(Decision::SetNb(true))
        }
        _ => Ok(d),
    }
}

/// The decision before admission from `Enabled`: a joiner restarts the
/// barrier with it in the cohort whatever NB reads.
fn decide_refreezing_joiners_after_the_flip(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let joined = o.scheduled.keys().any(|n| !record.targets.contains_key(n));
    if joined
        && o.nb_ipsec == Some(true)
        && matches!(
            record.phase,
            CoordinationPhase::Prepare | CoordinationPhase::Arm
        )
    {
        let mut next = record
            .transition(CoordinationPhase::Prepare, None)
            .map_err(controller::Error::Coordination)?;
        next.targets = o.scheduled.clone();
        next.trust_hash = o.trust;
        return Ok(Decision::Write {
            record: Box::new(next),
            why: "the cohort changed".into(),
        });
    }
    decide(record, o)
}

/// A decision whose `Enabled` keeps the trust it froze.
fn decide_keeping_the_trust_when_enabled(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    if record.phase != CoordinationPhase::Enabled {
        return decide(record, o);
    }
    let mut o = o.clone();
    o.trust = record.trust_hash;
    decide(record, &o)
}

/// A decision that admits a joiner on its `Prepare` receipt.
fn decide_admitting_prepared_joiners(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    for v in o.admissions.values_mut() {
        if matches!(
            v,
            Verdict::Refused {
                check: "ReceiptNotReady",
                ..
            }
        ) {
            *v = Verdict::Satisfied;
        }
    }
    decide(record, &o)
}

/// The invariants are not vacuous: each broken decision is caught with a
/// counterexample for the properties it breaks.
#[test]
fn the_model_catches_broken_decisions() {
    let plain = |d| ProtocolModel::new(3, budget(1, 0, 1, 1), d);
    let joiner = |d| ProtocolModel::with_joiner(3, budget(0, 0, 0, 1), d);
    type Case = (&'static str, ProtocolModel, &'static [&'static str]);
    let cases: [Case; 6] = [
        (
            "Missing counted as Satisfied",
            plain(decide_counting_missing),
            &[NB_GUARDED, BARRIER_EPOCH],
        ),
        (
            "ReceiptEpochMismatch counted as Satisfied",
            plain(decide_ignoring_epoch),
            &[NB_GUARDED, BARRIER_EPOCH],
        ),
        (
            "SetNb(true) on completing Prepare",
            plain(decide_flipping_nb_in_prepare),
            &[NB_GUARDED],
        ),
        (
            "a joiner re-frozen into the barrier after the flip",
            joiner(decide_refreezing_joiners_after_the_flip),
            &[NB_GUARDED],
        ),
        (
            "Enabled keeps the trust it froze",
            joiner(decide_keeping_the_trust_when_enabled),
            &[TERMINAL_INTENDED],
        ),
        (
            "a joiner admitted on its Prepare receipt",
            joiner(decide_admitting_prepared_joiners),
            &[NB_GUARDED, BARRIER_EPOCH],
        ),
    ];
    for (bug, model, caught) in cases {
        find(model, &format!("broken decision ({bug})"), caught);
    }
}

/// A decision that takes every release receipt, whatever it says, and no
/// receipt at all, for a satisfied `Release` barrier.
fn decide_disabling_without_receipts(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    for name in record.targets.keys() {
        o.releases.insert(name.clone(), Verdict::Satisfied);
    }
    decide(record, &o)
}

/// A decision whose re-enable turns NB on at once, before the `Prepare`
/// and `Arm` barriers re-armed the nodes that withdrew.
fn decide_reenabling_nb_at_once(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    if record.phase.is_disable_side() && o.want_enabled && o.nb_ipsec == Some(false) {
        return Ok(Decision::SetNb(true));
    }
    decide(record, o)
}

/// A decision that accepts a release receipt answering an earlier
/// `Release` (another epoch and challenge: the disable went back to
/// `Disabling` since).
fn decide_accepting_old_releases(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    for v in o.releases.values_mut() {
        if matches!(
            v,
            Verdict::Refused {
                check: "ReleaseReceiptEpochMismatch" | "ReleaseReceiptChallengeMismatch",
                ..
            }
        ) {
            *v = Verdict::Satisfied;
        }
    }
    decide(record, &o)
}

/// A decision whose `Release` ignores NB and SB turning true again (it
/// never goes back to `Disabling`).
fn decide_ignoring_nb_in_release(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    if record.phase == CoordinationPhase::Release {
        o.nb_ipsec = o.nb_ipsec.map(|_| false);
        o.sb_ipsec = o.sb_ipsec.map(|_| false);
    }
    decide(record, &o)
}

/// A decision that finishes the disable before it re-enables: intent on
/// in a disable-side phase waits (a one-way door once the chart is
/// reverted).
fn decide_finishing_the_disable_first(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    if record.phase.is_disable_side() {
        o.want_enabled = false;
    }
    decide(record, &o)
}

/// A decision blind to the claimants: the disable asks only the targets.
fn decide_without_claimants(
    record: &CoordinationRecord,
    o: &Observation,
) -> controller::error::Result<Decision> {
    let mut o = o.clone();
    o.claimants.clear();
    decide(record, &o)
}

/// The disable side's invariants are not vacuous either.
#[test]
fn the_model_catches_broken_disable_decisions() {
    let from_enabled = |faults, d| {
        let mut m = ProtocolModel::protocol(3, faults, d);
        m.start_enabled = true;
        m
    };
    let disable = with_disable(budget(0, 0, 0, 0), 1, 0, 0);
    let nb_on = with_disable(budget(0, 0, 0, 0), 1, 1, 0);
    let reenable = with_disable(budget(0, 0, 0, 0), 2, 0, 0);
    type Case = (&'static str, ProtocolModel, &'static [&'static str]);
    let cases: [Case; 6] = [
        (
            "Disabled without release receipts",
            from_enabled(disable, decide_disabling_without_receipts),
            &[DISABLED_RELEASED, CLEAN_AFTER_DISABLED, RELEASE_EVIDENCE],
        ),
        (
            "a re-enable turning NB on before re-arming",
            from_enabled(reenable, decide_reenabling_nb_at_once),
            &[NB_GUARDED, GUARDS_KEPT_WHILE_ON, TUNNELS_GUARDED],
        ),
        (
            "a release receipt of an earlier Release accepted",
            from_enabled(nb_on, decide_accepting_old_releases),
            &[RELEASE_EVIDENCE],
        ),
        (
            "Release deaf to NB turned on again",
            from_enabled(nb_on, decide_ignoring_nb_in_release),
            &[TERMINAL_INTENDED],
        ),
        (
            "a re-enable waiting for the disable to finish",
            from_enabled(reenable, decide_finishing_the_disable_first),
            &[TERMINAL_INTENDED],
        ),
        (
            "a disable blind to the claimants",
            disable_with_joiner_deciding(disable, decide_without_claimants),
            &[CLEAN_AFTER_DISABLED],
        ),
    ];
    for (bug, model, caught) in cases {
        find(model, &format!("broken decision ({bug})"), caught);
    }
}

/// The node-side properties are not vacuous: a cleanup that does not wait
/// for its tunnels to converge (in `Release`, or as soon as the disable
/// starts, while NB may still be on), and one that flushes foreign state,
/// are caught.
#[test]
fn the_model_catches_broken_cleanups() {
    let model = |cleanup| {
        let mut m = ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), 1, 0, 0), decide);
        m.start_enabled = true;
        m.cleanup = cleanup;
        m
    };
    type Case = (&'static str, NodeCleanup, &'static [&'static str]);
    let cases: [Case; 3] = [
        (
            "withdraws before its tunnels converged",
            NodeCleanup::IgnoresTunnels,
            &[TUNNELS_GUARDED],
        ),
        (
            "withdraws as soon as the disable starts",
            NodeCleanup::Early,
            &[GUARDS_KEPT_WHILE_ON, TUNNELS_GUARDED],
        ),
        ("flushes foreign state", NodeCleanup::Flush, &[FOREIGN_KEPT]),
    ];
    for (bug, cleanup, caught) in cases {
        find(model(cleanup), &format!("broken cleanup ({bug})"), caught);
    }
}

/// The joiner's wait is not vacuous: an agent that arms as soon as it
/// sent its `Prepare` receipt (the patch still in flight) can hold state
/// that neither the disable's start nor its `Cleanup` write sees, and
/// `Disabled` is written while it still holds it. (Two patches in flight:
/// with one, a full queue holds the arming step until the receipt lands.)
#[test]
fn the_model_catches_a_joiner_arming_before_its_claim_is_visible() {
    let mut model = disable_with_joiner(with_disable(budget(0, 0, 0, 0), 1, 0, 0));
    model.joiner_in_flight_cap = Some(2);
    model.joiner_waits_for_claim = false;
    let found = find(
        model,
        "broken joiner (arms unseen)",
        &[CLEAN_AFTER_DISABLED],
    );
    print_path(&found[CLEAN_AFTER_DISABLED]);
}

/// The ranking check is not vacuous either: a receipt lost without
/// spending the fault budget lets a node send, lose and re-send the same
/// receipt forever, and the check reports that step.
#[test]
fn the_progress_check_catches_a_cycle() {
    #[derive(Clone)]
    struct FreeLoss(ProtocolModel);
    impl Model for FreeLoss {
        type State = State;
        type Action = Action;
        fn init_states(&self) -> Vec<State> {
            self.0.init_states()
        }
        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            self.0.actions(s, actions);
            for (i, n) in s.nodes.iter().enumerate() {
                actions.extend((0..n.in_flight.len()).map(|k| Action::Lose(i, k)));
            }
        }
        fn next_state(&self, s: &State, action: Action) -> Option<State> {
            let Action::Lose(i, k) = action else {
                return self.0.next_state(s, action);
            };
            let mut next = s.clone();
            next.nodes[i].in_flight.remove(k);
            if self.0.rank(&next) >= self.0.rank(s) {
                next.stalled = Some(format!("{action:?}"));
            }
            Some(next)
        }
        fn properties(&self) -> Vec<Property<Self>> {
            vec![Property::always(PROGRESS, |_, s: &State| {
                s.stalled.is_none()
            })]
        }
    }
    let checker = FreeLoss(ProtocolModel::new(2, budget(0, 0, 0, 0), decide))
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([PROGRESS].into()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(PROGRESS)
        .expect("a free loss-and-resend cycle went unnoticed");
    let stalled = path.last_state().stalled.clone().unwrap_or_default();
    assert!(
        stalled.starts_with("Lose("),
        "{stalled}: {:?}",
        path.into_actions()
    );
}

/// A node that the DaemonSet starts scheduling to at any moment (before
/// the enable, into a barrier, after the NB flip, while `Enabled`) ends a
/// target, and is never a target under NB without its guards. With a
/// rotation, the trust can change after the flip or while the joiner
/// waits for admission: the terminal property shows that strands no one.
/// The property that it can join after the flip and be admitted keeps the
/// check from passing on joiners that always come early.
#[test]
fn a_joiner_at_any_step_ends_admitted_and_guarded() {
    let started = Instant::now();
    let mut states = 0;
    for (label, faults) in [
        ("joiner, rotation", budget(0, 0, 0, 1)),
        ("joiner, restart, loss, crash", budget(1, 1, 1, 0)),
    ] {
        states += check_all(ProtocolModel::with_joiner(3, faults, decide), label);
    }
    println!(
        "a_joiner_at_any_step_ends_admitted_and_guarded: {states} unique states in all, {:.2?}",
        started.elapsed()
    );
}

/// The node reads the record and its tunnels, not NB and SB (docs/cleanup.md
/// "NB and SB through the record and the tunnels"): when someone turns NB
/// on behind the controller's back during `Release`, a node that read
/// `Release` can withdraw its guards while NB — and, before its
/// ovn-controller caught up, SB — already reads true. The controller then
/// goes back to `Disabling` and turns NB off again; the properties above
/// hold with that exception, and this test shows the exception is real
/// (so it is not a property the protocol has).
#[test]
fn an_nb_write_behind_the_controllers_back_races_a_release() {
    #[derive(Clone)]
    struct Strict(ProtocolModel);
    impl Model for Strict {
        type State = State;
        type Action = Action;
        fn init_states(&self) -> Vec<State> {
            self.0.init_states()
        }
        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            self.0.actions(s, actions);
        }
        fn next_state(&self, s: &State, action: Action) -> Option<State> {
            self.0.next_state(s, action)
        }
        fn properties(&self) -> Vec<Property<Self>> {
            vec![Property::always(
                GUARDS_KEPT_WHILE_ON_STRICT,
                |_, s: &State| !s.seen.withdrew_while_on,
            )]
        }
    }
    let mut model = ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), 1, 1, 0), decide);
    model.start_enabled = true;
    let started = Instant::now();
    let checker = Strict(model)
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf([GUARDS_KEPT_WHILE_ON_STRICT].into()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(GUARDS_KEPT_WHILE_ON_STRICT)
        .expect("the race of an NB write with a release went unnoticed");
    println!(
        "an NB write behind the controller's back races a release ({} states, {:.2?}):",
        checker.state_count(),
        started.elapsed()
    );
    print_path(&path);
}

/// Which operator steps the disable needs: without the re-run of a
/// completed cleanup Pod (after `Release` went back to `Disabling`), or
/// without retiring a target that never activated an identity (a disable
/// before it armed), some behaviour ends in a `Release` that holds
/// forever. docs/coordination.md lists both as operator actions.
#[test]
fn the_disable_needs_the_operators_steps() {
    #[derive(Clone)]
    struct Without(ProtocolModel, fn(&Action) -> bool);
    impl Model for Without {
        type State = State;
        type Action = Action;
        fn init_states(&self) -> Vec<State> {
            self.0.init_states()
        }
        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            self.0.actions(s, actions);
            actions.retain(|a| !(self.1)(a));
        }
        fn next_state(&self, s: &State, action: Action) -> Option<State> {
            self.0.next_state(s, action)
        }
        fn properties(&self) -> Vec<Property<Self>> {
            vec![Property::always(
                TERMINAL_INTENDED,
                |w: &Without, s: &State| {
                    let mut actions = Vec::new();
                    w.actions(s, &mut actions);
                    let terminal = match actions.as_slice() {
                        [] => true,
                        [Action::ControllerPass] => w.0.step(s, &Action::ControllerPass).is_none(),
                        _ => false,
                    };
                    !terminal || s.record.0.phase == CoordinationPhase::Disabled
                },
            )]
        }
    }
    let rerun = |a: &Action| matches!(a, Action::OperatorRerun(_));
    let retire = |a: &Action| matches!(a, Action::OperatorRetire(_));
    let mut nb_on = ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), 1, 1, 0), decide);
    nb_on.start_enabled = true;
    let early = ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), 1, 0, 0), decide);
    for (label, model, without) in [
        (
            "without the operator's re-run",
            nb_on,
            rerun as fn(&Action) -> bool,
        ),
        ("without the operator's retirement", early, retire),
    ] {
        let started = Instant::now();
        let checker = Without(model, without)
            .checker()
            .threads(threads())
            .finish_when(HasDiscoveries::AnyOf([TERMINAL_INTENDED].into()))
            .spawn_bfs()
            .join();
        let path = checker
            .discovery(TERMINAL_INTENDED)
            .unwrap_or_else(|| panic!("{label}: the disable finished anyway"));
        println!(
            "{label}: stuck short of Disabled ({} states, {:.2?}):",
            checker.state_count(),
            started.elapsed()
        );
        print_path(&path);
    }
}

/// The joiner of the disable checks: one receipt patch in flight, so its
/// agent can be waiting for its `Prepare` receipt to be visible when the
/// disable starts (with none the receipt lands as it is sent).
fn disable_with_joiner(faults: Budget) -> ProtocolModel {
    disable_with_joiner_deciding(faults, decide)
}

/// [`disable_with_joiner`] over the decision `d`.
fn disable_with_joiner_deciding(faults: Budget, d: DecideFn) -> ProtocolModel {
    let mut m = ProtocolModel::protocol(3, faults, d);
    m.joiner = true;
    m.joiner_in_flight_cap = Some(1);
    m.start_enabled = true;
    m
}

/// The chart's switch to the cleanup shape can roll a target's Pod away
/// while the controller still wants IPsec on (a chart upgrade changes the
/// template at once, the controller's Deployment rolls later): the target
/// keeps its guards, lease and SAs, and an `Enabled` record keeps it a
/// target while its Node exists, so the disable asks it for its release.
/// Once with the lags, once with a re-enable after it.
#[test]
fn a_target_without_a_pod_is_still_asked_for_its_release() {
    let started = Instant::now();
    let mut states = 0;
    for (label, flips, lags) in [
        ("the chart's template changes first", 1, true),
        ("the chart's template changes first, re-enable", 2, false),
    ] {
        let mut m =
            ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), flips, 0, 0), decide);
        m.start_enabled = true;
        m.chart_first = true;
        m.tunnel_lag = lags;
        m.ike_lingers = lags;
        states += check_all(m, label);
    }
    println!(
        "a_target_without_a_pod_is_still_asked_for_its_release: {states} unique states in all, {:.2?}",
        started.elapsed()
    );
}

/// A joiner's agent arms for its admission before it is a target (once its
/// `Prepare` receipt is visible and the record still shows `Enabled`), so
/// a disable can start while it holds guards, a lease and SAs without
/// being a target: the disable takes it in as a claimant, and `Disabled`
/// is never written while any node holds anything. With the rollout's
/// gaps and the lags; with the chart's template changing first; with a
/// node restart, a controller crash and a lost receipt.
#[test]
fn a_joiner_armed_for_admission_is_asked_for_its_release() {
    let started = Instant::now();
    let disable = |base| with_disable(base, 1, 0, 0);
    let mut chart_first = disable_with_joiner(disable(budget(0, 0, 0, 0)));
    chart_first.chart_first = true;
    let mut states = 0;
    for (label, model) in [
        (
            "a joiner armed for admission",
            disable_with_joiner(disable(budget(0, 0, 0, 0))),
        ),
        ("a joiner, the chart's template first", chart_first),
        (
            "a joiner, restart, crash, loss",
            disable_with_joiner(disable(budget(1, 1, 1, 0))),
        ),
    ] {
        states += check_all(model, label);
    }
    println!(
        "a_joiner_armed_for_admission_is_asked_for_its_release: {states} unique states in all, {:.2?}",
        started.elapsed()
    );
}

/// A retirement request that outlasts the `Release` it was made for (the
/// operator retires a target that cannot sign a release, then re-enables
/// before the controller carried it out) is carried out once: the retired
/// node, still scheduled under the UID the request names, sits the
/// restart's write out and rejoins on the next pass, instead of the
/// request applying again on every pass (a new epoch each time, no barrier
/// ever completing). [`protocol_model_n3`] keeps requests across flips
/// too; this is the case without its lags.
#[test]
fn a_retirement_left_over_from_release_is_carried_out_once() {
    let mut model = ProtocolModel::protocol(3, with_disable(budget(0, 0, 0, 0), 2, 0, 0), decide);
    model.pod_gaps = false;
    model.tunnel_lag = false;
    model.ike_lingers = false;
    check_all(model, "a retirement left over");
}

/// A re-enable from `Disabling` before NB was turned off follows the
/// enable side's cohort rule: only the frozen targets still scheduled, so
/// a joiner that never armed is not a target while NB is true; it is
/// admitted once the record is `Enabled` again. The disable itself takes
/// claimants in only at `Cleanup`, NB read false: taken in at its start,
/// a claimant that never armed was a target without guards under NB true
/// (a finding of this check), and a re-enable from `Disabling` kept it.
#[test]
fn a_reenable_before_nb_is_off_keeps_an_unarmed_joiner_out() {
    let mut model = disable_with_joiner(with_disable(budget(0, 0, 0, 0), 2, 0, 0));
    model.pod_gaps = false;
    model.tunnel_lag = false;
    model.ike_lingers = false;
    check_all(model, "a re-enable before NB is off");
}
