//! Kubernetes Events for what an operator must hear about even when nobody
//! reads the agent's logs: a key-directory state file that was unusable and
//! moved aside (SPEC §2: never deleted, a fresh identity requested), an XFRM
//! guard that had vanished and was re-added, and a foreign policy occupying
//! a guard's place (SPEC §4). Events are recorded on the Node, in namespace
//! `default` like the kubelet's node events.

use actors::bus::{Bus, IdentityEvent, ProtectionEvent};
use actors::datapath::DatapathEvent;
use actors::ports::GuardChange;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use kube_ovn_ipsec_api::datapath::PeerState;
use ractor::{Actor, ActorProcessingErr, ActorRef};

/// The component name on every Event this agent writes.
pub const COMPONENT: &str = "kube-ovn-ipsec";
/// Reason of the Event for a state file moved aside.
pub const REASON_STATE_MOVED_ASIDE: &str = "IPsecStateMovedAside";
/// Reason of the Event for a guard that had vanished and was re-added.
pub const REASON_GUARD_READDED: &str = "IPsecGuardReadded";
/// Reason of the Event for a foreign policy in a guard's place.
pub const REASON_GUARD_CONFLICT: &str = "IPsecGuardConflict";
/// Reason of the Event for OVSDB keys of the agent found changed and
/// written back.
pub const REASON_OVSDB_DRIFT: &str = "IPsecOvsdbDriftRestored";
/// Reason of the Event for a peer whose inbound encrypted traffic stopped.
pub const REASON_INBOUND_MISSING: &str = "IPsecInboundMissing";
/// Reason of the Event for marked traffic dropped by the guards.
pub const REASON_GUARD_DROP: &str = "IPsecGuardDrop";
/// Reason of the Event for a tunnel with intent and no SA.
pub const REASON_NO_SA: &str = "IPsecNoSA";
/// Reason of the Event for a tunnel MTU without room for ESP.
pub const REASON_MTU: &str = "IPsecMtuTooSmall";

/// Writes Events about one Node.
#[derive(Clone)]
pub struct NodeEvents {
    api: Api<Event>,
    node: ObjectReference,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEvents")
            .field("node", &self.node.name)
            .finish()
    }
}

impl NodeEvents {
    /// Events about Node `name` (UID `uid`).
    pub fn new(client: Client, name: &str, uid: &str) -> Self {
        NodeEvents {
            api: Api::namespaced(client, "default"),
            node: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..ObjectReference::default()
            },
        }
    }

    /// Records a Warning Event. Failing to record is logged, never fatal:
    /// the condition itself is already in `/status` and the logs.
    pub async fn warning(&self, reason: &str, message: &str) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", self.node.name.as_deref().unwrap_or("node"))),
                ..ObjectMeta::default()
            },
            involved_object: self.node.clone(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: self.node.name.clone(),
            }),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: self.node.name.clone(),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            action: Some("Recover".into()),
            ..Event::default()
        };
        if let Err(e) = self.api.create(&PostParams::default(), &event).await {
            tracing::warn!(error = %e, reason, "could not record a Kubernetes Event");
        }
    }
}

/// Subscribes to the bus and turns events into Kubernetes Events.
#[derive(Debug)]
pub struct EventForwarder;

/// Messages of [`EventForwarder`].
#[derive(Debug)]
pub enum ForwarderMsg {
    /// The key directory's state file was moved aside.
    StateMovedAside {
        /// Where it is now.
        moved_to: std::path::PathBuf,
        /// Why it was unusable.
        reason: String,
    },
    /// Something happened to a guard.
    Protection(ProtectionEvent),
    /// The data path needs an operator.
    Datapath(DatapathEvent),
}

/// Start-up arguments of [`EventForwarder`].
#[derive(Debug)]
pub struct ForwarderArgs {
    /// The bus to listen on.
    pub bus: Bus,
    /// Where Events go.
    pub events: NodeEvents,
}

/// At most one Event per reason per this interval: a guard that something
/// deletes every read-back would otherwise write an Event every 5 s (the
/// metric still counts every occurrence).
pub const EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);

/// Per-reason rate limit of Events: lets the first through, then one per
/// [`EVENT_INTERVAL`], counting what it held back so the next Event can say so.
#[derive(Debug, Default)]
pub struct Throttle {
    last: std::collections::HashMap<&'static str, (tokio::time::Instant, u32)>,
}

impl Throttle {
    /// `Some(held back since the last Event)` if an Event for `reason` may
    /// be written at `now`; `None` (and counted) if not.
    pub fn admit(&mut self, reason: &'static str, now: tokio::time::Instant) -> Option<u32> {
        match self.last.get_mut(reason) {
            Some((at, held)) if now.duration_since(*at) < EVENT_INTERVAL => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let before = *held;
                (*at, *held) = (now, 0);
                Some(before)
            }
            None => {
                self.last.insert(reason, (now, 0));
                Some(0)
            }
        }
    }
}

/// The forwarder's state.
#[derive(Debug)]
pub struct ForwarderState {
    events: NodeEvents,
    throttle: Throttle,
}

impl Actor for EventForwarder {
    type Msg = ForwarderMsg;
    type State = ForwarderState;
    type Arguments = ForwarderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ForwarderMsg>,
        args: ForwarderArgs,
    ) -> Result<ForwarderState, ActorProcessingErr> {
        args.bus.identity.subscribe(myself.clone(), |e| match e {
            IdentityEvent::StateMovedAside { moved_to, reason } => {
                Some(ForwarderMsg::StateMovedAside { moved_to, reason })
            }
            _ => None,
        });
        args.bus
            .protection
            .subscribe(myself.clone(), |e| Some(ForwarderMsg::Protection(e)));
        args.bus
            .datapath
            .subscribe(myself, |e| Some(ForwarderMsg::Datapath(e)));
        Ok(ForwarderState {
            events: args.events,
            throttle: Throttle::default(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<ForwarderMsg>,
        msg: ForwarderMsg,
        state: &mut ForwarderState,
    ) -> Result<(), ActorProcessingErr> {
        let events = &state.events;
        match msg {
            ForwarderMsg::StateMovedAside { moved_to, reason } => {
                let message = format!(
                    "the IPsec key directory's state file was unusable ({reason}); it was moved to {} (kept, not deleted) and a fresh identity is being requested",
                    moved_to.display()
                );
                events.warning(REASON_STATE_MOVED_ASIDE, &message).await;
            }
            ForwarderMsg::Protection(_) | ForwarderMsg::Datapath(_) => {
                let described = match &msg {
                    ForwarderMsg::Protection(e) => protection_message(e),
                    ForwarderMsg::Datapath(e) => datapath_message(e),
                    ForwarderMsg::StateMovedAside { .. } => None,
                };
                let Some((reason, message)) = described else {
                    return Ok(());
                };
                match state.throttle.admit(reason, tokio::time::Instant::now()) {
                    Some(0) => events.warning(reason, &message).await,
                    Some(held) => {
                        let message = format!(
                            "{message} ({held} more since the last such Event, not recorded separately)"
                        );
                        events.warning(reason, &message).await;
                    }
                    None => tracing::debug!(reason, "Event held back by the rate limit"),
                }
            }
        }
        Ok(())
    }
}

/// The Event reason and message for a protection event (no key material:
/// guards carry none).
fn protection_message(e: &ProtectionEvent) -> Option<(&'static str, String)> {
    match e {
        ProtectionEvent::GuardReadded(GuardChange::Readded {
            family,
            old_index,
            new_index,
        }) => Some((
            REASON_GUARD_READDED,
            format!(
                "the {family} XFRM guard (index {old_index}) had vanished from the kernel and was re-added (index {new_index}); something on this node removes XFRM policies it does not own"
            ),
        )),
        ProtectionEvent::GuardConflict(GuardChange::Conflict {
            family,
            index,
            detail,
        }) => Some((
            REASON_GUARD_CONFLICT,
            format!(
                "a policy this agent did not create (index {index}) occupies the {family} guard's place ({detail}); it was not overwritten and output protection is not armed"
            ),
        )),
        ProtectionEvent::OvsdbDriftRestored { what, keys } => Some((
            REASON_OVSDB_DRIFT,
            format!(
                "the agent's {what} keys in the Open_vSwitch table had been removed or changed ({}) and were written back; find what edits them (ovs-vsctl, a replaced conf.db)",
                keys.join(", ")
            ),
        )),
        _ => None,
    }
}

/// The Event reason and message for a data-path event: addresses,
/// counters and the reason's static hint (no key material exists there).
fn datapath_message(e: &DatapathEvent) -> Option<(&'static str, String)> {
    match e {
        DatapathEvent::PeerUnhealthy(p) => {
            let reason = match p.state {
                PeerState::InboundMissing => REASON_INBOUND_MISSING,
                PeerState::GuardDrop => REASON_GUARD_DROP,
                PeerState::NoSa => REASON_NO_SA,
                _ => return None,
            };
            Some((
                reason,
                format!(
                    "IPsec to {} (chassis {}) is {} since {}: outbound {} packets, inbound {} packets; {}",
                    p.peer,
                    p.chassis.as_ref().map_or("?", |c| c.as_str()),
                    p.state,
                    p.since,
                    p.outbound.packets,
                    p.inbound.packets,
                    p.message().unwrap_or("")
                ),
            ))
        }
        DatapathEvent::MtuTooSmall(m) => Some((REASON_MTU, m.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_admits_one_event_per_reason_per_interval() {
        let mut t = Throttle::default();
        let t0 = tokio::time::Instant::now();
        assert_eq!(t.admit(REASON_GUARD_READDED, t0), Some(0));
        assert_eq!(t.admit(REASON_GUARD_CONFLICT, t0), Some(0), "per reason");
        for i in 1..=3 {
            let at = t0 + std::time::Duration::from_secs(5 * i);
            assert_eq!(t.admit(REASON_GUARD_READDED, at), None);
        }
        assert_eq!(t.admit(REASON_GUARD_READDED, t0 + EVENT_INTERVAL), Some(3));
        let later = t0 + EVENT_INTERVAL + std::time::Duration::from_secs(1);
        assert_eq!(t.admit(REASON_GUARD_READDED, later), None);
    }

    #[test]
    fn datapath_events_name_the_peer_the_cause_and_the_numbers() {
        use kube_ovn_ipsec_api::datapath::{Encapsulation, MtuReport, PeerHealth, SaCounters};
        let p = PeerHealth {
            outbound: SaCounters {
                sas: 1,
                bytes: 100,
                packets: 40,
            },
            inbound: SaCounters {
                sas: 1,
                bytes: 10,
                packets: 3,
            },
            ..kube_ovn_ipsec_api::test_util::peer_health(PeerState::InboundMissing, false)
        };
        let (reason, message) =
            datapath_message(&DatapathEvent::PeerUnhealthy(Box::new(p.clone()))).unwrap();
        assert_eq!(reason, REASON_INBOUND_MISSING);
        for want in [
            "192.0.2.2",
            "node-2",
            "outbound 40 packets",
            "inbound 3",
            "UDP 4500",
        ] {
            assert!(message.contains(want), "{want} in {message}");
        }
        let healthy = PeerHealth {
            state: PeerState::Healthy,
            ..p
        };
        assert!(datapath_message(&DatapathEvent::PeerUnhealthy(Box::new(healthy))).is_none());
        let mtu = MtuReport::check(1500, 1442, Encapsulation::Geneve, false, false);
        let (reason, message) = datapath_message(&DatapathEvent::MtuTooSmall(mtu)).unwrap();
        assert_eq!(reason, REASON_MTU);
        assert!(message.contains("1408"), "{message}");
    }

    #[test]
    fn guard_events_have_reasons_and_other_changes_none() {
        let readded = ProtectionEvent::GuardReadded(GuardChange::Readded {
            family: "ipv6".into(),
            old_index: 8,
            new_index: 17,
        });
        let (reason, message) = protection_message(&readded).unwrap();
        assert_eq!(reason, REASON_GUARD_READDED);
        assert!(
            message.contains("ipv6") && message.contains("17"),
            "{message}"
        );
        let conflict = ProtectionEvent::GuardConflict(GuardChange::Conflict {
            family: "ipv4".into(),
            index: 99,
            detail: "action allow".into(),
        });
        assert_eq!(
            protection_message(&conflict).unwrap().0,
            REASON_GUARD_CONFLICT
        );
        let mismatched = ProtectionEvent::GuardReadded(GuardChange::Armed {
            family: "ipv4".into(),
            index: 1,
        });
        assert!(protection_message(&mismatched).is_none());
    }
}
