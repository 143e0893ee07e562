//! Enable/disable coordination (SPEC §7): the controller's record, the
//! phase state machine, and the nodes' signed receipts.
//!
//! # The record
//!
//! [`CoordinationRecord`] is the JSON under key `state` of ConfigMap
//! `ovn-ipsec-coordination`. Only the controller writes it, always through
//! [`CoordinationRecord::encode`] (canonical JSON, so an unchanged record is
//! an unchanged string and does not churn `resourceVersion`).
//!
//! # Phases and transitions
//!
//! ```text
//!            +---------+   +-----+   +---------+
//! Disabled ->| Prepare |-->| Arm |-->| Enabled |
//!    ^       +---------+<--+-----+   +---------+
//!    |            |           |           |
//!    |            v           v           v
//!    |       +-----------------------------------+
//!    |       |             Disabling             |<--+--+
//!    |       +-----------------------------------+   |  |
//!    |                        |                      |  |
//!    |                        v                      |  |
//!    |                   +---------+                 |  |
//!    |                   | Cleanup |-----------------+  |
//!    |                   +---------+                    |
//!    |                        v                         |
//!    |                   +---------+                    |
//!    +-------------------| Release |--------------------+
//!                        +---------+
//! ```
//!
//! plus the self-transitions `Prepare -> Prepare` (template or trust changed
//! during the barrier: restart with a new epoch) and `Disabling -> Disabling`
//! (fresh challenge). `Cleanup`/`Release -> Disabling` is the "NB or SB
//! turned true again" path. `Disabling`/`Cleanup`/`Release -> Prepare` is
//! a re-enable before the disable finished: the operator reverted the
//! DaemonSet to the `ipsec` container, so the cleanup shape a disable waits
//! for may never come, and waiting for it would be a one-way door. It is
//! safe because the switch only turns on again after the `Prepare` and
//! `Arm` barriers, so a node that already withdrew is re-armed first.
//!
//! Every transition takes a new `epoch`. `generation` counts cycles: it is
//! incremented whenever the intent turns (`Disabled`/`Disabling`/`Cleanup`/
//! `Release -> Prepare`, and `Prepare`/`Arm`/`Enabled -> Disabling`).
//!
//! # Receipts
//!
//! A [`Receipt`] is a node's evidence for the `Prepare` and `Arm` barriers;
//! a [`ReleaseReceipt`] its evidence for `Release`. Both are signed with the
//! node's IPsec key ([`crate::signed`]) under distinct domain prefixes:
//!
//! * receipt: [`RECEIPT_DOMAIN`] = `"kube-ovn IPsec coordination receipt v1\0"`
//! * release receipt: [`RELEASE_RECEIPT_DOMAIN`] =
//!   `"kube-ovn IPsec coordination release receipt v1\0"`
//!
//! so neither can be replayed as the other. Both are capped at
//! [`defaults::RECEIPT_MAX_BYTES`] (8 KiB) as annotation strings. Their
//! shared fields are one [`ReceiptHead`] view ([`NodeReceipt::head`]), so
//! the checks both kinds go through are written once; each keeps its own
//! struct so that its JSON, which is what gets signed, stays as it is.
//!
//! Freshness: a [`Receipt`] must be observed within
//! [`defaults::RECEIPT_MAX_AGE_SECS`] and not in the future. A
//! [`ReleaseReceipt`] is written once by a one-shot init container and must
//! stay valid through a serial rollout of every node, so it is bound by
//! epoch, challenge and Pod instead of age; only "not in the future" applies.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::canonical::to_canonical_vec;
use crate::digest::Sha256Digest;
use crate::error::{Error, Result};
use crate::ident::Uid;
use crate::names::defaults;
use crate::signed::SignedPayload;
use crate::time::Timestamp;

/// The record format version this build reads and writes.
pub const COORDINATION_VERSION: u64 = 1;
/// Domain prefix of a signed [`Receipt`].
pub const RECEIPT_DOMAIN: &[u8] = b"kube-ovn IPsec coordination receipt v1\0";
/// Domain prefix of a signed [`ReleaseReceipt`].
pub const RELEASE_RECEIPT_DOMAIN: &[u8] = b"kube-ovn IPsec coordination release receipt v1\0";

/// A cluster-wide coordination phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CoordinationPhase {
    /// Identity and capability gate on every target; nothing armed.
    Prepare,
    /// Leases published, guards armed and read back, runtime started.
    Arm,
    /// `NB_Global.ipsec = true`, confirmed in NB and SB.
    Enabled,
    /// Disable started: challenge persisted, NB switch being turned off.
    Disabling,
    /// NB and SB read false and the DaemonSet has the cleanup shape.
    Cleanup,
    /// Nodes roll through the cleanup init container and publish release
    /// receipts.
    Release,
    /// Nothing of this project remains on any target. Also the state of a
    /// missing record.
    Disabled,
}

impl CoordinationPhase {
    /// Every phase, in lifecycle order.
    pub const ALL: [CoordinationPhase; 7] = [
        CoordinationPhase::Prepare,
        CoordinationPhase::Arm,
        CoordinationPhase::Enabled,
        CoordinationPhase::Disabling,
        CoordinationPhase::Cleanup,
        CoordinationPhase::Release,
        CoordinationPhase::Disabled,
    ];

    /// Whether the state machine allows `self -> next` (see the module doc).
    pub fn can_transition_to(self, next: CoordinationPhase) -> bool {
        use CoordinationPhase::*;
        matches!(
            (self, next),
            (Disabled, Prepare)
                | (Prepare, Prepare | Arm | Disabling)
                | (Arm, Prepare | Enabled | Disabling)
                | (Enabled, Disabling)
                | (Disabling, Disabling | Cleanup | Prepare)
                | (Cleanup, Release | Disabling | Prepare)
                | (Release, Disabled | Disabling | Prepare)
        )
    }

    /// `Prepare`, `Arm` or `Enabled`.
    pub fn is_enable_side(self) -> bool {
        matches!(
            self,
            CoordinationPhase::Prepare | CoordinationPhase::Arm | CoordinationPhase::Enabled
        )
    }

    /// `Disabling`, `Cleanup` or `Release`: phases that carry a challenge
    /// and in which the cleanup init container may act.
    pub fn is_disable_side(self) -> bool {
        matches!(
            self,
            CoordinationPhase::Disabling | CoordinationPhase::Cleanup | CoordinationPhase::Release
        )
    }

    /// The name as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            CoordinationPhase::Prepare => "Prepare",
            CoordinationPhase::Arm => "Arm",
            CoordinationPhase::Enabled => "Enabled",
            CoordinationPhase::Disabling => "Disabling",
            CoordinationPhase::Cleanup => "Cleanup",
            CoordinationPhase::Release => "Release",
            CoordinationPhase::Disabled => "Disabled",
        }
    }
}

impl fmt::Display for CoordinationPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks `from -> to` against the state machine.
pub fn check_transition(from: CoordinationPhase, to: CoordinationPhase) -> Result<()> {
    if from.can_transition_to(to) {
        Ok(())
    } else {
        Err(Error::InvalidTransition {
            from: from.to_string(),
            to: to.to_string(),
        })
    }
}

/// The disable challenge: 32 random bytes chosen by the controller, as 64
/// lowercase hex characters. Not secret (it sits in a ConfigMap); it makes
/// release receipts single-use per disable attempt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Challenge([u8; 32]);

impl Challenge {
    /// Wraps 32 bytes. The caller supplies them from a CSPRNG: randomness
    /// is a side effect and stays outside this crate.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Challenge(bytes)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for Challenge {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        // Same spelling rules as a digest: 64 lowercase hex.
        let d: Sha256Digest = s.parse().map_err(|_| {
            Error::invalid_value("challenge", "must be 64 lowercase hex characters")
        })?;
        Ok(Challenge(*d.as_bytes()))
    }
}

impl TryFrom<String> for Challenge {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Challenge> for String {
    fn from(c: Challenge) -> String {
        hex::encode(c.0)
    }
}

impl fmt::Display for Challenge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Challenge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Challenge({self})")
    }
}

/// The coordination record (ConfigMap `ovn-ipsec-coordination`, key
/// `state`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CoordinationRecord {
    /// Format version, [`COORDINATION_VERSION`].
    pub version: u64,
    /// Enable/disable cycle counter (see the module doc).
    pub generation: u64,
    /// Incremented on every transition; receipts must name it.
    pub epoch: u64,
    /// The current phase.
    pub phase: CoordinationPhase,
    /// The frozen kube-ovn-cni DaemonSet's UID.
    #[serde(rename = "daemonSetUID")]
    pub daemon_set_uid: Option<Uid>,
    /// The frozen Pod template hash (the DaemonSet's
    /// `controller-revision-hash`).
    pub template_hash: Option<String>,
    /// The frozen trust bundle digest ([`crate::pki::TrustBundle::digest`]).
    pub trust_hash: Option<Sha256Digest>,
    /// The frozen cohort: node name -> Node UID.
    pub targets: BTreeMap<String, Uid>,
    /// The disable challenge; set in `Disabling`, `Cleanup`, `Release`.
    pub challenge: Option<Challenge>,
    /// `NB_Global` row UUID, recorded on entering `Cleanup`.
    #[serde(rename = "nbGlobalUUID")]
    pub nb_global_uuid: Option<Uuid>,
    /// `SB_Global` row UUID, recorded on entering `Cleanup`.
    #[serde(rename = "sbGlobalUUID")]
    pub sb_global_uuid: Option<Uuid>,
}

impl Default for CoordinationRecord {
    fn default() -> Self {
        CoordinationRecord::initial()
    }
}

impl CoordinationRecord {
    /// The record a missing ConfigMap stands for: `Disabled`, generation and
    /// epoch 0, nothing frozen.
    pub fn initial() -> Self {
        CoordinationRecord {
            version: COORDINATION_VERSION,
            generation: 0,
            epoch: 0,
            phase: CoordinationPhase::Disabled,
            daemon_set_uid: None,
            template_hash: None,
            trust_hash: None,
            targets: BTreeMap::new(),
            challenge: None,
            nb_global_uuid: None,
            sb_global_uuid: None,
        }
    }

    /// Decodes the ConfigMap value: size cap, version, schema (unknown
    /// fields rejected), then [`CoordinationRecord::validate`].
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > defaults::COORDINATION_MAX_BYTES {
            return Err(Error::TooLarge {
                len: bytes.len(),
                max: defaults::COORDINATION_MAX_BYTES,
            });
        }
        let v: serde_json::Value = serde_json::from_slice(bytes).map_err(Error::document)?;
        // Version first, so a newer controller's record reports "version"
        // rather than a confusing unknown-field error.
        match v.get("version").and_then(serde_json::Value::as_u64) {
            Some(COORDINATION_VERSION) => {}
            Some(found) => {
                return Err(Error::UnsupportedVersion {
                    found,
                    expected: COORDINATION_VERSION,
                });
            }
            None => {
                return Err(Error::InvalidDocument {
                    reason: "missing or non-integer version".into(),
                });
            }
        }
        let rec: CoordinationRecord = serde_json::from_value(v).map_err(Error::document)?;
        rec.validate()?;
        Ok(rec)
    }

    /// Canonical JSON text for the ConfigMap.
    pub fn encode(&self) -> Result<String> {
        self.validate()?;
        let bytes = to_canonical_vec(self)?;
        String::from_utf8(bytes).map_err(|_| Error::NonCanonical)
    }

    /// Invariants per phase: enable-side phases have the frozen DaemonSet,
    /// template and trust; disable-side phases have a challenge; `Cleanup`
    /// and `Release` also the NB/SB row UUIDs, DaemonSet UID and template.
    pub fn validate(&self) -> Result<()> {
        if self.version != COORDINATION_VERSION {
            return Err(Error::UnsupportedVersion {
                found: self.version,
                expected: COORDINATION_VERSION,
            });
        }
        let missing = |field: &str| {
            Err(Error::InvalidDocument {
                reason: format!("phase {} requires {field}", self.phase),
            })
        };
        if self.phase.is_enable_side() {
            if self.daemon_set_uid.is_none() {
                return missing("daemonSetUID");
            }
            if self.template_hash.is_none() {
                return missing("templateHash");
            }
            if self.trust_hash.is_none() {
                return missing("trustHash");
            }
        }
        if self.phase.is_disable_side() && self.challenge.is_none() {
            return missing("challenge");
        }
        if matches!(
            self.phase,
            CoordinationPhase::Cleanup | CoordinationPhase::Release
        ) {
            if self.nb_global_uuid.is_none() || self.sb_global_uuid.is_none() {
                return missing("nbGlobalUUID and sbGlobalUUID");
            }
            if self.daemon_set_uid.is_none() || self.template_hash.is_none() {
                return missing("daemonSetUID and templateHash");
            }
        }
        Ok(())
    }

    /// The record after `self.phase -> to`: new epoch, generation bumped when
    /// a cycle starts, challenge set on entering `Disabling` and cleared on
    /// entering `Prepare`.
    ///
    /// `challenge` must be `Some` (and differ from the current one) exactly
    /// when `to` is `Disabling`. Frozen fields (DaemonSet, template, trust,
    /// targets, row UUIDs) are the caller's to set on the result; the result
    /// is not validated here because the caller fills them in afterwards —
    /// [`CoordinationRecord::encode`] validates.
    pub fn transition(
        &self,
        to: CoordinationPhase,
        challenge: Option<Challenge>,
    ) -> Result<CoordinationRecord> {
        check_transition(self.phase, to)?;
        let mut next = self.clone();
        next.epoch = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| Error::invalid_value("epoch", "overflow"))?;
        // A cycle starts whenever the intent turns: enabling from `Disabled`
        // or from an unfinished disable (re-enabled before `Disabled`, which
        // must not wait for a cleanup the operator no longer wants), and
        // disabling from any enable-side phase.
        let new_cycle = (!self.phase.is_enable_side() && to == CoordinationPhase::Prepare)
            || (self.phase.is_enable_side() && to == CoordinationPhase::Disabling);
        if new_cycle {
            next.generation = self
                .generation
                .checked_add(1)
                .ok_or_else(|| Error::invalid_value("generation", "overflow"))?;
        }
        match (to, challenge) {
            (CoordinationPhase::Disabling, Some(c)) => {
                if self.challenge == Some(c) {
                    return Err(Error::invalid_value(
                        "challenge",
                        "a new Disabling needs a fresh challenge",
                    ));
                }
                next.challenge = Some(c);
            }
            (CoordinationPhase::Disabling, None) => {
                return Err(Error::invalid_value(
                    "challenge",
                    "entering Disabling requires a fresh challenge",
                ));
            }
            (_, Some(_)) => {
                return Err(Error::invalid_value(
                    "challenge",
                    "only Disabling takes a challenge",
                ));
            }
            (CoordinationPhase::Prepare, None) => next.challenge = None,
            (_, None) => {}
        }
        if to == CoordinationPhase::Prepare {
            // Row UUIDs belong to a disable cycle; a new enable re-reads them.
            next.nb_global_uuid = None;
            next.sb_global_uuid = None;
        }
        next.phase = to;
        Ok(next)
    }
}

/// Fails unless `observed` is not after `now` and, when `max_age_secs` is
/// given, not older than that.
pub fn check_freshness(
    observed: Timestamp,
    now: Timestamp,
    max_age_secs: Option<i64>,
) -> Result<()> {
    let age = now.secs_since(observed);
    if age < 0 {
        return Err(Error::ReceiptNotFresh {
            reason: format!("observed {}s in the future", -age),
        });
    }
    if let Some(max) = max_age_secs
        && age > max
    {
        return Err(Error::ReceiptNotFresh {
            reason: format!("observed {age}s ago, limit {max}s"),
        });
    }
    Ok(())
}

/// The fields every kind of receipt carries, borrowed from one: what it
/// answers, which node and Pod signed it with which CSR's certificate,
/// and what that node saw. The two kinds differ only in what follows
/// (the status they report and, for a release, the challenge and the
/// certificate itself); this view lets the checks they share be written
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptHead<'a> {
    /// The record's `generation` it answers.
    pub generation: u64,
    /// The record's `epoch` it answers.
    pub epoch: u64,
    /// The record's `phase` it answers.
    pub phase: CoordinationPhase,
    /// The Node's name.
    pub node_name: &'a str,
    /// The Node's UID.
    pub node_uid: &'a Uid,
    /// The Pod that wrote it.
    pub pod_uid: &'a Uid,
    /// Name of the CSR that issued the signing certificate.
    pub csr_name: &'a str,
    /// UID of that CSR.
    pub csr_uid: &'a Uid,
    /// The Pod's template hash.
    pub template_hash: &'a str,
    /// Digest of the trust bundle the node holds.
    pub trust_hash: &'a Sha256Digest,
    /// When the node observed what it reports.
    pub observed: Timestamp,
    /// Digest of the certificate it is signed with, from its status.
    pub certificate_digest: &'a Sha256Digest,
}

/// A node's signed coordination receipt of either kind: [`Receipt`] (the
/// `Prepare`/`Arm` barriers) or [`ReleaseReceipt`] (`Release`).
pub trait NodeReceipt: SignedPayload {
    /// The fields both kinds carry.
    fn head(&self) -> ReceiptHead<'_>;
}

/// What a node reports about itself in a [`Receipt`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiptStatus {
    /// An issued, unexpired identity that verifies against the frozen trust.
    pub identity_ready: bool,
    /// The capability gate passed (image and running ovn-controller).
    pub capability_verified: bool,
    /// Lease published and guards read back from the kernel.
    pub protection_armed: bool,
    /// Identity activated and acknowledged by the monitor read-back.
    pub configuration_applied: bool,
    /// IKE daemon and monitor healthy.
    pub runtime_healthy: bool,
    /// Digest of the certificate the receipt is signed with; the controller
    /// compares it with the certificate it verifies against.
    pub certificate_digest: Sha256Digest,
}

impl ReceiptStatus {
    /// Whether this status satisfies the barrier of `phase`: `Prepare` needs
    /// identity and capability; `Arm` needs all five flags. No other phase
    /// has a node barrier.
    pub fn satisfies(&self, phase: CoordinationPhase) -> bool {
        let prepared = self.identity_ready && self.capability_verified;
        match phase {
            CoordinationPhase::Prepare => prepared,
            CoordinationPhase::Arm => {
                prepared
                    && self.protection_armed
                    && self.configuration_applied
                    && self.runtime_healthy
            }
            _ => false,
        }
    }
}

/// A node's signed evidence for the `Prepare`/`Arm` barrier, published as
/// Node annotation `kube-ovn.io/ipsec-receipt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Receipt {
    /// The record's `generation` this answers.
    pub generation: u64,
    /// The record's `epoch` this answers.
    pub epoch: u64,
    /// The record's `phase` this answers.
    pub phase: CoordinationPhase,
    /// The Node's name.
    pub node_name: String,
    /// The Node's UID.
    #[serde(rename = "nodeUID")]
    pub node_uid: Uid,
    /// The agent's kube-ovn-cni Pod UID.
    #[serde(rename = "podUID")]
    pub pod_uid: Uid,
    /// Name of the CSR that issued the signing certificate.
    pub csr_name: String,
    /// UID of that CSR.
    #[serde(rename = "csrUID")]
    pub csr_uid: Uid,
    /// The Pod's template hash as the agent sees it.
    pub template_hash: String,
    /// Digest of the trust bundle the agent uses.
    pub trust_hash: Sha256Digest,
    /// When the node observed this state.
    pub observed: Timestamp,
    /// The node's state.
    pub status: ReceiptStatus,
}

impl SignedPayload for Receipt {
    const DOMAIN: &'static [u8] = RECEIPT_DOMAIN;
    const MAX_ENCODED_LEN: usize = defaults::RECEIPT_MAX_BYTES;
}

/// Both kinds carry the shared fields under the same names (their wire
/// formats are separate signed documents, each with its own domain), so
/// one body gives either its [`ReceiptHead`].
macro_rules! node_receipt_head {
    ($kind:ty) => {
        impl NodeReceipt for $kind {
            fn head(&self) -> ReceiptHead<'_> {
                ReceiptHead {
                    generation: self.generation,
                    epoch: self.epoch,
                    phase: self.phase,
                    node_name: &self.node_name,
                    node_uid: &self.node_uid,
                    pod_uid: &self.pod_uid,
                    csr_name: &self.csr_name,
                    csr_uid: &self.csr_uid,
                    template_hash: &self.template_hash,
                    trust_hash: &self.trust_hash,
                    observed: self.observed,
                    certificate_digest: &self.status.certificate_digest,
                }
            }
        }
    };
}

node_receipt_head!(Receipt);

/// Whether the record's trust hash is compared with the receipt's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// The receipt must name the frozen trust.
    Compared,
    /// The trust may have rotated since the cohort was frozen.
    Ignored,
}

/// Checks the fields every receipt kind shares against the record:
/// generation, epoch, phase, node in the cohort with this UID, template
/// hash and, when `trust` says so, trust hash.
fn check_common(record: &CoordinationRecord, head: ReceiptHead<'_>, trust: Trust) -> Result<()> {
    let mismatch = |field| Err(Error::ReceiptMismatch { field });
    if head.generation != record.generation {
        return mismatch("generation");
    }
    if head.epoch != record.epoch {
        return mismatch("epoch");
    }
    if head.phase != record.phase {
        return mismatch("phase");
    }
    match record.targets.get(head.node_name) {
        None => return mismatch("nodeName"),
        Some(uid) if uid != head.node_uid => return mismatch("nodeUID"),
        Some(_) => {}
    }
    if record.template_hash.as_deref() != Some(head.template_hash) {
        return mismatch("templateHash");
    }
    if trust == Trust::Compared && record.trust_hash.as_ref() != Some(head.trust_hash) {
        return mismatch("trustHash");
    }
    Ok(())
}

impl Receipt {
    /// The record-side checks of a *verified* receipt (SPEC §7): generation,
    /// epoch, phase, node in the cohort with this UID, template and trust
    /// hashes, freshness (within 2 minutes, not in the future) and the status
    /// flags the phase's barrier needs. Pod liveness, the CSR binding and the
    /// certificate chain are the caller's, against live objects.
    pub fn check_against(&self, record: &CoordinationRecord, now: Timestamp) -> Result<()> {
        check_common(record, self.head(), Trust::Compared)?;
        check_freshness(self.observed, now, Some(defaults::RECEIPT_MAX_AGE_SECS))?;
        if !self.status.satisfies(self.phase) {
            return Err(Error::ReceiptMismatch { field: "status" });
        }
        Ok(())
    }
}

/// What the cleanup init container reports in a [`ReleaseReceipt`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseStatus {
    /// The lease's `external_ids` keys are gone from OVSDB.
    pub lease_withdrawn: bool,
    /// The node's own guards were removed and confirmed gone.
    pub guards_removed: bool,
    /// The identity paths are cleared from `other_config`.
    pub identity_cleared: bool,
    /// No SA or policy with the lease's reqid or mark remained.
    pub drained: bool,
    /// The kernel boot ID the evidence was recorded under.
    #[serde(rename = "bootID")]
    pub boot_id: Uuid,
    /// Digest of the certificate the receipt is signed with.
    pub certificate_digest: Sha256Digest,
}

impl ReleaseStatus {
    /// All four cleanup steps done.
    pub fn complete(&self) -> bool {
        self.lease_withdrawn && self.guards_removed && self.identity_cleared && self.drained
    }
}

/// A node's signed evidence that it withdrew everything, published as Node
/// annotation `kube-ovn.io/ipsec-release-receipt`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReleaseReceipt {
    /// The record's `generation` this answers.
    pub generation: u64,
    /// The record's `epoch` this answers (a `Release` epoch).
    pub epoch: u64,
    /// The record's phase this answers (`Release`).
    pub phase: CoordinationPhase,
    /// The Node's name.
    pub node_name: String,
    /// The Node's UID.
    #[serde(rename = "nodeUID")]
    pub node_uid: Uid,
    /// The cleanup Pod's UID (the live Pod whose init container ran).
    #[serde(rename = "podUID")]
    pub pod_uid: Uid,
    /// Name of the CSR that issued the signing certificate.
    pub csr_name: String,
    /// UID of that CSR.
    #[serde(rename = "csrUID")]
    pub csr_uid: Uid,
    /// The cleanup Pod's template hash.
    pub template_hash: String,
    /// Digest of the trust bundle of the node's last identity.
    pub trust_hash: Sha256Digest,
    /// When cleanup finished.
    pub observed: Timestamp,
    /// The record's challenge this answers.
    pub challenge: Challenge,
    /// What was withdrawn.
    pub status: ReleaseStatus,
    /// The PEM certificate whose key signed this receipt (the node's last
    /// identity). The controller verifies a release with it — chained to
    /// the trust, naming the node's chassis — and needs the CSR object
    /// only if it still exists: kube-controller-manager deletes issued
    /// CSRs an hour after approval, and a node's last identity is usually
    /// older than that when its cleanup runs.
    pub certificate: String,
}

impl SignedPayload for ReleaseReceipt {
    const DOMAIN: &'static [u8] = RELEASE_RECEIPT_DOMAIN;
    const MAX_ENCODED_LEN: usize = defaults::RECEIPT_MAX_BYTES;
}

node_receipt_head!(ReleaseReceipt);

impl ReleaseReceipt {
    /// The record-side checks of a *verified* release receipt: generation,
    /// epoch, phase `Release`, node in the cohort with this UID, template
    /// hash, challenge, not in the future, and all cleanup steps done. The
    /// trust hash is not compared: the trust may have rotated since the
    /// cohort was frozen and cleanup never reads the CA. Pod identity and
    /// init-container exit status are the caller's, against live objects.
    pub fn check_against(&self, record: &CoordinationRecord, now: Timestamp) -> Result<()> {
        if self.phase != CoordinationPhase::Release {
            return Err(Error::ReceiptMismatch { field: "phase" });
        }
        check_common(record, self.head(), Trust::Ignored)?;
        if record.challenge != Some(self.challenge) {
            return Err(Error::ReceiptMismatch { field: "challenge" });
        }
        check_freshness(self.observed, now, None)?;
        if !self.status.complete() {
            return Err(Error::ReceiptMismatch { field: "status" });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
