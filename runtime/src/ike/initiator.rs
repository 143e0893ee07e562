//! Which outbound connections the agent initiates itself.
//!
//! # Why the agent initiates
//! Every tunnel of a node carries the node's one lease reqid (SPEC §4).
//! strongSwan 5.9 answers a kernel ACQUIRE by the *first* trap with the
//! acquire's reqid, and ignores further ACQUIREs of a reqid while one is
//! pending; with two or more peers, traffic to the second peer makes
//! charon initiate (or find established) the first peer's connection, and
//! the second peer's outbound CHILD_SA is never negotiated: its traffic
//! stays behind the guards, a silent blackhole (seen in the lab with three
//! nodes, one pair dark for 300 s). Traffic can only trigger what the trap
//! manager picks, so the agent initiates each tunnel's outbound connection
//! by name (`ipsec stroke up-nb <tunnel>-out-<version>`) when it stays
//! without a CHILD_SA.
//!
//! # When
//! From the IKE daemon's status (the health probe's `ipsec statusall`): an
//! outbound connection is *stalled* when it is routed (its trap is
//! installed) and no CHILD_SA of that name exists in any other state, and
//! no IKE_SA of that name is being set up. A connection stalled at two
//! probes at least [`Initiator::GRACE`] apart is initiated: the grace lets
//! an ACQUIRE that picked the right trap finish first, so the common case
//! (one peer) negotiates once.
//!
//! While it stays stalled it is initiated again after 2 s, 4 s, 8 s, …, at
//! most every 60 s: the first attempt of an enable flip usually meets a
//! peer whose monitor has not loaded the tunnel yet (`NO_PROPOSAL_CHOSEN`),
//! and that peer is typically ready seconds later, so the first retries
//! come quickly (a 10 s first retry made the enable window three times a
//! negotiation in the lab). A stalled connection whose tunnel gained an
//! ESTABLISHED IKE_SA since its last attempt (the peer initiated it) is
//! initiated at once: the CHILD_SA is one exchange in that IKE_SA. For the
//! first [`Initiator::FAST_LOOK`] of a stall the caller probes every
//! [`Initiator::GRACE`], so a failed attempt or the peer's IKE_SA is seen
//! within a second rather than at the next regular probe; after that the
//! retries set the pace. charon retries a started initiation itself
//! (`keyingtries=%forever`) and shows it as a connecting IKE_SA, which is
//! never doubled. Pure: the caller passes the time and runs the commands.

use std::collections::BTreeMap;
use std::time::Duration;

use kube_ovn_ipsec_api::strongswan::Status;
use kube_ovn_ipsec_api::strongswan::{ConnDirection, MonitorConn};
use tokio::time::Instant;

/// A connection name as ovs-monitor-ipsec writes it split into its tunnel
/// (the OVS interface) and whether it is the outbound connection.
fn split_conn(conn: &str) -> Option<(&str, bool)> {
    MonitorConn::parse(conn).map(|c| (c.tunnel, c.direction == ConnDirection::Out))
}

/// Whether `conn` is the outbound connection of a tunnel as ovs-monitor-ipsec
/// names it: `<interface>-out-<version>`.
pub fn is_outbound_conn(conn: &str) -> bool {
    split_conn(conn).is_some_and(|(_, outbound)| outbound)
}

/// The tunnel a connection of ovs-monitor-ipsec belongs to (the name
/// itself when it is not one of the monitor's).
fn tunnel_of(conn: &str) -> &str {
    split_conn(conn).map_or(conn, |(tunnel, _)| tunnel)
}

/// The outbound connections `status` shows stalled: routed, with no
/// CHILD_SA of that name in another state, no outbound CHILD_SA of the
/// same tunnel up under another version (the patched monitor keeps the
/// established one while it replaces a tunnel, and keeps it for good when
/// charon refuses the new one as a duplicate of an identical
/// configuration), and no IKE_SA of the same tunnel being set up
/// (charon's stroke backend merges a tunnel's `-in-` and `-out-`
/// connections of one version into one peer configuration, so the IKE_SA
/// that will carry this CHILD_SA may show the other name).
/// Sorted, each once.
pub fn stalled_outbound(status: &Status) -> Vec<String> {
    let mut out: Vec<String> = status
        .child_sas
        .iter()
        .filter(|c| c.state == "ROUTED" && is_outbound_conn(&c.conn))
        .map(|c| c.conn.clone())
        .filter(|conn| {
            !status.child_sas.iter().any(|c| {
                c.state != "ROUTED"
                    && (&c.conn == conn || split_conn(&c.conn) == Some((tunnel_of(conn), true)))
            }) && !status
                .ike_sas
                .iter()
                .any(|s| tunnel_of(&s.conn) == tunnel_of(conn) && s.state == "CONNECTING")
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What the initiator knows of one stalled connection.
#[derive(Debug, Clone, Copy)]
struct Stalled {
    since: Instant,
    last_attempt: Option<Instant>,
    attempts: u32,
    /// Whether its tunnel had an ESTABLISHED IKE_SA at the last attempt.
    ike_up_at_attempt: bool,
}

/// Tracks stalled outbound connections across probes and says which to
/// initiate now.
#[derive(Debug, Default)]
pub struct Initiator {
    stalled: BTreeMap<String, Stalled>,
    /// When the last status was seen and whether it showed an IKE_SA of a
    /// tunnel being set up (an attempt whose outcome is due).
    last_seen: Option<(Instant, bool)>,
}

impl Initiator {
    /// How long a connection stays stalled before the agent initiates it,
    /// and the probe cadence while a stall is young.
    pub const GRACE: Duration = Duration::from_secs(1);
    /// The first wait before initiating a still-stalled connection again;
    /// doubled per attempt up to [`Initiator::MAX_RETRY`].
    pub const FIRST_RETRY: Duration = Duration::from_secs(2);
    /// The longest wait between two initiations of one connection.
    pub const MAX_RETRY: Duration = Duration::from_secs(60);
    /// How long after a stall starts (or while an IKE_SA is being set up)
    /// the caller probes every [`Initiator::GRACE`].
    pub const FAST_LOOK: Duration = Duration::from_secs(30);

    /// A fresh initiator (no connection seen yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one status, seen at `now`, and returns the connections to
    /// initiate now. Connections no longer stalled are forgotten.
    pub fn plan(&mut self, status: &Status, now: Instant) -> Vec<String> {
        let stalled = stalled_outbound(status);
        let connecting = status
            .ike_sas
            .iter()
            .any(|s| s.state == "CONNECTING" && MonitorConn::parse(&s.conn).is_some());
        self.last_seen = Some((now, connecting));
        // An attempt in flight (its tunnel's IKE_SA connecting) keeps its
        // history, so a failed attempt is retried on the backoff rather
        // than as a fresh stall.
        self.stalled.retain(|conn, _| {
            stalled.contains(conn)
                || status
                    .ike_sas
                    .iter()
                    .any(|s| s.state == "CONNECTING" && tunnel_of(&s.conn) == tunnel_of(conn))
        });
        let mut due = Vec::new();
        for conn in stalled {
            let ike_up = status
                .ike_sas
                .iter()
                .any(|s| s.state == "ESTABLISHED" && tunnel_of(&s.conn) == tunnel_of(&conn));
            let entry = self.stalled.entry(conn.clone()).or_insert(Stalled {
                since: now,
                last_attempt: None,
                attempts: 0,
                ike_up_at_attempt: false,
            });
            let ready = match entry.last_attempt {
                None => now.duration_since(entry.since) >= Self::GRACE,
                Some(last) => {
                    (ike_up && !entry.ike_up_at_attempt)
                        || now.duration_since(last) >= Self::retry_after(entry.attempts)
                }
            };
            if ready {
                entry.last_attempt = Some(now);
                entry.attempts += 1;
                entry.ike_up_at_attempt = ike_up;
                due.push(conn);
            }
        }
        due
    }

    /// When the caller should look again (probe early), measured from the
    /// last status: every [`Initiator::GRACE`] while a stall is younger
    /// than [`Initiator::FAST_LOOK`] or an IKE_SA is being set up; else at
    /// the earliest retry due; `None` when nothing is stalled.
    pub fn look_again_within(&self) -> Option<Duration> {
        let (seen, connecting) = self.last_seen?;
        let young = self
            .stalled
            .values()
            .any(|s| seen.duration_since(s.since) < Self::FAST_LOOK);
        if young || (connecting && !self.stalled.is_empty()) {
            return Some(Self::GRACE);
        }
        self.stalled
            .values()
            .filter_map(|s| {
                let last = s.last_attempt?;
                Some((last + Self::retry_after(s.attempts)).saturating_duration_since(seen))
            })
            .min()
            .map(|d| d.max(Self::GRACE))
    }

    /// The wait after `attempts` initiations.
    fn retry_after(attempts: u32) -> Duration {
        kube_ovn_ipsec_api::backoff::BackoffPolicy {
            initial: Self::FIRST_RETRY,
            max: Self::MAX_RETRY,
            reset_after: Duration::MAX,
        }
        .delay_after(attempts.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests;
