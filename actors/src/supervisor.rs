//! The node supervisor: holds the per-concern actors and respawns any that
//! fails (ractor has no built-in restart).
//!
//! Each child is a [`ChildSpec`]: a name, the status reason it maps to when
//! it keeps failing, and a factory that spawns it linked to the supervisor.
//! A failed (or unexpectedly stopped) child is respawned after the
//! [`Backoff`] delay — 1 s, 2 s, 4 s … 30 s — and
//! its schedule starts over once it has run for 60 s. After
//! `degraded_after` consecutive failures the board shows `Degraded` with the
//! child's reason; the supervisor never gives up on a child. Which children
//! it holds is the wiring's choice (`tree`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kube_ovn_ipsec_api::status::Reason;
use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent,
};
use tokio::time::Instant;

use crate::gate::ProtectionGate;
use crate::metrics::Metrics;
use crate::status::StatusBoard;
use kube_ovn_ipsec_api::backoff::{Backoff, BackoffPolicy};

/// How long the supervisor waits for each child to stop when it is
/// stopped itself (a process actor's grace period fits in it).
pub const CHILD_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// What a factory returns: the spawned child's cell.
pub type SpawnFuture = Pin<Box<dyn Future<Output = Result<ActorCell, SpawnErr>> + Send>>;

/// Spawns one incarnation of a child, linked to the given supervisor cell.
pub type Factory = Arc<dyn Fn(ActorCell) -> SpawnFuture + Send + Sync>;

/// How to (re)spawn one child.
#[derive(Clone)]
pub struct ChildSpec {
    /// Name, for status, logs and metrics.
    pub name: String,
    /// The status reason shown while this child keeps failing.
    pub reason: Reason,
    factory: Factory,
    /// Started (and restarted) only while this gate is open: while it is
    /// closed the child waits for it without counting failures, so a
    /// long wait (a cluster still in `Prepare`) neither degrades the node
    /// nor leaves the child at the end of its backoff when the gate opens.
    gate: Option<ProtectionGate>,
}

impl fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("name", &self.name)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl ChildSpec {
    /// A child spawned by `factory`, which must link the child to the cell
    /// it is given (`Actor::spawn_linked`).
    pub fn new(
        name: impl Into<String>,
        reason: Reason,
        factory: impl Fn(ActorCell) -> SpawnFuture + Send + Sync + 'static,
    ) -> Self {
        ChildSpec {
            name: name.into(),
            reason,
            factory: Arc::new(factory),
            gate: None,
        }
    }

    /// This child starts only once `gate` is open (and waits again,
    /// without a failure, whenever it finds it closed on a restart).
    pub fn after_gate(mut self, gate: ProtectionGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// A child of actor type `A`, built afresh by `make` for each
    /// incarnation (so arguments can be cloned from the wiring's config).
    pub fn actor<A, F>(name: impl Into<String>, reason: Reason, make: F) -> Self
    where
        A: Actor,
        F: Fn() -> (A, A::Arguments) + Send + Sync + 'static,
    {
        ChildSpec::new(name, reason, move |supervisor| {
            let (actor, args) = make();
            Box::pin(async move {
                A::spawn_linked(None, actor, args, supervisor)
                    .await
                    .map(|(r, _)| r.get_cell())
            })
        })
    }
}

/// Supervisor tuning.
#[derive(Debug, Clone, Copy)]
pub struct SupervisorConfig {
    /// Restart schedule.
    pub policy: BackoffPolicy,
    /// Consecutive failures after which the child counts as failing.
    pub degraded_after: u32,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            policy: BackoffPolicy::default(),
            degraded_after: 3,
        }
    }
}

/// Start-up arguments of the supervisor.
#[derive(Debug)]
pub struct SupervisorArgs {
    /// The children, started in order.
    pub children: Vec<ChildSpec>,
    /// Where failing children are shown.
    pub board: StatusBoard,
    /// Restart counter.
    pub metrics: Arc<dyn Metrics>,
    /// Tuning.
    pub config: SupervisorConfig,
}

/// One child as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildReport {
    /// Name.
    pub name: String,
    /// Whether an incarnation is running.
    pub alive: bool,
    /// Respawns so far.
    pub restarts: u64,
    /// Failures since the schedule last reset.
    pub consecutive_failures: u32,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// Whether it counts as failing (status `Degraded`).
    pub failing: bool,
}

/// Messages of the supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Internal: a backoff delay elapsed; spawn the child again.
    Respawn {
        /// The child.
        child: String,
    },
    /// Internal: the gate a waiting child starts after has opened.
    GateOpened {
        /// The child.
        child: String,
    },
    /// Internal: the child's incarnation has run for `reset_after`.
    Healthy {
        /// The child.
        child: String,
        /// Which incarnation the check was scheduled for.
        incarnation: u64,
    },
    /// The current cell of a child (typed refs change on respawn).
    Child(String, RpcReplyPort<Option<ActorCell>>),
    /// All children.
    Report(RpcReplyPort<Vec<ChildReport>>),
}

struct Child {
    spec: ChildSpec,
    cell: Option<ActorCell>,
    started: Instant,
    incarnation: u64,
    backoff: Backoff,
    restarts: u64,
    last_error: Option<String>,
    failing: bool,
    /// A task waits for the child's gate to open.
    waiting: bool,
}

/// The supervisor's state.
pub struct SupervisorState {
    children: Vec<Child>,
    board: StatusBoard,
    metrics: Arc<dyn Metrics>,
    config: SupervisorConfig,
}

impl SupervisorState {
    fn index_of_cell(&self, cell: &ActorCell) -> Option<usize> {
        let id = cell.get_id();
        self.children
            .iter()
            .position(|c| c.cell.as_ref().is_some_and(|x| x.get_id() == id))
    }

    fn index_of_name(&self, name: &str) -> Option<usize> {
        self.children.iter().position(|c| c.spec.name == name)
    }
}

/// The node supervisor.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeSupervisor;

async fn spawn_child(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, i: usize) {
    let c = &mut state.children[i];
    if let Some(gate) = c.spec.gate.clone()
        && !gate.is_open()
    {
        if !c.waiting {
            c.waiting = true;
            let (me, child) = (myself.clone(), c.spec.name.clone());
            tracing::info!(child, "supervised actor waits for the protection gate");
            tokio::spawn(async move {
                gate.opened().await;
                let _ = me.cast(SupervisorMsg::GateOpened { child });
            });
        }
        return;
    }
    let factory = state.children[i].spec.factory.clone();
    let result = factory(myself.get_cell()).await;
    let policy = state.config.policy;
    match result {
        Ok(cell) => {
            let c = &mut state.children[i];
            c.cell = Some(cell);
            c.started = Instant::now();
            c.incarnation += 1;
            let (child, incarnation) = (c.spec.name.clone(), c.incarnation);
            tracing::info!(child, incarnation, "supervised actor started");
            myself.send_after(policy.reset_after, move || SupervisorMsg::Healthy {
                child,
                incarnation,
            });
        }
        Err(e) => {
            // A factory that cannot even start the child is a failure like
            // any other: back off and try again, never give up.
            child_failed(myself, state, i, describe_spawn_err(&e));
        }
    }
}

/// A start failure as an operator reads it. ractor words every error a
/// child's `pre_start` returns as "Actor panicked during startup", which
/// sends people looking for a crash where there is an ordinary error (an
/// OVSDB server not answering, a refused lease): say what it is.
fn describe_spawn_err(e: &SpawnErr) -> String {
    match e {
        SpawnErr::StartupFailed(inner) => format!("could not start: {inner}"),
        other => other.to_string(),
    }
}

fn child_failed(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    i: usize,
    err: String,
) {
    let degraded_after = state.config.degraded_after;
    let c = &mut state.children[i];
    c.cell = None;
    let uptime = Instant::now().duration_since(c.started);
    let delay = c.backoff.failed_after(uptime);
    let failures = c.backoff.failures();
    tracing::warn!(
        child = c.spec.name,
        error = %err,
        failures,
        delay_secs = delay.as_secs_f64(),
        "supervised actor failed; respawning after backoff"
    );
    c.last_error = Some(err);
    if failures >= degraded_after && !c.failing {
        c.failing = true;
        state.board.set_child_failing(&c.spec.name, c.spec.reason);
    }
    let child = c.spec.name.clone();
    myself.send_after(delay, move || SupervisorMsg::Respawn { child });
}

impl Actor for NodeSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = SupervisorState {
            children: args
                .children
                .into_iter()
                .map(|spec| Child {
                    spec,
                    cell: None,
                    started: Instant::now(),
                    incarnation: 0,
                    backoff: args.config.policy.start(),
                    restarts: 0,
                    last_error: None,
                    failing: false,
                    waiting: false,
                })
                .collect(),
            board: args.board,
            metrics: args.metrics,
            config: args.config,
        };
        for i in 0..state.children.len() {
            spawn_child(&myself, &mut state, i).await;
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Stop the children explicitly, last started first, and wait for
        // each: their `post_stop` stops the processes they own (SIGTERM,
        // then SIGKILL), which must happen before the agent exits.
        for c in state.children.iter().rev() {
            if let Some(cell) = &c.cell
                && let Err(e) = cell
                    .stop_and_wait(Some("supervisor stopped".into()), Some(CHILD_STOP_TIMEOUT))
                    .await
            {
                tracing::warn!(child = c.spec.name, error = %e, "child did not stop in time");
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: SupervisorMsg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Respawn { child } => {
                if let Some(i) = state.index_of_name(&child)
                    && state.children[i].cell.is_none()
                {
                    state.children[i].restarts += 1;
                    state.metrics.actor_restart(&child);
                    spawn_child(&myself, state, i).await;
                }
            }
            SupervisorMsg::GateOpened { child } => {
                if let Some(i) = state.index_of_name(&child) {
                    state.children[i].waiting = false;
                    if state.children[i].cell.is_none() {
                        spawn_child(&myself, state, i).await;
                    }
                }
            }
            SupervisorMsg::Healthy { child, incarnation } => {
                if let Some(i) = state.index_of_name(&child) {
                    let c = &mut state.children[i];
                    if c.incarnation == incarnation && c.cell.is_some() {
                        c.backoff.reset();
                        if c.failing {
                            c.failing = false;
                            state.board.clear_child_failing(&child);
                            tracing::info!(child, "supervised actor healthy again");
                        }
                    }
                }
            }
            SupervisorMsg::Child(name, reply) => {
                let cell = state
                    .index_of_name(&name)
                    .and_then(|i| state.children[i].cell.clone());
                let _ = reply.send(cell);
            }
            SupervisorMsg::Report(reply) => {
                let report = state
                    .children
                    .iter()
                    .map(|c| ChildReport {
                        name: c.spec.name.clone(),
                        alive: c.cell.is_some(),
                        restarts: c.restarts,
                        consecutive_failures: c.backoff.failures(),
                        last_error: c.last_error.clone(),
                        failing: c.failing,
                    })
                    .collect();
                let _ = reply.send(report);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, err) = match evt {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                format!("stopped unexpectedly: {}", reason.unwrap_or_default()),
            ),
            _ => return Ok(()),
        };
        if let Some(i) = state.index_of_cell(&cell) {
            child_failed(&myself, state, i, err);
        }
        Ok(())
    }
}

/// Children by name: the current cell of each, for the `runtime` crate's wiring.
pub async fn child_cell(
    supervisor: &ActorRef<SupervisorMsg>,
    name: &str,
) -> Result<Option<ActorCell>, crate::Error> {
    let name = name.to_owned();
    ractor::call_t!(supervisor, SupervisorMsg::Child, 1_000, name)
        .map_err(|e| crate::Error::Messaging(e.to_string()))
}

/// The supervisor's view of its children.
pub async fn report(
    supervisor: &ActorRef<SupervisorMsg>,
) -> Result<Vec<ChildReport>, crate::Error> {
    ractor::call_t!(supervisor, SupervisorMsg::Report, 1_000)
        .map_err(|e| crate::Error::Messaging(e.to_string()))
}

/// Spawns the supervisor with its children; the `runtime` crate keeps the
/// handle and stops it on shutdown.
pub async fn start(
    args: SupervisorArgs,
) -> Result<(ActorRef<SupervisorMsg>, ractor::concurrency::JoinHandle<()>), crate::Error> {
    Actor::spawn(None, NodeSupervisor, args)
        .await
        .map_err(|e| crate::Error::Spawn {
            actor: "supervisor".into(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests;
