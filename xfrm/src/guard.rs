//! The XFRM guards (SPEC §4): arming, read-back by index, re-adding a
//! vanished guard (never over a conflicting policy), and — for the cleanup
//! path only — withdrawal of exactly the lease's guards.
//!
//! [`GuardKeeper::evaluate`] is the one operation the guard actor calls,
//! after arming and on every readiness evaluation. It never deletes or
//! replaces anything; its result says whether protection is armed (every
//! guard read back identical), which events to report, and whether the
//! lease's recorded indexes changed (the caller persists the lease then).
//! Nothing here runs on exit or drop: guards outlive the agent.

use serde::{Deserialize, Serialize};

use crate::model::{Family, FieldMismatch, Policy, compare_guard};
use crate::{AddOutcome, Error, Xfrm};

/// A guard that was armed: its family and kernel index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardRecord {
    /// Address family of the guard.
    pub family: Family,
    /// The kernel's policy index.
    pub index: u32,
}

/// What the keeper needs of a lease: the mark its guards block, and where
/// the kernel indexes of its guards are recorded. The agent's persisted
/// lease implements it; [`Guards`] is the plain form.
pub trait GuardSet {
    /// The output mark (matched exactly, `/0xffffffff`).
    fn mark(&self) -> u32;
    /// The recorded guards.
    fn guards(&self) -> &[GuardRecord];
    /// The recorded guards, to update.
    fn guards_mut(&mut self) -> &mut Vec<GuardRecord>;

    /// The recorded guard of `family`, if any.
    fn guard(&self, family: Family) -> Option<GuardRecord> {
        self.guards().iter().copied().find(|g| g.family == family)
    }

    /// Records (or replaces) the guard of `family`.
    fn record_guard(&mut self, family: Family, index: u32) {
        let guards = self.guards_mut();
        guards.retain(|g| g.family != family);
        guards.push(GuardRecord { family, index });
        guards.sort_by_key(|g| g.family);
    }
}

/// A mark and its recorded guards, without the rest of a lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guards {
    /// The output mark.
    pub mark: u32,
    /// The recorded guards.
    pub records: Vec<GuardRecord>,
}

impl Guards {
    /// Guards of `mark`, none recorded yet.
    pub fn new(mark: u32) -> Self {
        Self {
            mark,
            records: Vec::new(),
        }
    }
}

impl GuardSet for Guards {
    fn mark(&self) -> u32 {
        self.mark
    }
    fn guards(&self) -> &[GuardRecord] {
        &self.records
    }
    fn guards_mut(&mut self) -> &mut Vec<GuardRecord> {
        &mut self.records
    }
}

/// Something worth an event (and a log line) that happened to a guard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardEvent {
    /// The guard was installed for the first time.
    Armed {
        /// Its family.
        family: Family,
        /// Its kernel index.
        index: u32,
    },
    /// The recorded guard had vanished and was added again.
    Readded {
        /// Its family.
        family: Family,
        /// The index it had.
        old_index: u32,
        /// The index it has now.
        new_index: u32,
    },
    /// An identical guard was found under another index (re-added by a
    /// previous agent that crashed before persisting); its index is
    /// recorded now.
    Adopted {
        /// Its family.
        family: Family,
        /// The recorded index, if any.
        old_index: Option<u32>,
        /// The index found.
        new_index: u32,
    },
    /// A policy other than the guard occupies the guard's place. Nothing
    /// was changed; protection is not armed for this family.
    Conflict {
        /// The family.
        family: Family,
        /// The conflicting policy's index.
        index: u32,
        /// How it differs from the guard.
        mismatches: Vec<FieldMismatch>,
    },
}

/// The state of one family's guard after an evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardStatus {
    /// Read back from the kernel, identical to the guard.
    Verified {
        /// The kernel index.
        index: u32,
    },
    /// Another policy is in the way (see [`GuardEvent::Conflict`]).
    Conflict {
        /// The conflicting policy's index.
        index: u32,
    },
}

/// Result of [`GuardKeeper::evaluate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// True only when every family's guard was read back identical.
    pub armed: bool,
    /// Per family.
    pub guards: Vec<(Family, GuardStatus)>,
    /// What happened, to report.
    pub events: Vec<GuardEvent>,
    /// The lease's recorded indexes changed: persist it.
    pub lease_changed: bool,
}

/// Result of [`GuardKeeper::withdraw`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Withdrawal {
    /// Guards deleted and confirmed gone.
    pub removed: Vec<(Family, u32)>,
    /// Policies at a guard's place that did not match the lease exactly:
    /// left alone.
    pub refused: Vec<(Family, u32)>,
}

/// Keeps a lease's guards armed through an [`Xfrm`] port.
#[derive(Debug)]
pub struct GuardKeeper<X> {
    xfrm: X,
    readds: u64,
    conflicts: u64,
}

impl<X: Xfrm> GuardKeeper<X> {
    /// A keeper using `xfrm` (a socket of the node's network namespace).
    pub fn new(xfrm: X) -> Self {
        Self {
            xfrm,
            readds: 0,
            conflicts: 0,
        }
    }

    /// How many vanished guards were re-added (a counter metric).
    pub fn readds_total(&self) -> u64 {
        self.readds
    }

    /// How many evaluations found a conflict (a counter metric).
    pub fn conflicts_total(&self) -> u64 {
        self.conflicts
    }

    /// The port, for dumps (lease allocation, SA attribution).
    pub fn xfrm(&mut self) -> &mut X {
        &mut self.xfrm
    }

    /// Arms the guards of `lease`: the same as [`Self::evaluate`], named
    /// for the first call.
    pub fn arm(&mut self, lease: &mut impl GuardSet) -> Result<Evaluation, Error> {
        self.evaluate(lease)
    }

    /// Reads every guard back by its recorded index and compares it field
    /// by field; installs a missing one (never over a conflicting policy).
    pub fn evaluate(&mut self, lease: &mut impl GuardSet) -> Result<Evaluation, Error> {
        let mut eval = Evaluation {
            armed: true,
            guards: Vec::new(),
            events: Vec::new(),
            lease_changed: false,
        };
        for family in Family::ALL {
            let status = self.evaluate_family(lease, family, &mut eval)?;
            if matches!(status, GuardStatus::Conflict { .. }) {
                eval.armed = false;
                self.conflicts += 1;
            }
            eval.guards.push((family, status));
        }
        Ok(eval)
    }

    fn evaluate_family(
        &mut self,
        lease: &mut impl GuardSet,
        family: Family,
        eval: &mut Evaluation,
    ) -> Result<GuardStatus, Error> {
        let expected = Policy::guard(family, lease.mark());
        let recorded = lease.guard(family).map(|g| g.index);
        if let Some(index) = recorded {
            let probe = Policy {
                index,
                ..expected.clone()
            };
            match self.xfrm.get_policy_by_index(&probe)? {
                Some(found) => {
                    let mismatches = compare_guard(&expected, &found);
                    if mismatches.is_empty() {
                        return Ok(GuardStatus::Verified { index });
                    }
                    eval.events.push(GuardEvent::Conflict {
                        family,
                        index,
                        mismatches,
                    });
                    return Ok(GuardStatus::Conflict { index });
                }
                None => {
                    tracing::warn!(%family, index, "guard vanished from the kernel");
                }
            }
        }
        // Not recorded or vanished: look at the guard's kernel key first.
        if let Some(found) = self.xfrm.get_policy_by_selector(&expected)? {
            let mismatches = compare_guard(&expected, &found);
            if !mismatches.is_empty() {
                eval.events.push(GuardEvent::Conflict {
                    family,
                    index: found.index,
                    mismatches,
                });
                return Ok(GuardStatus::Conflict { index: found.index });
            }
            eval.events.push(GuardEvent::Adopted {
                family,
                old_index: recorded,
                new_index: found.index,
            });
            lease.record_guard(family, found.index);
            eval.lease_changed = true;
            return self.read_back(family, &expected, found.index);
        }
        match self.xfrm.add_policy(&expected)? {
            AddOutcome::Added(added) => {
                match recorded {
                    Some(old_index) => {
                        self.readds += 1;
                        eval.events.push(GuardEvent::Readded {
                            family,
                            old_index,
                            new_index: added.index,
                        });
                    }
                    None => eval.events.push(GuardEvent::Armed {
                        family,
                        index: added.index,
                    }),
                }
                lease.record_guard(family, added.index);
                eval.lease_changed = true;
                self.read_back(family, &expected, added.index)
            }
            // Someone added a policy with the guard's key between the
            // lookup and the add: the next evaluation classifies it.
            AddOutcome::Exists => Ok(GuardStatus::Conflict { index: 0 }),
        }
    }

    /// The read-back by index that makes a fresh guard count as armed.
    fn read_back(
        &mut self,
        family: Family,
        expected: &Policy,
        index: u32,
    ) -> Result<GuardStatus, Error> {
        let probe = Policy {
            index,
            ..expected.clone()
        };
        match self.xfrm.get_policy_by_index(&probe)? {
            Some(found) if compare_guard(expected, &found).is_empty() => {
                Ok(GuardStatus::Verified { index })
            }
            _ => {
                tracing::warn!(%family, index, "guard did not read back identical");
                Ok(GuardStatus::Conflict { index })
            }
        }
    }

    /// Deletes the lease's guards — only policies that match the lease's
    /// guard exactly — and confirms they are gone. For the cleanup path
    /// (SPEC §8) only; the agent's run path never calls it.
    pub fn withdraw(&mut self, lease: &impl GuardSet) -> Result<Withdrawal, Error> {
        let mut out = Withdrawal::default();
        for family in Family::ALL {
            let expected = Policy::guard(family, lease.mark());
            let found = match lease.guard(family) {
                Some(g) => self.xfrm.get_policy_by_index(&Policy {
                    index: g.index,
                    ..expected.clone()
                })?,
                None => None,
            };
            let found = match found {
                Some(f) => Some(f),
                None => self.xfrm.get_policy_by_selector(&expected)?,
            };
            let Some(found) = found else { continue };
            if !compare_guard(&expected, &found).is_empty() {
                out.refused.push((family, found.index));
                continue;
            }
            self.xfrm.delete_policy(&found)?;
            if self.xfrm.get_policy_by_index(&found)?.is_some() {
                return Err(Error::GuardStillPresent {
                    family,
                    index: found.index,
                });
            }
            out.removed.push((family, found.index));
        }
        Ok(out)
    }
}
