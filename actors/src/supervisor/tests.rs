use super::*;
use crate::clock::TokioClock;
use crate::metrics::NoopMetrics;
use kube_ovn_ipsec_api::status::Phase;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A child that fails `fail_after(incarnation)` after starting.
struct Flaky {
    starts: Arc<Mutex<Vec<Instant>>>,
    fail_after: Arc<dyn Fn(usize) -> Option<Duration> + Send + Sync>,
}

struct Fail;

impl Actor for Flaky {
    type Msg = Fail;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, myself: ActorRef<Fail>, _: ()) -> Result<(), ActorProcessingErr> {
        let n = {
            let mut s = self.starts.lock().unwrap();
            s.push(Instant::now());
            s.len() - 1
        };
        if let Some(d) = (self.fail_after)(n) {
            myself.send_after(d, || Fail);
        }
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<Fail>,
        _: Fail,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        Err("synthetic failure".into())
    }
}

fn board() -> StatusBoard {
    StatusBoard::new(Arc::new(TokioClock::starting_at(
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )))
}

async fn start_flaky(
    fail_after: impl Fn(usize) -> Option<Duration> + Send + Sync + 'static,
    board: StatusBoard,
) -> (ActorRef<SupervisorMsg>, Arc<Mutex<Vec<Instant>>>) {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let fail_after: Arc<dyn Fn(usize) -> Option<Duration> + Send + Sync> = Arc::new(fail_after);
    let s2 = starts.clone();
    let spec = ChildSpec::actor("flaky", Reason::IkeDaemonUnhealthy, move || {
        (
            Flaky {
                starts: s2.clone(),
                fail_after: fail_after.clone(),
            },
            (),
        )
    });
    let (sup, _) = start(SupervisorArgs {
        children: vec![spec],
        board,
        metrics: Arc::new(NoopMetrics),
        config: SupervisorConfig::default(),
    })
    .await
    .unwrap();
    (sup, starts)
}

/// Advances paused time in 100 ms steps until `n` starts are recorded, or
/// fails after `limit` of virtual time.
async fn wait_starts(
    starts: &Arc<Mutex<Vec<Instant>>>,
    n: usize,
    limit: Duration,
) -> Vec<Duration> {
    let deadline = Instant::now() + limit;
    loop {
        {
            let s = starts.lock().unwrap();
            if s.len() >= n {
                return s.windows(2).map(|w| w[1] - w[0]).collect();
            }
        }
        assert!(
            Instant::now() < deadline,
            "only {} starts",
            starts.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn rounded(d: &[Duration]) -> Vec<u64> {
    d.iter().map(|d| d.as_secs_f64().round() as u64).collect()
}

#[tokio::test(start_paused = true)]
async fn failing_child_respawns_on_backoff_schedule() {
    let (sup, starts) = start_flaky(|_| Some(Duration::ZERO), board()).await;
    let gaps = wait_starts(&starts, 8, Duration::from_secs(300)).await;
    assert_eq!(rounded(&gaps[..7]), vec![1, 2, 4, 8, 16, 30, 30]);
    let r = report(&sup).await.unwrap();
    assert!(r[0].restarts >= 7);
    assert_eq!(r[0].last_error.as_deref(), Some("synthetic failure"));
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn schedule_resets_after_sixty_seconds_healthy() {
    // Fails at once three times (1, 2, 4), then runs 61 s, then fails again:
    // the next delay is 1 s again, not 8 s.
    let (sup, starts) = start_flaky(
        |n| match n {
            0..=2 => Some(Duration::ZERO),
            3 => Some(Duration::from_secs(61)),
            _ => None,
        },
        board(),
    )
    .await;
    let gaps = wait_starts(&starts, 5, Duration::from_secs(300)).await;
    assert_eq!(rounded(&gaps), vec![1, 2, 4, 62]);
    sup.stop(None);
}

#[tokio::test(start_paused = true)]
async fn child_that_keeps_failing_degrades_status_until_healthy() {
    let b = board();
    b.set_active(
        1,
        kube_ovn_ipsec_api::digest::Sha256Digest::of(b"c"),
        crate::status::timestamp(SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000)),
    );
    let (sup, starts) = start_flaky(
        |n| if n < 4 { Some(Duration::ZERO) } else { None },
        b.clone(),
    )
    .await;
    wait_starts(&starts, 4, Duration::from_secs(60)).await;
    let s = b.snapshot();
    assert_eq!(s.phase, Phase::Degraded);
    assert_eq!(s.reason, Some(Reason::IkeDaemonUnhealthy));
    assert!(b.failing_children().contains_key("flaky"));
    // The fifth incarnation stays up; 60 s later the child is healthy.
    wait_starts(&starts, 5, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(b.snapshot().phase, Phase::Active);
    let r = report(&sup).await.unwrap();
    assert!(!r[0].failing && r[0].alive);
    assert_eq!(r[0].consecutive_failures, 0);
    sup.stop(None);
}
