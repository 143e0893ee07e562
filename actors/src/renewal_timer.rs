//! The renewal-jitter timer: fires `RenewalEvent::Due` at the active leaf's
//! renewal point — a point in [40 %, 60 %] of its lifetime derived from a
//! hash of (Node UID, certificate) (`Certificate::renewal_time`), stable
//! across restarts and spread across nodes — and marks expiry.
//!
//! It only signals: the identity actor owns attempts and their retries, so
//! a failed renewal keeps the active identity and is retried with backoff
//! until it succeeds. Timers are `tokio::time` (pausable); the target point
//! is wall time from the injected clock, re-checked on a periodic tick so a
//! wall-clock jump cannot postpone a renewal indefinitely.

use std::sync::Arc;
use std::time::Duration;

use kube_ovn_ipsec_api::ident::Uid;
use kube_ovn_ipsec_api::time::Timestamp;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::bus::{ActiveIdentity, Bus, IdentityEvent, RenewalEvent};
use crate::metrics::Metrics;
use crate::status::{StatusBoard, timestamp};
use kube_ovn_ipsec_api::clock::Clock;

/// How often the timer re-checks wall time and updates the expiry gauge.
pub const TICK: Duration = Duration::from_secs(30);

/// Start-up arguments (cloned for every incarnation).
#[derive(Debug, Clone)]
pub struct RenewalTimerArgs {
    /// The Node UID the renewal point is derived with.
    pub node_uid: Uid,
    /// Wall clock.
    pub clock: Arc<dyn Clock>,
    /// Status (refreshed at expiry so the phase reads `Expired`).
    pub board: StatusBoard,
    /// Metrics (seconds to expiry).
    pub metrics: Arc<dyn Metrics>,
    /// Event ports.
    pub bus: Bus,
}

/// What the timer is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The active generation.
    pub generation: u64,
    /// Its renewal point.
    pub renew_at: Timestamp,
    /// Its expiry.
    pub expires: Timestamp,
    /// Whether `Due` has been published for it.
    pub fired: bool,
}

/// Messages of the renewal timer.
#[derive(Debug)]
pub enum RenewalTimerMsg {
    /// A newly active identity (from the identity actor).
    Identity(Box<ActiveIdentity>),
    /// Internal: re-check the schedule.
    Check,
    /// The current schedule.
    Schedule(RpcReplyPort<Option<Schedule>>),
}

/// The timer's state.
pub struct RenewalTimerState {
    args: RenewalTimerArgs,
    schedule: Option<Schedule>,
    timers: Vec<tokio::task::AbortHandle>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

/// The renewal timer actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenewalTimer;

fn until(clock: &dyn Clock, at: Timestamp) -> Duration {
    let now = timestamp(clock.now());
    Duration::from_secs(u64::try_from(at.secs_since(now)).unwrap_or(0))
}

impl RenewalTimerState {
    fn check(&mut self) {
        let Some(s) = &mut self.schedule else { return };
        let now = timestamp(self.args.clock.now());
        self.args
            .metrics
            .seconds_to_expiry(s.expires.secs_since(now) as f64);
        if !s.fired && now >= s.renew_at {
            s.fired = true;
            tracing::info!(generation = s.generation, "renewal point reached");
            self.args.bus.renewal.send(RenewalEvent::Due {
                generation: s.generation,
            });
        }
        if now >= s.expires {
            // Re-derives the phase against the clock: `Expired`.
            self.args.board.refresh();
        }
    }
}

fn abort(handles: &mut Vec<tokio::task::AbortHandle>) {
    for h in handles.drain(..) {
        h.abort();
    }
}

impl Actor for RenewalTimer {
    type Msg = RenewalTimerMsg;
    type State = RenewalTimerState;
    type Arguments = RenewalTimerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RenewalTimerMsg>,
        args: RenewalTimerArgs,
    ) -> Result<RenewalTimerState, ActorProcessingErr> {
        args.bus.identity.subscribe(myself.clone(), |e| match e {
            IdentityEvent::Active(a) => Some(RenewalTimerMsg::Identity(a)),
            _ => None,
        });
        // A (re)started timer knows nothing: ask for the active identity.
        args.bus.renewal.send(RenewalEvent::TimerStarted);
        let ticker = myself.send_interval(TICK, || RenewalTimerMsg::Check);
        Ok(RenewalTimerState {
            args,
            schedule: None,
            timers: Vec::new(),
            ticker: Some(ticker),
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<RenewalTimerMsg>,
        state: &mut RenewalTimerState,
    ) -> Result<(), ActorProcessingErr> {
        abort(&mut state.timers);
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<RenewalTimerMsg>,
        msg: RenewalTimerMsg,
        state: &mut RenewalTimerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RenewalTimerMsg::Identity(a) => {
                let renew_at = a.certificate.renewal_time(&state.args.node_uid);
                let expires = a.certificate.not_after();
                if let Some(s) = &mut state.schedule
                    && s.generation == a.generation
                    && s.renew_at == renew_at
                {
                    // The identity actor republishes its generation when it
                    // restarts. A `Due` sent while it was down, or one it
                    // was killed handling, died with it, and nothing else
                    // would send another: the identity would expire. So a
                    // republication past the point fires again (`Due` is
                    // ignored while an attempt is pending).
                    s.fired = false;
                    state.check();
                    return Ok(());
                }
                abort(&mut state.timers);
                state.schedule = Some(Schedule {
                    generation: a.generation,
                    renew_at,
                    expires,
                    fired: false,
                });
                tracing::info!(generation = a.generation, %renew_at, %expires, "renewal scheduled");
                let clock = state.args.clock.as_ref();
                for at in [renew_at, expires] {
                    // One second late rather than early: whole-second
                    // timestamps must compare as reached.
                    let d = until(clock, at) + Duration::from_secs(1);
                    let h = myself.send_after(d, || RenewalTimerMsg::Check);
                    state.timers.push(h.abort_handle());
                }
                state.check();
            }
            RenewalTimerMsg::Check => state.check(),
            RenewalTimerMsg::Schedule(reply) => {
                let _ = reply.send(state.schedule);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
