//! The leader's loop: every period, one election round; the leader
//! observes the cluster, asks [`decide`] for one step and performs it.
//!
//! Reads are direct (no cache) so a pass never acts on a lagging view of
//! the record or of the evidence. The record is written with the read's
//! resourceVersion as precondition; a conflict drops the pass (someone else
//! wrote: observe again). A record that does not decode is never
//! overwritten: the pass holds and says why, in the log and as a Warning
//! Event on the ConfigMap, once per change of what is stored under
//! [`STATE_KEY`] ([`UNDECODABLE_REASON`]). The cohort's status (phase,
//! epoch, why it waits, per node) goes into the same ConfigMap under key
//! `status`, written only when it changes; each node's refusal is also an
//! Event on its Node, once per change of reason.
//!
//! An operator asks for a re-created Node's retirement through the same
//! ConfigMap (annotation [`RETIRE_ANNOTATION`], [`request_retirement`]);
//! the write that carries a retirement out removes its request, in the
//! same resourceVersion-guarded replace.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use kube_ovn_ipsec_api::clock::{Clock, timestamp};
use kube_ovn_ipsec_api::conflict::replace_on_conflict;
use kube_ovn_ipsec_api::coordination::{
    Challenge, CoordinationPhase, CoordinationRecord, NodeReceipt,
};
use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::names::k8s;
use kube_ovn_ipsec_api::pki::TrustBundle;
use kube_ovn_ipsec_api::signed::Unverified;
use serde::Serialize;

use ovsdb::{Datum, OVN_NORTHBOUND, OVN_SOUTHBOUND};
use uuid::Uuid;

use super::evidence::{self, Answer, CleanupPodFacts, CsrFacts, InitState, NodeFacts, PodFacts};
use super::leader::{Elector, Role};
use super::machine::{
    Decision, LiveDaemonSet, Observation, Verdict, decide, node_status, retirements_done,
};
use crate::error::{self, Error, Result};
use crate::{ca, live, names};

/// ConfigMap holding the record (key [`STATE_KEY`]) and the status.
pub const CONFIGMAP: &str = k8s::COORDINATION_CONFIGMAP;
/// Key of the record.
pub const STATE_KEY: &str = k8s::COORDINATION_CONFIGMAP_KEY;
/// Key of the cohort's status (JSON, [`CohortStatus`]).
pub const STATUS_KEY: &str = k8s::COORDINATION_STATUS_KEY;
/// Node annotation carrying the node's receipt.
pub const RECEIPT_ANNOTATION: &str = k8s::ANNOTATION_RECEIPT;
/// Node annotation carrying the node's release receipt.
pub const RELEASE_RECEIPT_ANNOTATION: &str = k8s::ANNOTATION_RELEASE_RECEIPT;
/// Annotation on the coordination ConfigMap holding the operator's
/// retirement requests (see [`k8s::ANNOTATION_RETIRE`]).
pub const RETIRE_ANNOTATION: &str = k8s::ANNOTATION_RETIRE;
/// Reason of the Warning Event on the coordination ConfigMap when its
/// record does not decode.
pub const UNDECODABLE_REASON: &str = "CoordinationRecordUndecodable";

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The controller's namespace (record, Lease, trust).
    pub namespace: String,
    /// The CNI namespace.
    pub cni_namespace: String,
    /// The kube-ovn-cni DaemonSet's name.
    pub daemon_set: String,
    /// `--enable-ipsec`.
    pub want_enabled: bool,
    /// OVN northbound database (`tcp:…`, `ssl:…`, `unix:…`).
    pub ovn_nb: String,
    /// OVN southbound database.
    pub ovn_sb: String,
    /// The key, certificate and CA files for `ssl:` remotes.
    pub ovn_tls: Option<ovsdb::TlsFiles>,
    /// Pass period.
    pub period: Duration,
    /// Lease duration.
    pub lease_duration: Duration,
    /// This replica's identity (its Pod name).
    pub identity: String,
    /// `source.component` of its Events.
    pub component: String,
}

/// What the coordinator reports, under [`STATUS_KEY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CohortStatus {
    /// The leader that wrote it.
    pub leader: String,
    /// The record's phase.
    pub phase: CoordinationPhase,
    /// The record's generation.
    pub generation: u64,
    /// The record's epoch.
    pub epoch: u64,
    /// What the last pass decided, in words.
    pub reason: String,
    /// Per node (targets, scheduled nodes waiting to join, retirement
    /// requests): `ok`, or why it waits.
    pub nodes: BTreeMap<String, String>,
}

/// The stored record and the ConfigMap it came from.
struct Stored {
    record: CoordinationRecord,
    map: Option<ConfigMap>,
}

/// What a read of the coordination ConfigMap found.
enum Read {
    /// A record (the initial one when there is no ConfigMap).
    Record(Box<Stored>),
    /// A ConfigMap whose record does not decode.
    Undecodable(Undecodable),
}

/// A stored record that does not decode.
struct Undecodable {
    /// Why, for the log, the Event and `status`.
    why: String,
    /// SHA-256 over what is stored under [`STATE_KEY`] (a missing key is
    /// a distinct value): the Event is raised once per change of it.
    digest: String,
    /// The ConfigMap's UID, for the Event.
    uid: Option<String>,
}

/// The record in `map`, or why it does not decode.
fn decode_record(map: &ConfigMap) -> std::result::Result<CoordinationRecord, Undecodable> {
    let uid = map.metadata.uid.clone();
    let Some(state) = map.data.as_ref().and_then(|d| d.get(STATE_KEY)) else {
        return Err(Undecodable {
            why: format!("the ConfigMap has no {STATE_KEY} key"),
            digest: format!("no {STATE_KEY} key"),
            uid,
        });
    };
    CoordinationRecord::decode(state.as_bytes()).map_err(|e| Undecodable {
        why: format!("the record under key {STATE_KEY} does not decode: {e}"),
        digest: kube_ovn_ipsec_api::digest::Sha256Digest::of(state.as_bytes()).to_hex(),
        uid,
    })
}

/// The loop's state between passes.
struct Coordinator {
    client: Client,
    config: CoordinatorConfig,
    clock: Arc<dyn Clock>,
    nb: Option<ovsdb::Client>,
    sb: Option<ovsdb::Client>,
    /// Per node, the refusal last reported as an Event.
    reported: HashMap<String, &'static str>,
    /// The digest of the undecodable record last reported as an Event
    /// ([`Undecodable::digest`]); cleared once a record decodes, so the
    /// same fault coming back is reported again.
    reported_undecodable: Option<String>,
}

/// A fresh challenge from the system's CSPRNG (a failure to read it is a
/// refusal to start a disable this pass, never a predictable challenge).
fn random_challenge() -> Result<Challenge> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| Error::Config("the system random source failed".into()))?;
    Ok(Challenge::from_bytes(bytes))
}

/// Runs the coordinator until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: CoordinatorConfig,
    clock: Arc<dyn Clock>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let elector = Elector::new(
        client.clone(),
        &config.namespace,
        config.identity.clone(),
        config.lease_duration,
        clock.clone(),
    );
    let mut c = Coordinator {
        client,
        config,
        clock,
        nb: None,
        sb: None,
        reported: HashMap::new(),
        reported_undecodable: None,
    };
    tokio::pin!(shutdown);
    loop {
        match elector.round().await {
            Ok(Role::Leader) => {
                if let Err(e) = c.pass().await {
                    tracing::warn!(error = %e, "coordination pass failed; retrying next period");
                }
            }
            Ok(Role::Follower(holder)) => {
                tracing::debug!(?holder, "following the coordination leader");
            }
            Err(e) => tracing::warn!(error = %e, "coordination lease round failed"),
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(c.config.period) => {}
        }
    }
}

impl Coordinator {
    async fn read_record(&self) -> Result<Read> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let Some(map) = maps.get_opt(CONFIGMAP).await? else {
            return Ok(Read::Record(Box::new(Stored {
                record: CoordinationRecord::initial(),
                map: None,
            })));
        };
        Ok(match decode_record(&map) {
            Ok(record) => Read::Record(Box::new(Stored {
                record,
                map: Some(map),
            })),
            Err(u) => Read::Undecodable(u),
        })
    }

    /// Holds on a record that does not decode: an error line and a
    /// Warning Event on the ConfigMap the first time this content is seen,
    /// a debug line on every later pass over it.
    async fn report_undecodable(&mut self, u: Undecodable) {
        if self.reported_undecodable.as_ref() == Some(&u.digest) {
            tracing::debug!(why = %u.why, "the coordination record still does not decode; holding");
            return;
        }
        // Never overwrite what cannot be read: it may be a newer
        // controller's record, or an operator's edit to look at.
        tracing::error!(why = %u.why, digest = %u.digest, "the coordination record does not decode; holding");
        let namespace = self.config.namespace.as_str();
        let on = crate::events::Involved {
            api_version: "v1",
            kind: "ConfigMap",
            name: CONFIGMAP,
            namespace: Some(namespace),
            uid: u.uid.as_deref(),
        };
        let message = format!(
            "{}; the coordinator holds (no phase moves, the record is never overwritten) \
             until {namespace}/{CONFIGMAP} holds a record it can read",
            u.why
        );
        crate::events::warning(
            &self.client,
            &self.config.component,
            on,
            UNDECODABLE_REASON,
            &message,
        )
        .await;
        self.reported_undecodable = Some(u.digest);
    }

    async fn ovn(&mut self, south: bool) -> Option<&ovsdb::Client> {
        let (slot, addr) = if south {
            (&mut self.sb, &self.config.ovn_sb)
        } else {
            (&mut self.nb, &self.config.ovn_nb)
        };
        if slot.is_none() {
            let config = ovsdb::Config {
                tls: self.config.ovn_tls.clone(),
                ..ovsdb::Config::default()
            };
            match ovsdb::Client::connect(ovsdb::Address::parse(addr), config).await {
                Ok(c) => *slot = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, database = %addr, "cannot reach the OVN database");
                    return None;
                }
            }
        }
        slot.as_ref()
    }

    /// A synchronous read of `NB_Global.ipsec` (or SB's) and of the row's
    /// `_uuid`, in one select so the disable records the UUID of the very
    /// row it read false in; a failed read drops the connection so the
    /// next pass reconnects.
    async fn read_switch(&mut self, south: bool) -> Option<(bool, Uuid)> {
        let client = self.ovn(south).await?;
        let (db, table) = if south {
            (OVN_SOUTHBOUND, "SB_Global")
        } else {
            (OVN_NORTHBOUND, "NB_Global")
        };
        match client.select_single(db, table, &["ipsec"]).await {
            Ok((uuid, row)) => {
                let value = row.get("ipsec").and_then(Datum::as_bool);
                if value.is_none() {
                    tracing::warn!(table, "the ipsec column is not a boolean");
                }
                value.map(|v| (v, uuid))
            }
            Err(e) => {
                tracing::warn!(error = %e, south, "reading the OVN ipsec switch failed");
                if south {
                    self.sb = None;
                } else {
                    self.nb = None;
                }
                None
            }
        }
    }

    async fn pass(&mut self) -> Result<()> {
        let stored = match self.read_record().await? {
            Read::Record(s) => {
                self.reported_undecodable = None;
                *s
            }
            Read::Undecodable(u) => {
                self.report_undecodable(u).await;
                return Ok(());
            }
        };
        let record = &stored.record;
        let now = timestamp(self.clock.now()).map_err(Error::Coordination)?;

        let (daemon_set, pods) = self.daemon_set().await?;
        let trust = ca::read_bundle(&self.client, &self.config.namespace)
            .await
            .ok();
        // One list of the Nodes per pass serves the cohort and every
        // receipt (their annotations and chassis).
        let nodes: BTreeMap<String, Node> = Api::<Node>::all(self.client.clone())
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .map(|n| (n.name_any(), n))
            .collect();
        let scheduled = scheduled(&pods, &nodes);
        let (retire, retire_error) = match retire_requests(stored.map.as_ref()) {
            Ok(r) => (r, None),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the retirement requests");
                (BTreeMap::new(), Some(e))
            }
        };
        let mut receipts = BTreeMap::new();
        let mut admissions = BTreeMap::new();
        if let Some(trust) = &trust {
            match record.phase {
                CoordinationPhase::Prepare | CoordinationPhase::Arm => {
                    for name in record.targets.keys() {
                        let v = self
                            .verdict(record, Answer::Barrier, trust, nodes.get(name), &pods, now)
                            .await?;
                        receipts.insert(name.clone(), v);
                    }
                }
                CoordinationPhase::Enabled => {
                    for (name, uid) in &scheduled {
                        if record.targets.contains_key(name) {
                            continue;
                        }
                        let answer = Answer::Admission { node: name, uid };
                        let v = self
                            .verdict(record, answer, trust, nodes.get(name), &pods, now)
                            .await?;
                        admissions.insert(name.clone(), v);
                    }
                }
                _ => {}
            }
        }
        let mut releases = BTreeMap::new();
        if let (Some(trust), CoordinationPhase::Release) = (&trust, record.phase) {
            for name in record.targets.keys() {
                let v = self
                    .release_verdict(record, trust, nodes.get(name), &pods, now)
                    .await?;
                releases.insert(name.clone(), v);
            }
        }
        // NB also in `Prepare`: whether it may already be true decides if a
        // joiner enters the barrier (docs/coordination.md). Both throughout
        // the disable, which confirms them off before and while it cleans
        // up.
        use CoordinationPhase::*;
        let nb = match record.phase {
            Disabled => None,
            _ => self.read_switch(false).await,
        };
        let sb = match record.phase {
            Arm | Enabled | Disabling | Cleanup | Release => self.read_switch(true).await,
            Disabled | Prepare => None,
        };
        // Only a disable's start and its `Cleanup` write take them in.
        let claimants = if self.config.want_enabled {
            BTreeMap::new()
        } else {
            claimants(record, &nodes)
        };
        let observation = Observation {
            want_enabled: self.config.want_enabled,
            daemon_set,
            trust: trust.as_ref().map(TrustBundle::digest),
            scheduled,
            nodes: nodes
                .iter()
                .filter_map(|(name, n)| {
                    let uid = Uid::new(n.metadata.uid.clone()?).ok()?;
                    Some((name.clone(), uid))
                })
                .collect(),
            receipts,
            admissions,
            retirements: retire,
            nb_ipsec: nb.map(|(v, _)| v),
            sb_ipsec: sb.map(|(v, _)| v),
            nb_global_uuid: nb.map(|(_, u)| u),
            sb_global_uuid: sb.map(|(_, u)| u),
            releases,
            claimants,
            fresh_challenge: random_challenge()?,
        };
        self.report_refusals(&observation).await;
        let decision = decide(record, &observation)?;
        let status = |reason: String, next: &CoordinationRecord| {
            let reason = match &retire_error {
                Some(e) => format!("{reason}; the {RETIRE_ANNOTATION} annotation is ignored: {e}"),
                None => reason,
            };
            CohortStatus {
                leader: self.config.identity.clone(),
                phase: next.phase,
                generation: next.generation,
                epoch: next.epoch,
                reason,
                nodes: node_status(record, next, &observation),
            }
        };
        match decision {
            Decision::Write { record: next, why } => {
                tracing::info!(from = %record.phase, to = %next.phase, epoch = next.epoch, %why, "coordination");
                let st = status(why, &next);
                let done = retirements_done(record, &next, &observation.retirements);
                self.store(&stored, Some(&next), &st, &done).await
            }
            Decision::SetNb(value) => {
                tracing::info!(value, "setting NB_Global.ipsec");
                let Some(nb) = self.ovn(false).await else {
                    return Ok(());
                };
                if let Err(e) = nb.set_nb_ipsec(value).await {
                    self.nb = None;
                    tracing::warn!(error = %e, "setting NB_Global.ipsec failed");
                }
                Ok(())
            }
            Decision::Hold { reason, .. } => {
                tracing::debug!(%reason, "coordination holds");
                let st = status(reason, record);
                self.store(&stored, None, &st, &[]).await
            }
            Decision::Idle => {
                let st = status("nothing to do".into(), record);
                self.store(&stored, None, &st, &[]).await
            }
        }
    }

    /// Writes the record (when `next`) and the status, if either changed,
    /// with the read's resourceVersion as precondition; removes the
    /// retirement requests of `retired` in the same write.
    async fn store(
        &self,
        stored: &Stored,
        next: Option<&CoordinationRecord>,
        status: &CohortStatus,
        retired: &[String],
    ) -> Result<()> {
        let status_json =
            serde_json::to_string(status).map_err(|e| Error::Config(e.to_string()))?;
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let Some(map) = &stored.map else {
            // No ConfigMap yet: only a record write creates it.
            let Some(next) = next else { return Ok(()) };
            let state = next.encode().map_err(Error::Coordination)?;
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CONFIGMAP.into()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([
                    (STATE_KEY.to_owned(), state),
                    (STATUS_KEY.to_owned(), status_json),
                ])),
                ..ConfigMap::default()
            };
            return match maps.create(&PostParams::default(), &cm).await {
                Ok(_) => Ok(()),
                Err(e) if error::is_conflict(&e) => Ok(()),
                Err(e) => Err(e.into()),
            };
        };
        let mut map = map.clone();
        let data = map.data.get_or_insert_with(BTreeMap::new);
        let mut changed = false;
        if let Some(next) = next {
            data.insert(
                STATE_KEY.into(),
                next.encode().map_err(Error::Coordination)?,
            );
            changed = true;
        }
        if data.get(STATUS_KEY) != Some(&status_json) {
            data.insert(STATUS_KEY.into(), status_json);
            changed = true;
        }
        if !retired.is_empty() {
            let mut requests = retire_requests(Some(&map)).unwrap_or_default();
            requests.retain(|name, _| !retired.contains(name));
            set_retire_requests(&mut map, &requests)?;
            changed = true;
        }
        if !changed {
            return Ok(());
        }
        match maps.replace(CONFIGMAP, &PostParams::default(), &map).await {
            Ok(_) => Ok(()),
            Err(e) if error::is_conflict(&e) => {
                tracing::info!("the coordination record changed under this pass; observing again");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The DaemonSet (with its current template hash) and its Pods.
    async fn daemon_set(&self) -> Result<(Option<LiveDaemonSet>, Vec<Pod>)> {
        let ns = &self.config.cni_namespace;
        let sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
        let Some(ds) = sets.get_opt(&self.config.daemon_set).await? else {
            return Ok((None, Vec::new()));
        };
        let Some(uid) = ds.metadata.uid.clone() else {
            return Ok((None, Vec::new()));
        };
        let lp = live::selected_by(&ds);
        let revisions = Api::<ControllerRevision>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await?;
        let pods = Api::<Pod>::namespaced(self.client.clone(), ns)
            .list(&lp)
            .await?;
        let owned: Vec<Pod> = pods
            .items
            .into_iter()
            .filter(|p| live::pod_view(p).owner_daemon_set_uid.as_deref() == Some(uid.as_str()))
            .collect();
        let live = live::current_template_hash(&ds, &revisions.items).and_then(|hash| {
            Some(LiveDaemonSet {
                uid: Uid::new(uid).ok()?,
                template_hash: hash,
                cleanup_shape: cleanup_shape(&ds),
            })
        });
        Ok((live, owned))
    }

    /// Judges `node`'s receipt against `record` as `answer` (a Node that is
    /// gone has none).
    async fn verdict(
        &self,
        record: &CoordinationRecord,
        answer: Answer<'_>,
        trust: &TrustBundle,
        node: Option<&Node>,
        pods: &[Pod],
        now: kube_ovn_ipsec_api::time::Timestamp,
    ) -> Result<Verdict> {
        let Some(node) = node else {
            return Ok(Verdict::Missing);
        };
        let facts = self
            .receipt_facts(node, pods, RECEIPT_ANNOTATION, evidence::peek, pod_facts)
            .await?;
        let f = match facts {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        Ok(evidence::judge(
            record,
            answer,
            trust,
            NodeFacts {
                name: &f.name,
                chassis: f.chassis.as_deref(),
            },
            f.unverified,
            f.csr.as_ref(),
            f.pod.as_ref(),
            now,
        ))
    }

    /// Judges `node`'s release receipt against the `Release` record (a
    /// Node that is gone has none): the CSR it names, and the Pod it names
    /// among the DaemonSet's with its cleanup init container's state.
    async fn release_verdict(
        &self,
        record: &CoordinationRecord,
        trust: &TrustBundle,
        node: Option<&Node>,
        pods: &[Pod],
        now: kube_ovn_ipsec_api::time::Timestamp,
    ) -> Result<Verdict> {
        let Some(node) = node else {
            return Ok(Verdict::Missing);
        };
        let facts = self
            .receipt_facts(
                node,
                pods,
                RELEASE_RECEIPT_ANNOTATION,
                evidence::peek_release,
                cleanup_pod_facts,
            )
            .await?;
        let f = match facts {
            Ok(f) => f,
            Err(v) => return Ok(v),
        };
        Ok(evidence::judge_release(
            record,
            trust,
            NodeFacts {
                name: &f.name,
                chassis: f.chassis.as_deref(),
            },
            f.unverified,
            f.csr.as_ref(),
            f.pod.as_ref(),
            now,
        ))
    }

    /// What judging `node`'s receipt of either kind (in annotation
    /// `annotation`, decoded by `peek`) needs from the cluster: the CSR it
    /// names and, among `pods`, the Pod it names (as `facts` sees it).
    /// `Ok(Err(verdict))` when the annotation is missing or undecodable.
    async fn receipt_facts<R: NodeReceipt, P>(
        &self,
        node: &Node,
        pods: &[Pod],
        annotation: &str,
        peek: fn(Option<&str>) -> std::result::Result<Unverified<R>, Verdict>,
        facts: fn(&Pod) -> P,
    ) -> Result<std::result::Result<ReceiptFacts<R, P>, Verdict>> {
        let annotations = node.annotations();
        let unverified = match peek(annotations.get(annotation).map(String::as_str)) {
            Ok(u) => u,
            Err(v) => return Ok(Err(v)),
        };
        let head = unverified.peek().head();
        let (csr_name, pod_uid) = (head.csr_name.to_owned(), head.pod_uid.clone());
        let csr = Api::<CertificateSigningRequest>::all(self.client.clone())
            .get_opt(&csr_name)
            .await?
            .map(|c| csr_facts(&c));
        let pod = pods
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(pod_uid.as_str()))
            .map(facts);
        let chassis = annotations.get(names::NODE_CHASSIS_ANNOTATION).cloned();
        Ok(Ok(ReceiptFacts {
            name: node.name_any(),
            chassis,
            unverified,
            csr,
            pod,
        }))
    }

    /// One Event per node per change of refusal reason (a target's
    /// barrier or release receipt, or a joiner's admission receipt). A
    /// cleanup init container that has not terminated yet is waited for,
    /// not refused: the receipt is published just before the container
    /// exits and the kubelet reports the exit a moment later, so a pass in
    /// between is the normal course of every node's cleanup (status shows
    /// it; a Warning would not be news).
    async fn report_refusals(&mut self, o: &Observation) {
        let verdicts = o.receipts.iter().chain(&o.admissions).chain(&o.releases);
        for (node, verdict) in verdicts {
            match verdict {
                Verdict::Refused { check, .. } if *check == evidence::INIT_NOT_TERMINATED => {
                    self.reported.remove(node);
                }
                Verdict::Refused { check, message } => {
                    if self.reported.get(node) == Some(check) {
                        continue;
                    }
                    self.reported.insert(node.clone(), check);
                    let on = crate::events::Involved {
                        api_version: "v1",
                        kind: "Node",
                        name: node,
                        namespace: None,
                        uid: o.scheduled.get(node).map(Uid::as_str),
                    };
                    crate::events::warning(
                        &self.client,
                        &self.config.component,
                        on,
                        check,
                        message,
                    )
                    .await;
                }
                _ => {
                    self.reported.remove(node);
                }
            }
        }
    }
}

/// The nodes the DaemonSet schedules to: its Pods' nodes that exist, with
/// their UIDs.
fn scheduled(pods: &[Pod], nodes: &BTreeMap<String, Node>) -> BTreeMap<String, Uid> {
    pods.iter()
        .filter_map(|pod| {
            let name = live::pod_view(pod).node_name;
            let uid = nodes.get(&name)?.metadata.uid.clone()?;
            Some((name, Uid::new(uid).ok()?))
        })
        .collect()
}

/// The Nodes that are not targets of `record` and whose annotations claim
/// this project's state ([`evidence::claims_state`]): name → live UID.
fn claimants(record: &CoordinationRecord, nodes: &BTreeMap<String, Node>) -> BTreeMap<String, Uid> {
    nodes
        .iter()
        .filter(|(name, _)| !record.targets.contains_key(*name))
        .filter_map(|(name, node)| {
            let uid = Uid::new(node.metadata.uid.clone()?).ok()?;
            let a = node.annotations();
            let get = |k: &str| a.get(k).map(String::as_str);
            evidence::claims_state(
                &uid,
                get(RECEIPT_ANNOTATION),
                get(RELEASE_RECEIPT_ANNOTATION),
            )
            .then(|| (name.clone(), uid))
        })
        .collect()
}

/// The retirement requests on the coordination ConfigMap (none without
/// the annotation); an annotation that does not parse is an error naming
/// why, and no request counts.
fn retire_requests(map: Option<&ConfigMap>) -> std::result::Result<BTreeMap<String, Uid>, String> {
    let Some(text) = map.and_then(|m| m.annotations().get(RETIRE_ANNOTATION)) else {
        return Ok(BTreeMap::new());
    };
    let raw: BTreeMap<String, String> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object of strings: {e}"))?;
    raw.into_iter()
        .map(|(name, uid)| {
            let uid = Uid::new(uid).map_err(|e| format!("{name}: {e}"))?;
            Ok((name, uid))
        })
        .collect()
}

/// Sets (or, when empty, removes) the retirement requests on `map`.
fn set_retire_requests(map: &mut ConfigMap, requests: &BTreeMap<String, Uid>) -> Result<()> {
    let annotations = map.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if requests.is_empty() {
        annotations.remove(RETIRE_ANNOTATION);
        return Ok(());
    }
    let raw: BTreeMap<&str, &str> = requests
        .iter()
        .map(|(n, u)| (n.as_str(), u.as_str()))
        .collect();
    let text = serde_json::to_string(&raw).map_err(|e| Error::Config(e.to_string()))?;
    annotations.insert(RETIRE_ANNOTATION.into(), text);
    Ok(())
}

/// Records the operator's request to retire target `node` frozen with UID
/// `uid` (`None`: withdraw the request for `node`) on the coordination
/// ConfigMap, for the leader to carry out or refuse (`status` says which).
/// Written with the read's resourceVersion, retried on a conflict with the
/// leader's own writes. Returns what to tell the operator.
pub async fn request_retirement(
    client: &Client,
    namespace: &str,
    node: &str,
    uid: Option<Uid>,
) -> Result<String> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    replace_on_conflict(5, Error::is_conflict, || {
        record_retirement(&maps, namespace, node, uid.as_ref())
    })
    .await
    .map_err(|e| {
        e.or_exhausted(|_| {
            Error::Config(format!(
                "{namespace}/{CONFIGMAP} kept changing under the request; try again"
            ))
        })
    })
}

/// One read-modify-replace of [`request_retirement`]: the request for
/// `node` set (or withdrawn) on the ConfigMap as read; what to tell the
/// operator.
async fn record_retirement(
    maps: &Api<ConfigMap>,
    namespace: &str,
    node: &str,
    uid: Option<&Uid>,
) -> Result<String> {
    let Some(mut map) = maps.get_opt(CONFIGMAP).await? else {
        return Err(Error::Config(format!(
            "no {namespace}/{CONFIGMAP}: IPsec was never enabled, there is no cohort to retire from"
        )));
    };
    let mut requests = retire_requests(Some(&map)).unwrap_or_default();
    let frozen = map
        .data
        .as_ref()
        .and_then(|d| d.get(STATE_KEY))
        .and_then(|s| CoordinationRecord::decode(s.as_bytes()).ok())
        .and_then(|r| r.targets.get(node).cloned());
    let told = match uid {
        None => {
            requests.remove(node);
            format!("withdrew the retirement request for {node}")
        }
        Some(uid) => {
            requests.insert(node.to_owned(), uid.clone());
            retirement_told(node, uid, frozen.as_ref())
        }
    };
    set_retire_requests(&mut map, &requests)?;
    maps.replace(CONFIGMAP, &PostParams::default(), &map)
        .await?;
    Ok(told)
}

/// What the operator is told of a request to retire `node` frozen with
/// `uid`, given the UID the cohort froze for it (`None`: not a target).
fn retirement_told(node: &str, uid: &Uid, frozen: Option<&Uid>) -> String {
    match frozen {
        Some(f) if f == uid => format!(
            "requested: retire {node} (UID {uid}); the leader carries it out on its next pass"
        ),
        Some(f) => format!(
            "requested, but the cohort froze {node} with UID {f}, not {uid}: \
             the leader will refuse it (see `status`)"
        ),
        None => format!(
            "requested, but {node} is not a target now: the leader will refuse it (see `status`)"
        ),
    }
}

fn csr_facts(csr: &CertificateSigningRequest) -> CsrFacts {
    let extra = csr.spec.extra.as_ref();
    CsrFacts {
        uid: csr.metadata.uid.clone().unwrap_or_default(),
        certificate_pem: csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .map(|c| c.0.clone())
            .filter(|c| !c.is_empty()),
        requester_pod_uid: extra.and_then(|e| e.get(k8s::EXTRA_POD_UID)).and_then(|v| {
            match v.as_slice() {
                [one] => Some(one.clone()),
                _ => None,
            }
        }),
        node_annotation: csr.annotations().get(k8s::ANNOTATION_NODE).cloned(),
    }
}

/// Whether `ds`'s Pod template is the chart's shape with IPsec disabled:
/// the `ipsec-cleanup` init container, and no `ipsec` container.
fn cleanup_shape(ds: &DaemonSet) -> bool {
    let Some(spec) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return false;
    };
    let cleanup = spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == k8s::INIT_CONTAINER_CLEANUP);
    let agent = spec
        .containers
        .iter()
        .any(|c| c.name == k8s::CONTAINER_IPSEC);
    cleanup && !agent
}

/// A Pod's facts with the state of its `ipsec-cleanup` init container.
fn cleanup_pod_facts(pod: &Pod) -> CleanupPodFacts {
    let state = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == k8s::INIT_CONTAINER_CLEANUP))
        .map(|c| init_state(c.state.as_ref()));
    CleanupPodFacts {
        pod: pod_facts(pod),
        cleanup_init: state,
    }
}

/// An init container's state as the release receipt's judgement needs it.
/// No state at all is a container not started yet.
fn init_state(state: Option<&k8s_openapi::api::core::v1::ContainerState>) -> InitState {
    let Some(state) = state else {
        return InitState::Waiting(String::new());
    };
    if let Some(t) = &state.terminated {
        let reason = [t.reason.as_deref(), t.message.as_deref()]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(": ");
        return InitState::Terminated {
            exit_code: t.exit_code,
            reason,
        };
    }
    if state.running.is_some() {
        return InitState::Running;
    }
    InitState::Waiting(
        state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.clone())
            .unwrap_or_default(),
    )
}

fn pod_facts(pod: &Pod) -> PodFacts {
    let v = live::pod_view(pod);
    PodFacts {
        uid: v.uid,
        node_name: v.node_name,
        owner_uid: v.owner_daemon_set_uid,
        template_hash: v.template_hash,
        live: !v.terminating && !v.finished,
    }
}

/// What a disable-side record holds besides the cohort: the step it is
/// at, the challenge (abbreviated: enough to match a receipt by eye), and
/// from `Cleanup` on what it recorded.
fn disable_line(r: &CoordinationRecord) -> String {
    let step = match r.phase {
        CoordinationPhase::Disabling => {
            "turning NB_Global.ipsec off, then waiting for NB and SB to read false and for \
             the DaemonSet's ipsec-cleanup init container"
        }
        CoordinationPhase::Cleanup => "NB and SB off, cleanup shape recorded",
        _ => "waiting for every target's release receipt",
    };
    let challenge = r
        .challenge
        .and_then(|c| c.to_string().get(..12).map(str::to_owned))
        .unwrap_or_default();
    let mut line = format!("disable: {step}; challenge {challenge}…");
    if let (Some(nb), Some(sb)) = (r.nb_global_uuid, r.sb_global_uuid) {
        line.push_str(&format!("  NB_Global {nb}  SB_Global {sb}"));
    }
    if r.phase != CoordinationPhase::Disabling
        && let (Some(uid), Some(hash)) = (&r.daemon_set_uid, &r.template_hash)
    {
        line.push_str(&format!("  DaemonSet {uid} template {hash}"));
    }
    line
}

/// What `kube-ovn-ipsec-controller status` prints, and what makes it
/// fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The text to print.
    pub text: String,
    /// Why the record cannot be read (no [`STATE_KEY`], or it does not
    /// decode): `status` prints the text, then exits non-zero with this.
    pub fault: Option<String>,
}

/// The cohort as `kube-ovn-ipsec-controller status` prints it: the record's
/// phase, generation and epoch, the last pass's reason and leader, one
/// line per node of the status (targets, joiners, refused retirements),
/// and the retirement requests not carried out yet. A record that cannot
/// be read is a [`Description::fault`]: the coordinator holds on it, so it
/// is not a state an operator may read as fine.
pub async fn describe(client: &Client, namespace: &str) -> Result<Description> {
    use std::fmt::Write as _;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Some(map) = maps.get_opt(CONFIGMAP).await? else {
        return Ok(Description {
            text: format!("no {namespace}/{CONFIGMAP}: IPsec was never enabled (phase Disabled)\n"),
            fault: None,
        });
    };
    let requests = retire_requests(Some(&map));
    let record = decode_record(&map);
    let data = map.data.unwrap_or_default();
    let mut out = String::new();
    let mut fault = None;
    match record {
        Ok(r) => {
            let _ = writeln!(
                out,
                "phase {}  generation {}  epoch {}  targets {}",
                r.phase,
                r.generation,
                r.epoch,
                r.targets.len()
            );
            if r.phase.is_disable_side() {
                let _ = writeln!(out, "{}", disable_line(&r));
            }
        }
        Err(u) => {
            let why = format!("{namespace}/{CONFIGMAP}: {}; the coordinator holds", u.why);
            let _ = writeln!(out, "{why}");
            fault = Some(why);
        }
    }
    let status: Option<serde_json::Value> = data
        .get(STATUS_KEY)
        .and_then(|s| serde_json::from_str(s).ok());
    if let Some(st) = status {
        let text = |k: &str| st[k].as_str().unwrap_or("").to_owned();
        let _ = writeln!(
            out,
            "leader {}  last pass: {}",
            text("leader"),
            text("reason")
        );
        if let Some(nodes) = st["nodes"].as_object() {
            for (name, why) in nodes {
                let _ = writeln!(out, "  {name}: {}", why.as_str().unwrap_or(""));
            }
        }
    }
    match requests {
        Ok(r) if r.is_empty() => {}
        Ok(r) => {
            for (name, uid) in r {
                let _ = writeln!(out, "retirement requested: {name} (UID {uid})");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "the {RETIRE_ANNOTATION} annotation is ignored: {e}");
        }
    }
    Ok(Description { text: out, fault })
}

/// A node's receipt as annotated, with the cluster's facts it is judged
/// against ([`Coordinator::receipt_facts`]).
struct ReceiptFacts<R, P> {
    name: String,
    chassis: Option<String>,
    unverified: Unverified<R>,
    csr: Option<CsrFacts>,
    pod: Option<P>,
}

#[cfg(test)]
mod tests;
