//! `kube-ovn-ipsec cleanup`: the one-shot `ipsec-cleanup` init container
//! that replaces the `ipsec` container once IPsec is disabled (SPEC §8).
//!
//! It removes exactly what this project created on the node — the lease's
//! SAs and tunnel policies (crash orphans included), the lease's
//! publication in OVSDB, the guards, the identity paths in `other_config`
//! — and nothing else, then signs a release receipt the controller checks
//! before it records `Disabled`. It never starts the IKE daemon or the
//! monitor, never reads the CA, never issues or imports an identity.
//!
//! Order: the key directory's owner lock; what the node holds (lease,
//! observations, OVSDB keys, identity); the guards re-armed if one was
//! lost while OVSDB still publishes the lease; then passes of live reads ([`judge`]) until every check holds or
//! `--wait` runs out; the drain; and in this order the lease's OVSDB keys,
//! the guards (confirmed gone), the identity paths, the receipt, and last
//! the evidence files, so a run cut short anywhere repeats cleanly.
//!
//! Exit codes (docs/cleanup.md): 0 released or nothing to release;
//! [`exit_code::CLEANUP_NOT_SAFE`] a check refused or never held within
//! `--wait` (guards kept, the kubelet restarts the init container);
//! [`exit_code::FAILURE`] an I/O, OVSDB, kernel or API failure.

pub mod judge;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actors::coordinator::plan::RecordView;
use actors::keydir::{self, ActiveRecord, OwnerLock};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{Api, Client};
use kube_ovn_ipsec_api::clock::{self, Clock, SystemClock};
use kube_ovn_ipsec_api::conflict::replace_on_conflict;
use kube_ovn_ipsec_api::coordination::{CoordinationRecord, ReleaseReceipt, ReleaseStatus};
use kube_ovn_ipsec_api::digest::Sha256Digest;
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::{exit_code, k8s, ovs};
use kube_ovn_ipsec_api::pki::{Certificate, TrustBundle};
use ovsdb::{MapChanges, MapColumn, MapWriter};
use xfrm::guard::GuardKeeper;
use xfrm::{Xfrm, XfrmHandle};

use crate::lease::{Lease, LeaseStore};
use crate::node::{NodeArgs, annotate_node, sign_receipt};
use crate::sa;
use judge::{InterfaceOptions, Live, Local, Step};

/// `kube-ovn-ipsec cleanup` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CleanupArgs {
    /// Who and where this node is (the same flags as `run`).
    #[command(flatten)]
    pub node: NodeArgs,
    /// How long to wait, in seconds, for what the rollout is still changing
    /// (the controller reaching `Release`, the tunnels losing their IPsec
    /// options, the old IKE daemon exiting) before exiting non-zero; the
    /// kubelet then restarts the init container.
    #[arg(long, env = "OVN_IPSEC_CLEANUP_WAIT", default_value_t = 600)]
    pub wait: u64,
    /// Milliseconds between passes of live reads while waiting.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub poll_ms: u64,
}

/// Why cleanup did not release the node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CleanupError {
    /// A check refused, or never held within `--wait`: the guards stay
    /// armed and nothing is withdrawn; the init container is retried.
    #[error("cleanup not safe: {0}; guards kept, nothing withdrawn")]
    NotSafe(String),
    /// Something failed underneath (I/O, OVSDB, kernel, API).
    #[error("cleanup failed: {0}")]
    Failed(String),
}

impl CleanupError {
    /// The process exit code (docs/cleanup.md).
    pub fn exit_code(&self) -> i32 {
        match self {
            CleanupError::NotSafe(_) => exit_code::CLEANUP_NOT_SAFE,
            CleanupError::Failed(_) => exit_code::FAILURE,
        }
    }
}

/// How a successful run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to release (why); nothing was touched.
    NothingToRelease(String),
    /// Everything withdrawn and the release receipt published.
    Released {
        /// SAs deleted.
        states: usize,
        /// Tunnel policies deleted.
        policies: usize,
        /// Guards removed.
        guards: usize,
    },
}

/// A step of the release that a run cut short after it must repeat
/// cleanly from (the chaos suite stops the process at each: docs/chaos.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// The lease's SAs and tunnel policies are deleted and read back gone.
    Drained,
    /// The lease's keys are gone from OVSDB; the guards are still armed.
    LeaseWithdrawn,
    /// The guards are removed and confirmed gone.
    GuardsRemoved,
    /// The identity paths are gone from `other_config`.
    IdentityCleared,
    /// The release receipt is on the Node; the evidence files remain.
    ReceiptPublished,
}

impl Point {
    /// Every point, in the order a release passes them.
    pub const ALL: [Point; 5] = [
        Point::Drained,
        Point::LeaseWithdrawn,
        Point::GuardsRemoved,
        Point::IdentityCleared,
        Point::ReceiptPublished,
    ];

    /// The point's name (what a test selects it by).
    pub fn name(self) -> &'static str {
        match self {
            Point::Drained => "drained",
            Point::LeaseWithdrawn => "lease withdrawn",
            Point::GuardsRemoved => "guards removed",
            Point::IdentityCleared => "identity cleared",
            Point::ReceiptPublished => "release receipt published",
        }
    }
}

/// What a test reaches a release through, as the agent's `Seams` is
/// for the agent: a callback at each [`Point`], called synchronously right
/// after the step. [`run`] passes [`Seams::default`], which does nothing.
#[derive(Default, Clone)]
pub struct Seams {
    /// Called at each point.
    pub at: Option<Arc<dyn Fn(Point) + Send + Sync>>,
}

impl Seams {
    fn reach(&self, point: Point) {
        if let Some(at) = &self.at {
            at(point);
        }
    }
}

impl std::fmt::Debug for Seams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seams")
            .field("at", &self.at.is_some())
            .finish()
    }
}

fn failed(what: &str) -> impl FnOnce(String) -> CleanupError + '_ {
    move |e| CleanupError::Failed(format!("{what}: {e}"))
}

/// The identity the receipt is signed with.
struct Signer {
    active: ActiveRecord,
    key: PathBuf,
    certificate: Certificate,
    trust: Sha256Digest,
}

/// What the node holds, read once under the owner lock.
struct Held {
    lease: Option<Lease>,
    observations: Option<sa::Observations>,
    /// The lease keys OVSDB publishes.
    published: BTreeMap<String, String>,
    /// The identity keys in `other_config` that point into the key
    /// directory (the only ones cleanup clears).
    identity_keys: BTreeMap<String, String>,
    signer: Option<Signer>,
}

impl Held {
    fn has_state(&self) -> bool {
        self.lease.is_some()
            || self.observations.is_some()
            || !self.published.is_empty()
            || !self.identity_keys.is_empty()
    }
}

/// Runs the cleanup until it released the node, found nothing to release,
/// or must give up; `shutdown` (SIGTERM) ends a wait as not safe.
pub async fn run(
    args: CleanupArgs,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<Outcome, CleanupError> {
    run_with(args, shutdown, Seams::default()).await
}

/// [`run`], with each [`Point`] of the release reported to `seams`.
pub async fn run_with(
    args: CleanupArgs,
    shutdown: tokio::sync::watch::Receiver<bool>,
    seams: Seams,
) -> Result<Outcome, CleanupError> {
    let dir = args.node.key_dir.clone();
    let (ovs, external) = wait_for_ovsdb(&args, &shutdown).await?;
    // The node's claim before anything else (SPEC §2): an agent still
    // running here, whatever its key directory, holds it.
    let _node_claim = crate::node_claim::claim_blocking(
        args.node.xfrm_netns.clone(),
        external.row.to_string(),
        crate::node_claim::claimant("cleanup", &dir),
    )
    .await
    .map_err(|e| match e {
        crate::node_claim::ClaimError::Held { .. } => {
            CleanupError::NotSafe(format!("{e}; the agent may still run"))
        }
        other => failed("claiming the node")(other.to_string()),
    })?;
    let published = published_lease(external.entries);
    let identity_keys = identity_keys_in(&ovs, &dir).await?;
    // Without a key directory the node holds nothing of ours — unless
    // OVSDB says otherwise: then the directory is the wrong one (or was
    // lost), and leaving would strand a published lease and its guards.
    if !dir.exists() {
        if published.is_empty() && identity_keys.is_empty() {
            return Ok(Outcome::NothingToRelease(format!(
                "no key directory {} and OVSDB publishes no lease and no identity in it",
                dir.display()
            )));
        }
        return Err(CleanupError::NotSafe(format!(
            "KeyDirectoryMissing: the key directory {} does not exist, but OVSDB publishes {}: \
             is OVN_IPSEC_KEY_DIR the directory the agent used? Without its lease file the \
             lease's SAs and guards cannot be attributed",
            dir.display(),
            describe_published(&published, &identity_keys)
        )));
    }
    let owner = match OwnerLock::acquire(&dir) {
        Ok(o) => Some(Arc::new(o)),
        Err(e @ actors::Error::KeyDirLocked { .. }) => {
            return Err(CleanupError::NotSafe(format!(
                "{e}; the agent may still run"
            )));
        }
        // A directory the cleanup cannot write (a read-only mount) is
        // judged on its evidence: with none, there is nothing to release,
        // and crash-looping the init container would only hold the node's
        // CNI back. The node's claim above keeps this run alone.
        Err(actors::Error::KeyDirReadOnly { .. }) => None,
        Err(e) => return Err(failed("the key directory's owner lock")(e.to_string())),
    };
    tracing::info!(key_dir = %dir.display(), writable = owner.is_some(), "node claimed; key directory owner lock taken where writable");
    let held = read_held(&dir, published, identity_keys)?;
    if !held.has_state() && held.signer.is_none() {
        return Ok(Outcome::NothingToRelease(format!(
            "no lease, no identity paths in OVSDB, no evidence files{}",
            if owner.is_none() {
                format!(" (key directory {} is read-only)", dir.display())
            } else {
                String::new()
            }
        )));
    }
    if owner.is_none() {
        return Err(CleanupError::Failed(format!(
            "KeyDirReadOnly: the key directory {} holds this node's IPsec state but cannot be \
             written, and cleanup must remove its lease and evidence files: mount it writable \
             (on hosts with a read-only /etc, a hostPath under /var)",
            dir.display()
        )));
    }
    if held.lease.is_none() && !held.published.is_empty() {
        return Err(CleanupError::NotSafe(format!(
            "OVSDB publishes lease keys {:?} but the key directory has no lease file: \
             the lease's SAs and guards cannot be attributed",
            held.published.keys().collect::<Vec<_>>()
        )));
    }
    let client = crate::k8s_client::client(args.node.kubeconfig.as_deref())
        .await
        .map_err(failed("Kubernetes client"))?;
    let mut keeper = GuardKeeper::new(open_xfrm(args.node.xfrm_netns.as_deref())?);
    let mut lease = held.lease.clone();
    let mut record = None;
    // Set when releasing unasked: the live Node UID the receipt names.
    let mut unasked: Option<String> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait);
    let mut last_wait = String::new();
    // The guards protect marked traffic, and ovn-controller marks tunnels
    // only while OVSDB publishes the lease. A run cut short after it
    // withdrew the lease must not re-arm them when it is restarted: they
    // guard nothing then, and a release receipt it may already have
    // published says they are gone.
    let guarded = !held.published.is_empty();
    let record_name = format!(
        "{}/{}",
        args.node.coordination_namespace(),
        k8s::COORDINATION_CONFIGMAP
    );
    loop {
        let view = read_record(&client, &args.node).await?;
        let node_uid = read_node_uid(&client, &args.node.node_name).await?;
        let interfaces = read_interfaces(&ovs).await?;
        let ike_alive = ike_alive(&args.node);
        let local = Local {
            node_name: &args.node.node_name,
            pod_uid: &args.node.pod_uid,
            template_hash: args.node.pod_template_hash.as_deref(),
            lease: lease.as_ref(),
            csr: held.signer.as_ref().and_then(|s| s.active.csr.as_ref()),
            holds_state: held.has_state(),
            record_name: &record_name,
        };
        let live = Live {
            record: &view,
            node_uid: &node_uid,
            interfaces: &interfaces,
            ike_alive,
        };
        let step = judge::judge(&local, &live);
        // Guards stay armed (a lost one re-added) while anything is checked
        // or about to be drained — but never for a node the judgement
        // leaves alone: adding protection it then walks away from is what
        // cleanup exists to prevent.
        if !matches!(step, Step::NotTarget(_))
            && guarded
            && let Some(l) = lease.as_mut()
        {
            keep_guards(&mut keeper, &dir, l)?;
        }
        match step {
            Step::Proceed => {
                if let RecordView::Present(r) = view {
                    record = Some(*r);
                }
                break;
            }
            Step::ReleaseUnasked(why) => {
                tracing::warn!(reason = %why, "releasing unasked");
                if let RecordView::Present(r) = view {
                    record = Some(*r);
                }
                unasked = Some(node_uid.clone());
                break;
            }
            Step::NotTarget(why) => return Ok(Outcome::NothingToRelease(why)),
            Step::Refuse(why) => return Err(CleanupError::NotSafe(why)),
            Step::Wait(why) => {
                if why != last_wait {
                    tracing::info!(reason = %why, "waiting");
                    last_wait = why.clone();
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(CleanupError::NotSafe(format!(
                        "still waiting after {}s: {why}",
                        args.wait
                    )));
                }
                if *shutdown.borrow() {
                    return Err(CleanupError::NotSafe(format!(
                        "stopped while waiting: {why}"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(args.poll_ms)).await;
            }
        }
    }
    let Some(record) = record else {
        return Err(CleanupError::Failed(
            "the record vanished after the checks".into(),
        ));
    };
    let (states, policies) = match &lease {
        Some(l) => {
            let tunnels = held
                .observations
                .as_ref()
                .filter(|o| o.lease_id == l.lease_id)
                .map(|o| o.tunnels.clone())
                .unwrap_or_default();
            drain(keeper.xfrm(), l, &tunnels)?
        }
        None => (0, 0),
    };
    seams.reach(Point::Drained);
    let guards = match &lease {
        Some(l) => withdraw(&ovs, &mut keeper, l, &seams).await?,
        None => 0,
    };
    seams.reach(Point::GuardsRemoved);
    clear_identity_paths(&ovs, &held.identity_keys).await?;
    seams.reach(Point::IdentityCleared);
    match (&held.signer, unasked) {
        (Some(signer), None) => {
            let node_uid = node_uid_of(&record, &args)?;
            publish_receipt(&client, &args.node, &node_uid, &record, signer).await?;
        }
        (None, None) => {
            return Err(CleanupError::NotSafe(
                "no identity to sign the release receipt with".into(),
            ));
        }
        // Nobody waits for it; it ends this Node's claim (its enable-side
        // receipt), so the next disable does not ask again.
        (Some(signer), Some(live_uid)) => {
            let node_uid = Uid::new(live_uid).map_err(|e| failed("the Node UID")(e.to_string()))?;
            publish_receipt(&client, &args.node, &node_uid, &record, signer).await?;
        }
        (None, Some(_)) => {
            tracing::info!("released unasked; no identity to sign a release receipt with");
        }
    }
    seams.reach(Point::ReceiptPublished);
    remove_evidence(&dir)?;
    tracing::info!(states, policies, guards, "released");
    Ok(Outcome::Released {
        states,
        policies,
        guards,
    })
}

/// Connects to the node's OVSDB and reads `external_ids`, waiting (within
/// `--wait`) for a server that is not up yet: whether this node holds
/// anything of ours is decided from OVSDB's evidence, and on a booting
/// node the init container may well start before ovsdb-server.
async fn wait_for_ovsdb(
    args: &CleanupArgs,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> Result<(ovsdb::Client, ovsdb::MapSnapshot), CleanupError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait);
    let mut logged = false;
    loop {
        let attempt = async {
            let ovs = ovsdb::Client::connect_str(&args.node.ovsdb).await?;
            let external = ovs.read_map(&MapColumn::ovs_external_ids()).await?;
            Ok::<_, ovsdb::Error>((ovs, external))
        }
        .await;
        let e = match attempt {
            Ok(ready) => return Ok(ready),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            return Err(CleanupError::NotSafe(format!(
                "OvsdbUnavailable: the node's OVSDB ({}) did not answer within {}s: {e}; \
                 nothing was read or touched",
                args.node.ovsdb, args.wait
            )));
        }
        if !logged {
            tracing::info!(ovsdb = %args.node.ovsdb, error = %e, "waiting for OVSDB");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(args.poll_ms)).await;
    }
}

fn node_uid_of(record: &CoordinationRecord, args: &CleanupArgs) -> Result<Uid, CleanupError> {
    record
        .targets
        .get(&args.node.node_name)
        .cloned()
        .ok_or_else(|| CleanupError::Failed("this node left the record's targets".into()))
}

/// The lease keys among `external_ids`.
fn published_lease(external: BTreeMap<String, String>) -> BTreeMap<String, String> {
    external
        .into_iter()
        .filter(|(k, _)| ovs::PROTECTION_KEYS.contains(&k.as_str()))
        .collect()
}

/// The identity keys in `other_config` that point into `dir`: only those
/// are ours to clear.
async fn identity_keys_in(
    ovs: &ovsdb::Client,
    dir: &Path,
) -> Result<BTreeMap<String, String>, CleanupError> {
    let other = ovs
        .read_map(&MapColumn::ovs_other_config())
        .await
        .map_err(|e| failed("reading other_config")(e.to_string()))?;
    Ok(other
        .entries
        .into_iter()
        .filter(|(k, v)| ovs::IDENTITY_KEYS.contains(&k.as_str()) && Path::new(v).starts_with(dir))
        .collect())
}

/// What OVSDB holds of ours, for a reason.
fn describe_published(
    published: &BTreeMap<String, String>,
    identity_keys: &BTreeMap<String, String>,
) -> String {
    let mut parts = Vec::new();
    if let Some(lease) = published.get(ovs::EXTERNAL_ID_PROTECTION_LEASE) {
        parts.push(format!("lease {lease}"));
    } else if !published.is_empty() {
        parts.push(format!(
            "lease keys {:?}",
            published.keys().collect::<Vec<_>>()
        ));
    }
    if !identity_keys.is_empty() {
        parts.push(format!(
            "identity paths {:?}",
            identity_keys.keys().collect::<Vec<_>>()
        ));
    }
    parts.join(" and ")
}

/// What the node holds, read from the key directory without changing it.
fn read_held(
    dir: &Path,
    published: BTreeMap<String, String>,
    identity_keys: BTreeMap<String, String>,
) -> Result<Held, CleanupError> {
    let lease = LeaseStore::new(dir)
        .read()
        .map_err(|e| CleanupError::NotSafe(format!("the lease file: {e}")))?;
    let observations =
        sa::load(dir).map_err(|e| CleanupError::NotSafe(format!("the SA observations: {e}")))?;
    if let (Some(l), Some(id)) = (&lease, published.get(ovs::EXTERNAL_ID_PROTECTION_LEASE))
        && *id != l.lease_id
    {
        return Err(CleanupError::NotSafe(format!(
            "OVSDB publishes lease {id}, the key directory holds lease {}: \
             a foreign owner; nothing withdrawn",
            l.lease_id
        )));
    }
    let signer = signer(dir)?;
    Ok(Held {
        lease,
        observations,
        published,
        identity_keys,
        signer,
    })
}

/// The active identity of the key directory, if it has a complete one.
fn signer(dir: &Path) -> Result<Option<Signer>, CleanupError> {
    // Read only: an unusable state file is reported, not moved aside.
    let active = match keydir::peek_state(dir)
        .map_err(|e| failed("reading the key directory's state")(e.to_string()))?
    {
        keydir::PeekedState::Present(state) => state.active,
        keydir::PeekedState::Missing => None,
        keydir::PeekedState::Unusable(why) => {
            tracing::warn!(reason = %why, "the key directory's state is unusable; left as it is");
            None
        }
    };
    let Some(active) = active else {
        return Ok(None);
    };
    let paths = keydir::identity_paths_in(dir, active.generation);
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| CleanupError::NotSafe(format!("{}: {e}", p.display())))
    };
    let certificate = Certificate::from_pem(&read(&paths.certificate)?)
        .map_err(|e| CleanupError::NotSafe(format!("the active certificate: {e}")))?;
    let trust = TrustBundle::from_pem(&read(&paths.ca_cert)?)
        .map_err(|e| CleanupError::NotSafe(format!("the active trust bundle: {e}")))?
        .digest();
    Ok(Some(Signer {
        active,
        key: paths.private_key,
        certificate,
        trust,
    }))
}

fn open_xfrm(netns: Option<&str>) -> Result<XfrmHandle, CleanupError> {
    match netns {
        Some(ns) => XfrmHandle::in_netns(ns),
        None => XfrmHandle::open(),
    }
    .map_err(|e| failed("opening NETLINK_XFRM")(e.to_string()))
}

/// Re-arms a lost guard and persists new indexes. The cleanup path runs
/// one task, so the kernel's microsecond round trips are made inline.
fn keep_guards(
    keeper: &mut GuardKeeper<XfrmHandle>,
    dir: &Path,
    lease: &mut Lease,
) -> Result<(), CleanupError> {
    let eval = keeper
        .evaluate(lease)
        .map_err(|e| failed("reading back the guards")(e.to_string()))?;
    for e in &eval.events {
        tracing::warn!(event = ?e, "guard");
    }
    if eval.lease_changed {
        LeaseStore::new(dir)
            .save(lease)
            .map_err(|e| failed("saving the lease")(e.to_string()))?;
    }
    if !eval.armed {
        return Err(CleanupError::NotSafe(format!(
            "the guards cannot be kept armed: {:?}",
            eval.guards
        )));
    }
    Ok(())
}

/// Deletes the lease's SAs and tunnel policies (not the guards) by their
/// full identity over the recorded `tunnels`, and reads back that they are
/// gone; refuses on any foreign owner of the lease's mark or reqid before
/// deleting anything. Returns how many SAs and policies it deleted.
pub fn drain<X: Xfrm>(
    xfrm: &mut X,
    lease: &Lease,
    tunnels: &[sa::TunnelEndpoints],
) -> Result<(usize, usize), CleanupError> {
    let dump = |x: &mut X| -> Result<sa::Drain, CleanupError> {
        let states = x
            .dump_states()
            .map_err(|e| failed("dumping SAs")(e.to_string()))?;
        let policies = x
            .dump_policies()
            .map_err(|e| failed("dumping policies")(e.to_string()))?;
        Ok(sa::plan_drain(lease, &states, &policies, tunnels))
    };
    let plan = dump(xfrm)?;
    if !plan.foreign.is_empty() {
        return Err(CleanupError::NotSafe(format!(
            "ForeignOwner: {} carrying the lease's mark {:#x} or reqid {} not attributable to \
             this node: {}",
            plan.foreign.len(),
            lease.mark,
            lease.reqid,
            plan.foreign.join("; ")
        )));
    }
    // Policies first: a trap policy left in place could make the kernel
    // create a new larval state for the SAs being deleted.
    for p in &plan.policies {
        xfrm.delete_policy(p)
            .map_err(|e| failed("deleting a policy")(e.to_string()))?;
    }
    for s in &plan.states {
        xfrm.delete_state(s)
            .map_err(|e| failed("deleting an SA")(e.to_string()))?;
    }
    let after = dump(xfrm)?;
    if !after.drained() || !after.foreign.is_empty() {
        return Err(CleanupError::NotSafe(format!(
            "DrainIncomplete: {} SA(s) and {} policy(ies) of the lease still present after \
             deletion{}",
            after.states.len(),
            after.policies.len(),
            if after.foreign.is_empty() {
                String::new()
            } else {
                format!("; new foreign owners: {}", after.foreign.join("; "))
            }
        )));
    }
    tracing::info!(
        states = plan.states.len(),
        policies = plan.policies.len(),
        "drained the lease's SAs and policies"
    );
    Ok((plan.states.len(), plan.policies.len()))
}

/// The lease's OVSDB keys first (ovn-controller then sets no mark on any
/// tunnel), then the guards, confirmed gone.
async fn withdraw(
    ovs: &ovsdb::Client,
    keeper: &mut GuardKeeper<XfrmHandle>,
    lease: &Lease,
    seams: &Seams,
) -> Result<usize, CleanupError> {
    crate::lease::unpublish(ovs)
        .await
        .map_err(|e| failed("withdrawing the lease from external_ids")(e.to_string()))?;
    seams.reach(Point::LeaseWithdrawn);
    let w = keeper
        .withdraw(lease)
        .map_err(|e| failed("removing the guards")(e.to_string()))?;
    if !w.refused.is_empty() {
        return Err(CleanupError::NotSafe(format!(
            "a policy at a guard's place differs from the guard (not ours): {:?}",
            w.refused
        )));
    }
    tracing::info!(removed = ?w.removed, "guards removed and confirmed gone");
    Ok(w.removed.len())
}

async fn clear_identity_paths(
    ovs: &ovsdb::Client,
    keys: &BTreeMap<String, String>,
) -> Result<(), CleanupError> {
    if keys.is_empty() {
        return Ok(());
    }
    let changes: MapChanges = keys.keys().map(|k| (k.clone(), None)).collect();
    MapWriter::new(ovs.clone())
        .update_map(&MapColumn::ovs_other_config(), &changes, 5)
        .await
        .map_err(|e| failed("clearing the identity paths")(e.to_string()))?;
    Ok(())
}

async fn publish_receipt(
    client: &Client,
    node: &NodeArgs,
    node_uid: &Uid,
    record: &CoordinationRecord,
    signer: &Signer,
) -> Result<(), CleanupError> {
    let bad = |what: &str, e: String| CleanupError::NotSafe(format!("{what}: {e}"));
    let csr = signer
        .active
        .csr
        .as_ref()
        .ok_or_else(|| bad("the release receipt", "no CSR binding".into()))?;
    let challenge = record
        .challenge
        .ok_or_else(|| bad("the record", "Release without a challenge".into()))?;
    let receipt = ReleaseReceipt {
        generation: record.generation,
        epoch: record.epoch,
        // A target answers `Release`; a node releasing unasked says what
        // it saw (`Release`, or `Disabled`).
        phase: record.phase,
        node_name: node.node_name.clone(),
        node_uid: node_uid.clone(),
        pod_uid: Uid::new(node.pod_uid.clone()).map_err(|e| bad("POD_UID", e.to_string()))?,
        csr_name: csr.name.clone(),
        csr_uid: Uid::new(csr.uid.clone()).map_err(|e| bad("the CSR UID", e.to_string()))?,
        template_hash: node.pod_template_hash.clone().unwrap_or_default(),
        trust_hash: signer.trust,
        observed: clock::timestamp(SystemClock.now())
            .map_err(|e| failed("the clock")(e.to_string()))?,
        challenge,
        status: ReleaseStatus {
            lease_withdrawn: true,
            guards_removed: true,
            identity_cleared: true,
            drained: true,
            boot_id: crate::fsutil::boot_id()
                .map_err(|e| failed("boot ID")(e.to_string()))?
                .parse()
                .map_err(|e: uuid::Error| failed("boot ID")(e.to_string()))?,
            certificate_digest: signer.certificate.digest(),
        },
        certificate: signer.certificate.to_pem(),
    };
    let annotation = sign_receipt(&receipt, &signer.key, &signer.certificate)
        .map_err(|e| CleanupError::NotSafe(e.to_string()))?;
    let nodes: Api<Node> = Api::all(client.clone());
    // A concurrent writer of the Node makes the conditional patch fail:
    // read again and retry a few times. Any failure counts as such a
    // conflict: `annotate_node` keeps only the text of the API's answer,
    // and a passing API hiccup deserves the same few tries.
    replace_on_conflict(
        5,
        |_| true,
        || publish_once(&nodes, &node.node_name, &annotation),
    )
    .await
    .map_err(|e| failed("publishing the release receipt")(e.into_inner().to_string()))?;
    tracing::info!(epoch = record.epoch, "release receipt published");
    Ok(())
}

/// One conditional write of the release receipt annotation; a failed one
/// pauses briefly, giving the concurrent writer time to finish.
async fn publish_once(nodes: &Api<Node>, node: &str, annotation: &str) -> actors::Result<()> {
    let published = annotate_node(nodes, node, k8s::ANNOTATION_RELEASE_RECEIPT, annotation).await;
    if published.is_err() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    published
}

/// The lease file and the SA observations go last: while they exist a
/// repeated run still knows it has something to release.
fn remove_evidence(dir: &Path) -> Result<(), CleanupError> {
    for name in [crate::lease::LEASE_FILE, sa::OBSERVATIONS_FILE] {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(failed("removing evidence")(format!(
                    "{}: {e}",
                    path.display()
                )));
            }
        }
    }
    Ok(())
}

async fn read_record(client: &Client, node: &NodeArgs) -> Result<RecordView, CleanupError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &node.coordination_namespace());
    crate::node::read_view(&api, k8s::COORDINATION_CONFIGMAP)
        .await
        .map_err(|e| failed("reading the coordination record")(e.to_string()))
}

async fn read_node_uid(client: &Client, name: &str) -> Result<String, CleanupError> {
    let api: Api<Node> = Api::all(client.clone());
    let node = api
        .get(name)
        .await
        .map_err(|e| failed("reading the Node")(e.to_string()))?;
    node.metadata
        .uid
        .ok_or_else(|| CleanupError::Failed(format!("Node {name} has no metadata.uid")))
}

async fn read_interfaces(ovs: &ovsdb::Client) -> Result<Vec<InterfaceOptions>, CleanupError> {
    use ovsdb::protocol::Operation;
    let ops = [Operation::Select {
        table: "Interface".into(),
        conditions: vec![],
        columns: Some(vec!["name".into(), "options".into()]),
    }];
    let results = ovs
        .transact("Open_vSwitch", &ops)
        .await
        .map_err(|e| failed("reading the interfaces")(e.to_string()))?;
    Ok(results
        .into_iter()
        .next()
        .and_then(|r| r.rows)
        .unwrap_or_default()
        .iter()
        .map(|row| InterfaceOptions {
            name: row
                .get("name")
                .and_then(|d| d.as_set())
                .and_then(|atoms| atoms.first().and_then(|a| a.as_str()).map(str::to_owned))
                .unwrap_or_default(),
            options: row
                .get("options")
                .and_then(|d| d.as_string_map())
                .unwrap_or_default(),
        })
        .collect())
}

/// Why the IKE daemon is not gone: a pidfile naming a live IKE process, or
/// a control socket that accepts a connection.
fn ike_alive(node: &NodeArgs) -> Option<String> {
    for p in node.ike_pidfiles() {
        let content = std::fs::read_to_string(&p).ok();
        if let crate::pidfile::Verdict::Live { pid, comm } =
            crate::pidfile::judge(content.as_deref(), crate::pidfile::proc_comm)
        {
            return Some(format!("{} names live {comm} (PID {pid})", p.display()));
        }
    }
    for name in ["charon.ctl", "charon.vici"] {
        let p = node.ike_rundir.join(name);
        if std::os::unix::net::UnixStream::connect(&p).is_ok() {
            return Some(format!("{} accepts connections", p.display()));
        }
    }
    None
}
