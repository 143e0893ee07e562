//! The coordinator's decision, as a pure function (SPEC §7, enable side):
//! the record as stored and what the controller observed in one pass go
//! in, one [`Decision`] comes out. The shell (the leader's loop) performs
//! it — a record write with a resourceVersion precondition, or the NB
//! write — and observes again; nothing here reads a clock or the API.
//!
//! One decision per pass keeps every side effect after the write that
//! justifies it: `NB_Global.ipsec` is set only while the stored record is
//! `Arm` with every target's `Arm` receipt verified, and `Enabled` is
//! written only after NB and SB both read true. A controller killed between
//! any two passes resumes from the stored record and repeats at most an
//! idempotent step (setting NB to the value it already has is no flip).
//!
//! Cohort rules (where SPEC §7 leaves a choice, docs/coordination.md):
//! - a change of the DaemonSet (UID), its template or the trust during
//!   `Prepare`/`Arm` restarts from `Prepare` with everything re-frozen;
//! - a node the DaemonSet newly schedules to during `Prepare`/`Arm` joins by
//!   the same restart (the cohort is what the DaemonSet schedules to);
//! - a target that is no longer scheduled to (Node deleted, DaemonSet no
//!   longer selects it) leaves by the same restart, and the decision names
//!   it: nothing is enabled on a node that is not there;
//! - a target whose Node UID changed (deleted and re-created under the same
//!   name) holds the barrier with that reason until an operator retires it:
//!   its evidence cannot be told apart from a replay, so it is never
//!   silently dropped or re-admitted.

use std::collections::BTreeMap;

use kube_ovn_ipsec_api::coordination::{Challenge, CoordinationPhase, CoordinationRecord};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;

use crate::error::{Error, Result};

/// The live kube-ovn-cni DaemonSet, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDaemonSet {
    /// `metadata.uid`.
    pub uid: Uid,
    /// The current template hash (the newest ControllerRevision's
    /// `controller-revision-hash`).
    pub template_hash: String,
}

/// What one node's receipt annotation came to for the stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A receipt for this record's generation, epoch and phase, verified
    /// end to end and satisfying the phase's barrier.
    Satisfied,
    /// No receipt annotation.
    Missing,
    /// A receipt that does not satisfy the barrier: `check` names the
    /// check (an Event reason), `message` says what was found.
    Refused {
        /// The check that failed, e.g. `ReceiptEpochMismatch`.
        check: &'static str,
        /// What the check found.
        message: String,
    },
}

impl Verdict {
    /// Why this node holds the barrier, for status and Events.
    pub fn waiting_reason(&self) -> Option<String> {
        match self {
            Verdict::Satisfied => None,
            Verdict::Missing => Some("no receipt yet".into()),
            Verdict::Refused { check, message } => Some(format!("{check}: {message}")),
        }
    }
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
    /// Per target of the stored record, its receipt's verdict against it.
    /// A target absent here counts as [`Verdict::Missing`].
    pub receipts: BTreeMap<String, Verdict>,
    /// `NB_Global.ipsec` as a synchronous read returned it (`None`:
    /// unreadable).
    pub nb_ipsec: Option<bool>,
    /// `SB_Global.ipsec` likewise.
    pub sb_ipsec: Option<bool>,
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

/// The record of a fresh `Prepare` from `from`: new epoch, everything
/// frozen from what is live now.
fn prepare(
    from: &CoordinationRecord,
    ds: &LiveDaemonSet,
    trust: Sha256Digest,
    scheduled: &BTreeMap<String, Uid>,
) -> Result<CoordinationRecord> {
    let mut next = from
        .transition(CoordinationPhase::Prepare, None)
        .map_err(Error::Coordination)?;
    next.daemon_set_uid = Some(ds.uid.clone());
    next.template_hash = Some(ds.template_hash.clone());
    next.trust_hash = Some(trust);
    next.targets = scheduled.clone();
    Ok(next)
}

/// How the live cohort differs from the frozen one, if it does: the reason
/// to restart from `Prepare`, or (UID changes) to hold.
enum Drift {
    None,
    Refreeze(String),
    Retire(BTreeMap<String, String>),
}

fn drift(
    record: &CoordinationRecord,
    o: &Observation,
    ds: &LiveDaemonSet,
    trust: &Sha256Digest,
) -> Drift {
    let mut retire = BTreeMap::new();
    for (name, frozen) in &record.targets {
        if let Some(live) = o.scheduled.get(name)
            && live != frozen
        {
            retire.insert(
                name.clone(),
                format!(
                    "NodeUIDChanged: the Node was re-created (UID {frozen} frozen, {live} live); \
                     retire it from the cohort before the barrier can complete"
                ),
            );
        }
    }
    if !retire.is_empty() {
        return Drift::Retire(retire);
    }
    if record.daemon_set_uid.as_ref() != Some(&ds.uid) {
        return Drift::Refreeze("the DaemonSet was re-created".into());
    }
    if record.template_hash.as_deref() != Some(ds.template_hash.as_str()) {
        return Drift::Refreeze(format!(
            "the DaemonSet template changed to {}",
            ds.template_hash
        ));
    }
    if record.trust_hash.as_ref() != Some(trust) {
        return Drift::Refreeze("the trust bundle changed".into());
    }
    let joined: Vec<&String> = o
        .scheduled
        .keys()
        .filter(|n| !record.targets.contains_key(*n))
        .collect();
    let left: Vec<&String> = record
        .targets
        .keys()
        .filter(|n| !o.scheduled.contains_key(*n))
        .collect();
    match (joined.is_empty(), left.is_empty()) {
        (true, true) => Drift::None,
        _ => Drift::Refreeze(format!(
            "the cohort changed (joined: {joined:?}, left: {left:?})"
        )),
    }
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

/// The one next step from `record` given `o`.
pub fn decide(record: &CoordinationRecord, o: &Observation) -> Result<Decision> {
    use CoordinationPhase::*;
    match record.phase {
        Disabled => {
            if !o.want_enabled {
                return Ok(Decision::Idle);
            }
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
            write(prepare(record, ds, trust, &o.scheduled)?, "enable: Prepare")
        }
        Prepare | Arm => {
            if !o.want_enabled {
                let next = record
                    .transition(Disabling, Some(o.fresh_challenge))
                    .map_err(Error::Coordination)?;
                return write(next, "disable wanted during the enable barrier");
            }
            let Some(ds) = &o.daemon_set else {
                return Ok(hold("the kube-ovn-cni DaemonSet does not exist"));
            };
            let Some(trust) = o.trust else {
                return Ok(hold("the trust bundle is not readable"));
            };
            match drift(record, o, ds, &trust) {
                Drift::Retire(waiting) => {
                    return Ok(Decision::Hold {
                        reason: "a target's Node was re-created".into(),
                        waiting,
                    });
                }
                Drift::Refreeze(why) => {
                    return write(
                        prepare(record, ds, trust, &o.scheduled)?,
                        format!("back to Prepare: {why}"),
                    );
                }
                Drift::None => {}
            }
            let waiting = waiting(record, o);
            if !waiting.is_empty() {
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
        Enabled => {
            if !o.want_enabled {
                let next = record
                    .transition(Disabling, Some(o.fresh_challenge))
                    .map_err(Error::Coordination)?;
                return write(next, "disable wanted");
            }
            // Enabled is the intent: a switch turned off behind the
            // controller's back is turned on again (every target is armed,
            // so this costs nothing).
            match o.nb_ipsec {
                Some(false) => Ok(Decision::SetNb(true)),
                _ => Ok(Decision::Idle),
            }
        }
        Disabling | Cleanup | Release => Ok(hold(format!(
            "{}: the disable side is not coordinated by this build",
            record.phase
        ))),
    }
}

#[cfg(test)]
mod tests;
