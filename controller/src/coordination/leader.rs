//! Leader election on the `coordination.k8s.io` Lease `ovn-ipsec-controller`
//! (SPEC §7): only the holder writes the coordination record.
//!
//! The usual client-go rules, every write with the read's resourceVersion as
//! precondition so two replicas can never both believe they won the same
//! round: no Lease → create it holding it; held by us → renew; held by
//! another whose `renewTime + leaseDurationSeconds` has passed on our clock
//! → take it over (`leaseTransitions + 1`); otherwise follow. A conflict
//! (409) means someone else wrote first: follow this round. The leader
//! stops acting as leader as soon as a renewal fails, before its lease
//! could have expired for the others (`renew_deadline` < duration).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use kube_ovn_ipsec_api::clock::Clock;

use crate::error::Result;

/// The Lease's name.
pub const LEASE_NAME: &str = "ovn-ipsec-controller";

/// One replica's view of the election.
pub struct Elector {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
    clock: Arc<dyn Clock>,
}

/// What one round came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// This replica holds the Lease until at least the next round.
    Leader,
    /// Another replica (named, if known) holds it.
    Follower(Option<String>),
}

fn micro(t: std::time::SystemTime) -> MicroTime {
    // A clock before 1970 or past 9999 cannot be a real clock's reading.
    MicroTime(k8s_openapi::jiff::Timestamp::try_from(t).unwrap_or_default())
}

impl Elector {
    /// An elector for `identity` (the Pod name) in `namespace`.
    pub fn new(
        client: Client,
        namespace: &str,
        identity: String,
        duration: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            identity,
            duration,
            clock,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = micro(self.clock.now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: acquire, renew or follow.
    pub async fn round(&self) -> Result<Role> {
        let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    tracing::info!(identity = %self.identity, "acquired the coordination lease");
                    Ok(Role::Leader)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Role::Follower(None)),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        let expired = {
            let renewed = spec
                .renew_time
                .as_ref()
                .map(|t| std::time::SystemTime::from(t.0));
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            match renewed {
                None => true,
                Some(r) => r + duration <= self.clock.now(),
            }
        };
        if !mine && holder.is_some() && !expired {
            return Ok(Role::Follower(holder));
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        lease.spec = Some(self.spec(transitions, acquired));
        // The read's resourceVersion stays in `metadata`: a concurrent
        // writer makes this a 409, not a second leader.
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !mine {
                    tracing::info!(identity = %self.identity, previous = ?holder, "took over the coordination lease");
                }
                Ok(Role::Leader)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Role::Follower(holder)),
            Err(e) => Err(e.into()),
        }
    }
}
