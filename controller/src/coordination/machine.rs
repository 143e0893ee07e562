//! The coordinator's decision, as a pure function (SPEC §7): the record
//! as stored and what the controller observed in one pass go in, one
//! [`Decision`] comes out. The shell (the leader's loop) performs it — a
//! record write with a resourceVersion precondition, or the NB write — and
//! observes again; nothing here reads a clock or the API.
//!
//! One decision per pass keeps every side effect after the write that
//! justifies it: `NB_Global.ipsec` is set true only while the stored record
//! is `Arm` with every target's `Arm` receipt verified, and `Enabled` is
//! written only after NB and SB both read true; it is set false only while
//! the stored record is `Disabling`, which carries the disable's challenge.
//! A controller killed between any two passes resumes from the stored
//! record and repeats at most an idempotent step (setting NB to the value
//! it already has is no flip).
//!
//! # Enable side
//!
//! Cohort rules (where SPEC §7 leaves a choice, docs/coordination.md):
//! - a change of the DaemonSet (UID), its template or the trust during
//!   `Prepare`/`Arm` restarts from `Prepare` with everything re-frozen;
//! - a node the DaemonSet newly schedules to during `Prepare`/`Arm` joins by
//!   the same restart (the cohort is what the DaemonSet schedules to) — but
//!   only while `NB_Global.ipsec` reads false. Once it may be true (read
//!   true, or unreadable) a joiner would be an unguarded target under an
//!   encrypted switch, so the frozen cohort finishes to `Enabled` without
//!   it (a restart keeps the frozen targets) and the joiner is admitted from
//!   there;
//! - a target that is no longer scheduled to (Node deleted, DaemonSet no
//!   longer selects it) leaves by the same restart, and the decision names
//!   it: nothing is enabled on a node that is not there;
//! - a target whose Node UID changed (deleted and re-created under the same
//!   name) holds the barrier with that reason until an operator retires it:
//!   its evidence cannot be told apart from a replay, so it is never
//!   silently dropped or re-admitted. A retirement names the UID the cohort
//!   froze; it removes that target (a restart from `Prepare`, a new epoch
//!   while `Enabled`) and the new Node joins like any other. A retirement
//!   naming another UID is refused, and says why, per node.
//!
//! While `Enabled` there is no barrier; the record keeps what admissions
//! are judged against, and each change is a new epoch of `Enabled`:
//! - a scheduled node that is not a target is admitted on its own `Arm`
//!   receipt for the record's generation and epoch (judged as
//!   [`super::evidence::Answer::Admission`]); until then it is reported
//!   with why it waits;
//! - a target leaves only when its Node is gone. A target whose Pod is
//!   absent (a rollout's gap, a DaemonSet that no longer selects it) still
//!   holds its guards, lease and SAs, so the next disable must ask it for
//!   its release;
//! - the frozen DaemonSet, template and trust follow the live ones, so a
//!   joiner's receipt is judged against what its agent holds (a trust
//!   rotation after the flip would otherwise refuse every joiner forever).
//!
//! `Enabled → Enabled` is not a phase transition (the record's table has
//! none): only the epoch moves, and NB stays true throughout.
//!
//! # Disable side
//!
//! Intent off in any enable-side phase writes `Disabling` with a fresh
//! challenge before NB is touched; its targets are the frozen ones (the
//! *claimants*, [`Observation::claimants`] — nodes that signed an
//! enable-side receipt and no release since, e.g. a joiner armed for an
//! admission that never came — join at `Cleanup`, once NB reads false).
//! Then, one step per pass:
//! - `Disabling`: NB read true → set it false; NB false but SB not (yet)
//!   false, or either unreadable → hold, naming it. Both false → wait for
//!   the live DaemonSet's *cleanup shape* (its Pod template has the
//!   `ipsec-cleanup` init container and no `ipsec` container: the chart
//!   with IPsec disabled). Then write `Cleanup`, recording the `NB_Global`
//!   and `SB_Global` row UUIDs (read in the same select as `ipsec`), the
//!   DaemonSet's UID and template hash; the targets are the frozen ones
//!   and the claimants, whose Node still exists (a Node that is gone holds
//!   no state anyone can reach; the write names it). Claimants are taken
//!   in here, and only here: a joiner arms only on a fresh read of
//!   `Enabled` after its receipt is visible, so the pass that writes
//!   `Cleanup` (observed after `Disabling` was written) sees every node
//!   that can hold state; not earlier, because one that never armed would
//!   be a target without guards while NB may still be on; not in
//!   `Release`, so an operator's retirement of one sticks.
//! - `Cleanup` → `Release` on the next pass, if NB and SB still read false
//!   and the rows, the DaemonSet and its template are still the recorded
//!   ones with the cleanup shape.
//! - `Release`: a barrier on every target's verified release receipt
//!   ([`Observation::releases`]), then `Disabled`. A target whose Node is
//!   gone is dropped and an operator's retirement applies, both *without
//!   moving the epoch*: a release receipt answers the `Release` epoch and a
//!   completed init container never runs again for a new one, so the epoch
//!   stays put for as long as the record is `Release`. A re-created Node
//!   holds as `NodeUIDChanged` until retired.
//! - In `Cleanup` and `Release`, NB or SB reading true, another
//!   `NB_Global`/`SB_Global` row, another DaemonSet or template, or a
//!   DaemonSet that lost the cleanup shape sends the record back to
//!   `Disabling` with a fresh challenge (the write names why); a receipt for
//!   the old challenge never counts again.
//! - Intent on again in any disable-side phase writes a fresh `Prepare`
//!   (new generation) at once: a re-enable never waits for the cleanup it
//!   abandons (the `Prepare`/`Arm` barriers re-arm every node before NB
//!   turns on). Its cohort follows the enable side's rule: while NB may
//!   still be on (`Disabling` before NB read false) only the frozen
//!   targets still scheduled, joiners waiting for `Enabled`; retirement
//!   requests the abandoned disable did not carry out are carried out by
//!   that write (see [`cohort`]).
//!
//! On the disable side a target "leaves" only when its **Node is gone**,
//! not when the DaemonSet has no Pod on it: the DaemonSet's own rollout to
//! the cleanup shape deletes each node's Pod before it creates the new one,
//! and a target dropped in that gap would never be asked for its release.
//! A node the DaemonSet no longer schedules to at all holds `Release`,
//! saying so, until an operator retires it.

use std::collections::BTreeMap;

use kube_ovn_ipsec_api::coordination::{Challenge, CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use uuid::Uuid;

use crate::error::{Error, Result};

// Defined with the judgement that produces it; re-exported here, where
// the decision consumes it, so `machine::Verdict` keeps naming it.
pub use super::evidence::Verdict;

/// The live kube-ovn-cni DaemonSet, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDaemonSet {
    /// `metadata.uid`.
    pub uid: Uid,
    /// The current template hash (the newest ControllerRevision's
    /// `controller-revision-hash`).
    pub template_hash: String,
    /// The Pod template has the `ipsec-cleanup` init container and no
    /// `ipsec` container: the chart's shape with IPsec disabled, which the
    /// disable waits for before it records `Cleanup`.
    pub cleanup_shape: bool,
}

/// Everything one pass observed.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The operator's intent (`--enable-ipsec`).
    pub want_enabled: bool,
    /// The live DaemonSet, if it exists.
    pub daemon_set: Option<LiveDaemonSet>,
    /// The trust bundle's digest now, if the bundle is readable.
    pub trust: Option<Sha256Digest>,
    /// The nodes the DaemonSet schedules to now: name → Node UID.
    pub scheduled: BTreeMap<String, Uid>,
    /// Every Node that exists now: name → UID. On the disable side a
    /// target leaves only when its Node is gone (see the module doc).
    pub nodes: BTreeMap<String, Uid>,
    /// Per target of the stored record, its receipt's verdict against it.
    /// A target absent here counts as [`Verdict::Missing`].
    pub receipts: BTreeMap<String, Verdict>,
    /// While the stored record is `Enabled`: per scheduled node that is not
    /// a target, its receipt judged as an admission. Absent counts as
    /// [`Verdict::Missing`].
    pub admissions: BTreeMap<String, Verdict>,
    /// The operator's retirement requests: Node name → the UID the cohort
    /// froze for it (the Node that was deleted).
    pub retirements: BTreeMap<String, Uid>,
    /// `NB_Global.ipsec` as a synchronous read returned it (`None`:
    /// unreadable).
    pub nb_ipsec: Option<bool>,
    /// `SB_Global.ipsec` likewise.
    pub sb_ipsec: Option<bool>,
    /// The `_uuid` of the `NB_Global` row, from the same read as
    /// `nb_ipsec` (`None`: unreadable).
    pub nb_global_uuid: Option<Uuid>,
    /// The `_uuid` of the `SB_Global` row, from the same read as
    /// `sb_ipsec`.
    pub sb_global_uuid: Option<Uuid>,
    /// While the stored record is `Release`: per target, its release
    /// receipt's verdict against it. Absent counts as [`Verdict::Missing`].
    pub releases: BTreeMap<String, Verdict>,
    /// Nodes that may hold this project's state without being targets of
    /// the stored record: an existing Node whose receipt annotation is an
    /// enable-side receipt for its live UID, with no release receipt since
    /// (a release answering a later or equal epoch). name → Node UID. A
    /// joiner arms only after such a receipt is visible and a fresh read
    /// still shows `Enabled`; a target dropped from a cohort has one from
    /// its barrier. The disable takes them in (see the module doc).
    pub claimants: BTreeMap<String, Uid>,
    /// A fresh random challenge, used only if this pass starts a disable.
    pub fresh_challenge: Challenge,
}

/// What the shell does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write this record (with the stored record's resourceVersion as the
    /// precondition); `why` is for the log and the Event.
    Write {
        /// The next record.
        record: Box<CoordinationRecord>,
        /// Why, in a few words.
        why: String,
    },
    /// Set `NB_Global.ipsec` to this value, then observe again.
    SetNb(bool),
    /// Nothing can move: the reason, and per node why it holds the barrier.
    Hold {
        /// Why the coordinator waits.
        reason: String,
        /// Node name → why it is waiting.
        waiting: BTreeMap<String, String>,
    },
    /// The stored record is where the intent wants it.
    Idle,
}

fn hold(reason: impl Into<String>) -> Decision {
    Decision::Hold {
        reason: reason.into(),
        waiting: BTreeMap::new(),
    }
}

fn write(record: CoordinationRecord, why: impl Into<String>) -> Result<Decision> {
    // Encode-validate now: the shell never sees a record it cannot store.
    record.encode().map_err(Error::Coordination)?;
    Ok(Decision::Write {
        record: Box::new(record),
        why: why.into(),
    })
}

/// `record` with only its epoch moved: how `Enabled` records a change.
/// The phase table has no `Enabled → Enabled` and nothing else of a
/// transition applies (same generation, same challenge).
fn next_epoch(record: &CoordinationRecord) -> Result<CoordinationRecord> {
    let mut next = record.clone();
    next.epoch = record.epoch.checked_add(1).ok_or_else(|| {
        Error::Coordination(kube_ovn_ipsec_api::Error::InvalidValue {
            kind: "epoch",
            reason: "overflow".into(),
        })
    })?;
    Ok(next)
}

/// The record of a fresh `Prepare` from `from`: new epoch, the DaemonSet,
/// template and trust frozen from what is live now, `cohort` as targets.
fn prepare(
    from: &CoordinationRecord,
    ds: &LiveDaemonSet,
    trust: Sha256Digest,
    cohort: BTreeMap<String, Uid>,
) -> Result<CoordinationRecord> {
    let mut next = from
        .transition(CoordinationPhase::Prepare, None)
        .map_err(Error::Coordination)?;
    next.daemon_set_uid = Some(ds.uid.clone());
    next.template_hash = Some(ds.template_hash.clone());
    next.trust_hash = Some(trust);
    next.targets = cohort;
    Ok(next)
}

/// Whether `NB_Global.ipsec` may be true: read true, or not readable. A
/// joiner enters a barrier only when it surely is not.
fn nb_may_be_on(o: &Observation) -> bool {
    o.nb_ipsec != Some(false)
}

/// The targets of a restart from `Prepare`. While NB reads false: what the
/// DaemonSet schedules to. Once NB may be on: the frozen targets still
/// scheduled, and no one else (joiners wait for `Enabled`). Never the
/// `retired` under the UID they were retired with: a retired node that is
/// still scheduled under that very UID sits this write out and rejoins on
/// the next pass, so the write carries the request out
/// ([`retirements_done`]) instead of applying it again on every pass. A
/// re-created Node that is not retired keeps its frozen UID, so it still
/// holds the barrier until it is.
fn cohort(
    record: &CoordinationRecord,
    o: &Observation,
    retired: &BTreeMap<String, Uid>,
) -> BTreeMap<String, Uid> {
    if nb_may_be_on(o) {
        return record
            .targets
            .iter()
            .filter(|(n, _)| o.scheduled.contains_key(*n) && !retired.contains_key(*n))
            .map(|(n, u)| (n.clone(), u.clone()))
            .collect();
    }
    o.scheduled
        .iter()
        .filter(|(n, live)| retired.get(*n) != Some(*live))
        .map(|(n, live)| {
            let uid = match record.targets.get(n) {
                Some(frozen) if !retired.contains_key(n) => frozen,
                _ => live,
            };
            (n.clone(), uid.clone())
        })
        .collect()
}

/// What differs between the frozen DaemonSet, template and trust and the
/// live ones, if anything.
fn frozen_change(
    record: &CoordinationRecord,
    ds: &LiveDaemonSet,
    trust: &Sha256Digest,
) -> Option<String> {
    if record.daemon_set_uid.as_ref() != Some(&ds.uid) {
        return Some("the DaemonSet was re-created".into());
    }
    if record.template_hash.as_deref() != Some(ds.template_hash.as_str()) {
        return Some(format!(
            "the DaemonSet template changed to {}",
            ds.template_hash
        ));
    }
    if record.trust_hash.as_ref() != Some(trust) {
        return Some("the trust bundle changed".into());
    }
    None
}

/// Per target whose Node was re-created (in `live` under the same name
/// with another UID), why it holds. `live` is what the DaemonSet schedules
/// to on the enable side, every Node on the disable side.
fn recreated(
    record: &CoordinationRecord,
    live: &BTreeMap<String, Uid>,
) -> BTreeMap<String, String> {
    record
        .targets
        .iter()
        .filter_map(|(name, frozen)| {
            let live = live.get(name).filter(|live| *live != frozen)?;
            Some((
                name.clone(),
                format!(
                    "NodeUIDChanged: the Node was re-created (UID {frozen} frozen, {live} live); \
                     retire it with `kube-ovn-ipsec-controller retire-node {name} --uid {frozen}`"
                ),
            ))
        })
        .collect()
}

/// Scheduled nodes that are not targets.
fn joiners<'a>(record: &CoordinationRecord, o: &'a Observation) -> Vec<&'a String> {
    o.scheduled
        .keys()
        .filter(|n| !record.targets.contains_key(*n))
        .collect()
}

/// Targets that are not scheduled.
fn leavers<'a>(record: &'a CoordinationRecord, o: &Observation) -> Vec<&'a String> {
    record
        .targets
        .keys()
        .filter(|n| !o.scheduled.contains_key(*n))
        .collect()
}

/// Why a joiner is not a target yet, in the phase `record` is in.
fn joiner_reason(record: &CoordinationRecord, o: &Observation, name: &str) -> String {
    if record.phase == CoordinationPhase::Enabled {
        let verdict = o.admissions.get(name).unwrap_or(&Verdict::Missing);
        let why = verdict
            .waiting_reason()
            .unwrap_or_else(|| "armed; admitted on the next pass".into());
        format!("admission: {why}")
    } else {
        "joins once the cohort is Enabled (NB_Global.ipsec may already be true)".into()
    }
}

/// The operator's retirement requests, judged against the stored record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retirements {
    /// Targets to remove: name → the frozen UID the request names.
    pub apply: BTreeMap<String, Uid>,
    /// Requests refused: name → why.
    pub refused: BTreeMap<String, String>,
}

/// Sorts `o`'s retirement requests against `record`: a request applies
/// only to a target whose frozen UID is the one it names.
pub fn retirements(record: &CoordinationRecord, o: &Observation) -> Retirements {
    let mut out = Retirements::default();
    for (name, uid) in &o.retirements {
        match record.targets.get(name) {
            Some(frozen) if frozen == uid => {
                out.apply.insert(name.clone(), uid.clone());
            }
            Some(frozen) => {
                out.refused.insert(
                    name.clone(),
                    format!(
                        "RetireRefused: the cohort froze {name} with UID {frozen}, \
                         the request names {uid}"
                    ),
                );
            }
            None => {
                out.refused.insert(
                    name.clone(),
                    format!("RetireRefused: {name} is not a target (the request names UID {uid})"),
                );
            }
        }
    }
    out
}

/// The retirement requests a write from `stored` to `next` carried out
/// (their target with that UID is gone): the shell removes them in the
/// same write, so a consumed request never applies twice.
pub fn retirements_done(
    stored: &CoordinationRecord,
    next: &CoordinationRecord,
    requests: &BTreeMap<String, Uid>,
) -> Vec<String> {
    requests
        .iter()
        .filter(|(name, uid)| {
            stored.targets.get(*name) == Some(*uid) && next.targets.get(*name) != Some(*uid)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

fn names<'a>(it: impl IntoIterator<Item = &'a String>) -> String {
    it.into_iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The per-target reasons the barrier is not complete (empty: complete).
fn waiting(record: &CoordinationRecord, o: &Observation) -> BTreeMap<String, String> {
    record
        .targets
        .keys()
        .filter_map(|name| {
            let verdict = o.receipts.get(name).unwrap_or(&Verdict::Missing);
            verdict.waiting_reason().map(|r| (name.clone(), r))
        })
        .collect()
}

/// Per node, what the cohort's status says after a pass that went from
/// the `stored` record to `next` (the same record when nothing was
/// written): `ok`, or why the node waits. The verdicts in `o` were judged
/// against `stored`, so after a write of a new epoch a barrier's targets
/// and `Enabled`'s joiners have "no receipt yet" for it. On the disable
/// side: before `Release` each target's release is pending; in `Release`
/// a target is `ok` once its release receipt is verified, otherwise why
/// not; after it, `released`.
pub fn node_status(
    stored: &CoordinationRecord,
    next: &CoordinationRecord,
    o: &Observation,
) -> BTreeMap<String, String> {
    use CoordinationPhase::*;
    let judged = next.epoch == stored.epoch;
    let missing = || Verdict::Missing.waiting_reason().unwrap_or_default();
    let each_target = |why: &dyn Fn(&String) -> String| -> BTreeMap<String, String> {
        next.targets.keys().map(|n| (n.clone(), why(n))).collect()
    };
    match next.phase {
        Disabling | Cleanup => {
            let mut out =
                each_target(&|_| format!("release pending: the cohort is {}", next.phase));
            if next.phase == Disabling {
                for name in o
                    .claimants
                    .keys()
                    .filter(|n| !next.targets.contains_key(*n))
                {
                    out.insert(
                        name.clone(),
                        "release pending: signed an enable-side receipt and no release since, \
                         taken in at Cleanup"
                            .into(),
                    );
                }
            }
            return out;
        }
        Disabled => return each_target(&|_| "released".into()),
        Release => {
            let mut out = each_target(&|_| "ok".into());
            out.extend(release_waiting(next, o, judged));
            if stored.phase == Release {
                merge(&mut out, retirements(stored, o).refused);
            }
            return out;
        }
        Prepare | Arm | Enabled => {}
    }
    let barrier = next.phase != Enabled;
    let mut out = each_target(
        &|n| match (barrier, judged.then(|| o.receipts.get(n)).flatten()) {
            (false, _) if !o.scheduled.contains_key(n) => {
                "ok; the DaemonSet has no Pod on it (it keeps its state: a target until its \
                 Node is gone)"
                    .into()
            }
            (false, _) => "ok".into(),
            (true, None) => missing(),
            (true, Some(v)) => v.waiting_reason().unwrap_or_else(|| "ok".into()),
        },
    );
    out.extend(recreated(next, &o.scheduled));
    for name in joiners(next, o) {
        let why = if judged || next.phase != Enabled {
            joiner_reason(next, o, name)
        } else {
            format!("admission: {}", missing())
        };
        out.insert(name.clone(), why);
    }
    if stored.phase.is_enable_side() {
        merge(&mut out, retirements(stored, o).refused);
    }
    out
}

/// Adds `more` to `into`, joining the reasons of a node that has both.
fn merge(into: &mut BTreeMap<String, String>, more: BTreeMap<String, String>) {
    for (name, why) in more {
        into.entry(name)
            .and_modify(|s| *s = format!("{s}; {why}"))
            .or_insert(why);
    }
}

/// The one next step from `record` given `o`.
pub fn decide(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    use CoordinationPhase::*;
    match record.phase {
        Disabled if !o.want_enabled => Ok(Decision::Idle),
        Disabled => enable(record, o),
        Prepare | Arm => barrier(record, o),
        Enabled => enabled(record, o),
        Disabling => disabling(record, o),
        Cleanup | Release => cleanup_or_release(record, o),
    }
}

/// A fresh `Prepare` (new generation) from `Disabled`, or from a disable
/// the operator abandoned: the DaemonSet, template and trust frozen as
/// they are live now, the nodes the DaemonSet schedules to as the cohort.
fn enable(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    let Some(ds) = &o.daemon_set else {
        return Ok(hold(
            "enable wanted: the kube-ovn-cni DaemonSet does not exist",
        ));
    };
    let Some(trust) = o.trust else {
        return Ok(hold("enable wanted: the trust bundle is not readable"));
    };
    if o.scheduled.is_empty() {
        return Ok(hold("enable wanted: the DaemonSet schedules to no node"));
    }
    if record.phase == CoordinationPhase::Disabled {
        return write(
            prepare(record, ds, trust, o.scheduled.clone())?,
            "enable: Prepare",
        );
    }
    // An abandoned disable: NB may still be on (before `Disabling` turned
    // it off), so the enable side's cohort rule applies — a node that
    // never armed must not become a target under an encrypted switch.
    let retire = retirements(record, o);
    let targets = cohort(record, o, &retire.apply);
    let mut why = format!(
        "enable wanted during {}: Prepare (the unfinished disable is abandoned)",
        record.phase
    );
    if nb_may_be_on(o) {
        why.push_str("; NB_Global.ipsec may be true, so no node joins before Enabled");
    }
    if !retire.apply.is_empty() {
        why.push_str(&format!(
            "; retired {} on the operator's request",
            names(retire.apply.keys())
        ));
    }
    write(prepare(record, ds, trust, targets)?, why)
}

/// `record`'s targets with the claimants added (a target keeps its frozen
/// UID); the names added, for the write's reason.
fn with_claimants(
    record: &CoordinationRecord,
    o: &Observation,
) -> (BTreeMap<String, Uid>, Vec<String>) {
    let mut targets = record.targets.clone();
    let mut added = Vec::new();
    for (name, uid) in &o.claimants {
        if !targets.contains_key(name) {
            targets.insert(name.clone(), uid.clone());
            added.push(name.clone());
        }
    }
    (targets, added)
}

/// The record of a disable's start from an enable-side `record`: the
/// frozen targets, a fresh challenge. Claimants wait for the `Cleanup`
/// write: one that never armed would be a target without guards while NB
/// is still on, and a re-enable from `Disabling` would keep it.
fn start_disable(record: &CoordinationRecord, o: &Observation, why: &str) -> Result<Decision> {
    let next = record
        .transition(CoordinationPhase::Disabling, Some(o.fresh_challenge))
        .map_err(Error::Coordination)?;
    write(next, why)
}

/// The hold while NB and SB read false and the DaemonSet does not (yet)
/// run the cleanup: what the operator has to do.
const WAITING_FOR_CLEANUP_SHAPE: &str = "Disabling: NB_Global.ipsec and SB_Global.ipsec read false; \
     waiting for the kube-ovn-cni DaemonSet to run the ipsec-cleanup init container \
     instead of the ipsec container (disable IPsec in the chart)";

/// `Disabling`: NB off, confirmed in NB and SB, then the DaemonSet's
/// cleanup shape; then `Cleanup`, recording the rows, the DaemonSet and
/// its template.
fn disabling(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    use CoordinationPhase::*;
    if o.want_enabled {
        return enable(record, o);
    }
    let nb_row = match (o.nb_ipsec, o.nb_global_uuid) {
        (Some(true), _) => return Ok(Decision::SetNb(false)),
        (Some(false), Some(row)) => row,
        _ => return Ok(hold("Disabling: NB_Global is not readable")),
    };
    let (Some(false), Some(sb_row)) = (o.sb_ipsec, o.sb_global_uuid) else {
        let read = match o.sb_global_uuid.and(o.sb_ipsec) {
            Some(v) => format!("it reads {v}"),
            None => "it is not readable".to_owned(),
        };
        return Ok(hold(format!(
            "Disabling: NB_Global.ipsec reads false; waiting for SB_Global.ipsec to read false \
             ({read})"
        )));
    };
    let Some(ds) = o.daemon_set.as_ref().filter(|d| d.cleanup_shape) else {
        if o.daemon_set.is_none() {
            return Ok(hold(format!(
                "{WAITING_FOR_CLEANUP_SHAPE}; the DaemonSet does not exist"
            )));
        }
        return Ok(hold(WAITING_FOR_CLEANUP_SHAPE));
    };
    let mut next = record
        .transition(Cleanup, None)
        .map_err(Error::Coordination)?;
    next.nb_global_uuid = Some(nb_row);
    next.sb_global_uuid = Some(sb_row);
    next.daemon_set_uid = Some(ds.uid.clone());
    next.template_hash = Some(ds.template_hash.clone());
    let (targets, added) = with_claimants(record, o);
    next.targets = targets;
    next.targets.retain(|n, _| o.nodes.contains_key(n));
    let mut why = format!(
        "NB and SB read false, the DaemonSet runs the ipsec-cleanup init container \
         (template {}): Cleanup",
        ds.template_hash
    );
    if !added.is_empty() {
        why.push_str(&format!(
            "; took in {} (signed an enable-side receipt and no release since)",
            names(&added)
        ));
    }
    let gone = gone(record, o);
    if !gone.is_empty() {
        why.push_str(&format!(
            "; dropped {}: the Node is gone (no state anyone can reach)",
            names(gone)
        ));
    }
    write(next, why)
}

/// Targets whose Node no longer exists.
fn gone<'a>(record: &'a CoordinationRecord, o: &Observation) -> Vec<&'a String> {
    record
        .targets
        .keys()
        .filter(|n| !o.nodes.contains_key(*n))
        .collect()
}

/// While `Cleanup`/`Release`: why the disable must start over from
/// `Disabling` with a fresh challenge, if it must; `Err` with the hold
/// when NB or SB cannot be read.
fn disable_moved(
    record: &CoordinationRecord,
    o: &Observation,
) -> std::result::Result<Option<String>, Decision> {
    let (Some(nb), Some(nb_row), Some(sb), Some(sb_row)) =
        (o.nb_ipsec, o.nb_global_uuid, o.sb_ipsec, o.sb_global_uuid)
    else {
        return Err(hold(format!(
            "{}: NB_Global or SB_Global is not readable",
            record.phase
        )));
    };
    let row = |what: &str, recorded: Option<Uuid>, live: Uuid| {
        let recorded = recorded.map_or_else(|| "none".to_owned(), |u| u.to_string());
        format!("the {what} row was replaced (UUID {recorded} recorded, {live} live)")
    };
    let why = if nb {
        "NB_Global.ipsec reads true again".to_owned()
    } else if sb {
        "SB_Global.ipsec reads true again".to_owned()
    } else if record.nb_global_uuid != Some(nb_row) {
        row("NB_Global", record.nb_global_uuid, nb_row)
    } else if record.sb_global_uuid != Some(sb_row) {
        row("SB_Global", record.sb_global_uuid, sb_row)
    } else {
        match &o.daemon_set {
            None => "the kube-ovn-cni DaemonSet is gone".to_owned(),
            Some(ds) if record.daemon_set_uid.as_ref() != Some(&ds.uid) => {
                "the DaemonSet was re-created".to_owned()
            }
            Some(ds) if record.template_hash.as_deref() != Some(ds.template_hash.as_str()) => {
                format!("the DaemonSet template changed to {}", ds.template_hash)
            }
            Some(ds) if !ds.cleanup_shape => {
                "the DaemonSet no longer runs the ipsec-cleanup init container".to_owned()
            }
            Some(_) => return Ok(None),
        }
    };
    Ok(Some(why))
}

/// `Cleanup` and `Release`: back to `Disabling` if anything recorded
/// moved; `Cleanup` then goes on to `Release`, `Release` keeps its cohort
/// current (same epoch) and passes its barrier into `Disabled`.
fn cleanup_or_release(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    use CoordinationPhase::*;
    if o.want_enabled {
        return enable(record, o);
    }
    match disable_moved(record, o) {
        Err(hold) => return Ok(hold),
        Ok(Some(why)) => {
            let next = record
                .transition(Disabling, Some(o.fresh_challenge))
                .map_err(Error::Coordination)?;
            let rerun = if record.phase == Release {
                "; the ipsec-cleanup init container must run again for the new challenge \
                 (delete the kube-ovn-cni Pods that completed it, or restart the DaemonSet)"
            } else {
                ""
            };
            return write(
                next,
                format!("back to Disabling with a new challenge: {why}{rerun}"),
            );
        }
        Ok(None) => {}
    }
    if record.phase == Cleanup {
        let next = record
            .transition(Release, None)
            .map_err(Error::Coordination)?;
        return write(next, "NB and SB still read false: Release");
    }
    let retire = retirements(record, o);
    let gone = gone(record, o);
    if !retire.apply.is_empty() || !gone.is_empty() {
        // Same epoch: the receipts already in answer it, and the cleanup
        // that wrote them will not run again for another.
        let mut next = record.clone();
        next.targets
            .retain(|n, _| !retire.apply.contains_key(n) && o.nodes.contains_key(n));
        let mut why = Vec::new();
        if !retire.apply.is_empty() {
            why.push(format!(
                "retired {} on the operator's request",
                names(retire.apply.keys())
            ));
        }
        if !gone.is_empty() {
            why.push(format!("dropped {}: the Node is gone", names(gone)));
        }
        return write(next, format!("Release (same epoch): {}", why.join("; ")));
    }
    let mut waiting = release_waiting(record, o, true);
    if waiting.is_empty() {
        let next = record
            .transition(Disabled, None)
            .map_err(Error::Coordination)?;
        return write(next, "every target's release receipt verified: Disabled");
    }
    merge(&mut waiting, retire.refused);
    let reason = if o.trust.is_none() {
        "Release barrier: the trust bundle is not readable, so no release receipt can be verified"
    } else {
        "Release barrier: waiting for release receipts"
    };
    Ok(Decision::Hold {
        reason: reason.into(),
        waiting,
    })
}

/// Per target of a `Release` record, why it holds the barrier (empty:
/// complete). `judged`: whether `o.releases` answer this record's epoch.
fn release_waiting(
    record: &CoordinationRecord,
    o: &Observation,
    judged: bool,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = record
        .targets
        .iter()
        .filter_map(|(name, frozen)| {
            let verdict = judged.then(|| o.releases.get(name)).flatten();
            let why = match verdict.unwrap_or(&Verdict::Missing) {
                Verdict::Satisfied => return None,
                Verdict::Missing => "no release receipt yet".to_owned(),
                refused => refused.waiting_reason()?,
            };
            if o.scheduled.contains_key(name) {
                return Some((name.clone(), why));
            }
            Some((
                name.clone(),
                format!(
                    "{why}; the DaemonSet has no Pod on it now (rolling? if it no longer \
                     schedules to it, retire it with \
                     `kube-ovn-ipsec-controller retire-node {name} --uid {frozen}`)"
                ),
            ))
        })
        .collect();
    // A re-created Node's release cannot be told from a replay either.
    out.extend(recreated(record, &o.nodes));
    out
}

/// `Prepare` and `Arm`: the cohort's changes first (each a restart from
/// `Prepare`), then the barrier, then NB and SB.
fn barrier(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    use CoordinationPhase::*;
    if !o.want_enabled {
        return start_disable(record, o, "disable wanted during the enable barrier");
    }
    let Some(ds) = &o.daemon_set else {
        return Ok(hold("the kube-ovn-cni DaemonSet does not exist"));
    };
    let Some(trust) = o.trust else {
        return Ok(hold("the trust bundle is not readable"));
    };
    let retire = retirements(record, o);
    if !retire.apply.is_empty() {
        return write(
            prepare(record, ds, trust, cohort(record, o, &retire.apply))?,
            format!(
                "back to Prepare: retired {} on the operator's request",
                names(retire.apply.keys())
            ),
        );
    }
    let recreated = recreated(record, &o.scheduled);
    if !recreated.is_empty() {
        let mut waiting = recreated;
        merge(&mut waiting, retire.refused);
        return Ok(Decision::Hold {
            reason: "a target's Node was re-created".into(),
            waiting,
        });
    }
    let no_retirement = BTreeMap::new();
    if let Some(why) = frozen_change(record, ds, &trust) {
        return write(
            prepare(record, ds, trust, cohort(record, o, &no_retirement))?,
            format!("back to Prepare: {why}"),
        );
    }
    let joined = joiners(record, o);
    let left = leavers(record, o);
    let joiners_wait = nb_may_be_on(o);
    if !left.is_empty() || (!joined.is_empty() && !joiners_wait) {
        let why = if joiners_wait {
            format!(
                "back to Prepare: the cohort changed (left: {}; NB_Global.ipsec may be true, \
                 so no node joins before Enabled)",
                names(left)
            )
        } else {
            format!(
                "back to Prepare: the cohort changed (joined: {}; left: {})",
                names(joined),
                names(left)
            )
        };
        return write(
            prepare(record, ds, trust, cohort(record, o, &no_retirement))?,
            why,
        );
    }
    let mut waiting = waiting(record, o);
    if !waiting.is_empty() {
        for name in joined {
            waiting.insert(name.clone(), joiner_reason(record, o, name));
        }
        merge(&mut waiting, retire.refused);
        return Ok(Decision::Hold {
            reason: format!("{} barrier: waiting for receipts", record.phase),
            waiting,
        });
    }
    if record.phase == Prepare {
        let next = record.transition(Arm, None).map_err(Error::Coordination)?;
        return write(next, "every target prepared: Arm");
    }
    match (o.nb_ipsec, o.sb_ipsec) {
        (Some(true), Some(true)) => {
            let next = record
                .transition(Enabled, None)
                .map_err(Error::Coordination)?;
            write(next, "every target armed, NB and SB read true: Enabled")
        }
        (Some(true), sb) => Ok(hold(format!(
            "NB_Global.ipsec is true; waiting for SB_Global.ipsec (read {sb:?})"
        ))),
        (Some(false), _) => Ok(Decision::SetNb(true)),
        (None, _) => Ok(hold("NB_Global is not readable")),
    }
}

/// `Enabled`: no barrier. The switch is kept on; each change of the cohort
/// or of what admissions are judged against is a new epoch of `Enabled`,
/// one per pass: retirements, leavers, the frozen DaemonSet, template and
/// trust following the live ones, then admissions (last, so a joiner is
/// judged against a record that is up to date).
fn enabled(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    if !o.want_enabled {
        return start_disable(record, o, "disable wanted");
    }
    // Enabled is the intent: a switch turned off behind the controller's
    // back is turned on again (every target is armed, so this costs
    // nothing).
    if o.nb_ipsec == Some(false) {
        return Ok(Decision::SetNb(true));
    }
    let Some(ds) = &o.daemon_set else {
        return Ok(hold(
            "Enabled; the kube-ovn-cni DaemonSet does not exist: no node can be admitted",
        ));
    };
    let Some(trust) = o.trust else {
        return Ok(hold(
            "Enabled; the trust bundle is not readable: no node can be admitted",
        ));
    };
    let retire = retirements(record, o);
    if !retire.apply.is_empty() {
        let mut next = next_epoch(record)?;
        next.targets.retain(|n, _| !retire.apply.contains_key(n));
        return write(
            next,
            format!(
                "Enabled: retired {} on the operator's request",
                names(retire.apply.keys())
            ),
        );
    }
    // A target without a Pod keeps its state: it stays a target until its
    // Node is gone, so the next disable asks it for its release.
    let left = gone(record, o);
    if !left.is_empty() {
        let mut next = next_epoch(record)?;
        next.targets.retain(|n, _| o.nodes.contains_key(n));
        return write(
            next,
            format!("Enabled: dropped {}: the Node is gone", names(left)),
        );
    }
    if let Some(why) = frozen_change(record, ds, &trust) {
        let mut next = next_epoch(record)?;
        next.daemon_set_uid = Some(ds.uid.clone());
        next.template_hash = Some(ds.template_hash.clone());
        next.trust_hash = Some(trust);
        return write(
            next,
            format!("Enabled: {why}; admissions are judged against it"),
        );
    }
    let joined = joiners(record, o);
    let admitted: Vec<&String> = joined
        .iter()
        .copied()
        .filter(|n| o.admissions.get(*n) == Some(&Verdict::Satisfied))
        .collect();
    if !admitted.is_empty() {
        let mut next = next_epoch(record)?;
        for name in &admitted {
            if let Some(uid) = o.scheduled.get(*name) {
                next.targets.insert((*name).clone(), uid.clone());
            }
        }
        return write(
            next,
            format!("Enabled: admitted {} on its Arm receipt", names(admitted)),
        );
    }
    let mut waiting = recreated(record, &o.scheduled);
    for name in joined {
        waiting.insert(name.clone(), joiner_reason(record, o, name));
    }
    merge(&mut waiting, retire.refused);
    if waiting.is_empty() {
        return Ok(Decision::Idle);
    }
    Ok(Decision::Hold {
        reason: format!("Enabled; {} node(s) waiting", waiting.len()),
        waiting,
    })
}

#[cfg(test)]
mod tests;
