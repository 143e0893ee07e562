//! Kubernetes Events for what an operator must hear about even when nobody
//! reads the agent's logs: today, a key-directory state file that was
//! unusable and moved aside (SPEC §2: never deleted, a fresh identity
//! requested). Events are recorded on the Node, in namespace `default` like
//! the kubelet's node events.

use actors::bus::{Bus, IdentityEvent};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use ractor::{Actor, ActorProcessingErr, ActorRef};

/// The component name on every Event this agent writes.
pub const COMPONENT: &str = "kube-ovn-ipsec";
/// Reason of the Event for a state file moved aside.
pub const REASON_STATE_MOVED_ASIDE: &str = "IPsecStateMovedAside";

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
}

/// Start-up arguments of [`EventForwarder`].
#[derive(Debug)]
pub struct ForwarderArgs {
    /// The bus to listen on.
    pub bus: Bus,
    /// Where Events go.
    pub events: NodeEvents,
}

impl Actor for EventForwarder {
    type Msg = ForwarderMsg;
    type State = NodeEvents;
    type Arguments = ForwarderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ForwarderMsg>,
        args: ForwarderArgs,
    ) -> Result<NodeEvents, ActorProcessingErr> {
        args.bus.identity.subscribe(myself, |e| match e {
            IdentityEvent::StateMovedAside { moved_to, reason } => {
                Some(ForwarderMsg::StateMovedAside { moved_to, reason })
            }
            _ => None,
        });
        Ok(args.events)
    }

    async fn handle(
        &self,
        _: ActorRef<ForwarderMsg>,
        msg: ForwarderMsg,
        events: &mut NodeEvents,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ForwarderMsg::StateMovedAside { moved_to, reason } => {
                let message = format!(
                    "the IPsec key directory's state file was unusable ({reason}); it was moved to {} (kept, not deleted) and a fresh identity is being requested",
                    moved_to.display()
                );
                events.warning(REASON_STATE_MOVED_ASIDE, &message).await;
            }
        }
        Ok(())
    }
}
