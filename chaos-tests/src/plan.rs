//! What to inject: the points of an activation a fault lands at, the
//! victims, and the matrix a seed draws (pure).

use kube_ovn_ipsec_api::test_util::SplitMix64;

/// A point of the activation path, as seen at the adapters' boundary
/// (each is a moment just before or after one port call; docs/chaos.md
/// maps them to the flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    /// The new key is persisted with its pending record; the CSR is about
    /// to be created (before `CsrApi::submit`).
    KeyPersisted,
    /// The CSR object exists (after `CsrApi::submit`).
    CsrCreated,
    /// The issued certificate came back (after `CsrApi::wait` returned it).
    CertificateReceived,
    /// The certificate was verified against the key and the trust bundle;
    /// nothing is written to OVSDB yet (before `OvsdbIdentity::activate`).
    Verified,
    /// The OVSDB transaction is in flight: the kill races the write.
    OvsdbSent,
    /// The OVSDB transaction committed (after `OvsdbIdentity::activate`).
    OvsdbCommitted,
    /// The monitor's read-back of what it loaded (after
    /// `RunningMonitor::acknowledge`).
    MonitorReadBack,
    /// The guards were armed and read back (after
    /// `ProtectionPort::evaluate_guards`).
    GuardArmed,
}

impl Point {
    /// Every point, in flow order.
    pub const ALL: [Point; 8] = [
        Point::KeyPersisted,
        Point::CsrCreated,
        Point::CertificateReceived,
        Point::Verified,
        Point::OvsdbSent,
        Point::OvsdbCommitted,
        Point::MonitorReadBack,
        Point::GuardArmed,
    ];

    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Point::KeyPersisted => "key persisted",
            Point::CsrCreated => "CSR created",
            Point::CertificateReceived => "certificate received",
            Point::Verified => "verified",
            Point::OvsdbSent => "OVSDB sent",
            Point::OvsdbCommitted => "OVSDB committed",
            Point::MonitorReadBack => "monitor read-back",
            Point::GuardArmed => "guard armed",
        }
    }

    /// Whether the point lies inside an activation (a new generation is
    /// on its way): recovery then means that generation active.
    pub fn activating(self) -> bool {
        !matches!(self, Point::GuardArmed | Point::MonitorReadBack)
    }
}

/// What is killed when the point is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Victim {
    /// One actor of the tree, by its supervisor name
    /// (`actors::tree::names`).
    Actor(&'static str),
    /// The node's ovsdb-server, SIGKILLed and started again on the same
    /// database a second later.
    OvsdbServer,
}

impl Victim {
    /// The actors of an agent that follows the cluster's coordination, in
    /// the tree's order (without coordination there is no node
    /// coordinator).
    pub const ACTORS: [Victim; 8] = [
        Victim::Actor(actors::tree::names::OVSDB_WRITER),
        Victim::Actor(actors::tree::names::RENEWAL_TIMER),
        Victim::Actor(actors::tree::names::IDENTITY),
        Victim::Actor(actors::tree::names::PROTECTION),
        Victim::Actor(actors::tree::names::IKE),
        Victim::Actor(actors::tree::names::MONITOR),
        Victim::Actor(actors::tree::names::DATAPATH),
        Victim::Actor(actors::tree::names::COORDINATOR),
    ];

    /// Every victim: the actors, then the processes.
    pub const ALL: [Victim; 9] = [
        Victim::ACTORS[0],
        Victim::ACTORS[1],
        Victim::ACTORS[2],
        Victim::ACTORS[3],
        Victim::ACTORS[4],
        Victim::ACTORS[5],
        Victim::ACTORS[6],
        Victim::ACTORS[7],
        Victim::OvsdbServer,
    ];

    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Victim::Actor(name) => name,
            Victim::OvsdbServer => "ovsdb-server",
        }
    }
}

/// What a whole agent process's fault kills at the point, the agent
/// stopped there (`kube-ovn-ipsec-chaos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProcessVictim {
    /// The agent and everything it started, SIGKILLed at once (a node
    /// crash, an OOM kill of the container); a new agent is started.
    Agent,
    /// The IKE daemon (charon), SIGKILLed; the agent is continued.
    IkeDaemon,
    /// ovs-monitor-ipsec, SIGKILLed; the agent is continued.
    Monitor,
}

impl ProcessVictim {
    /// Every process victim.
    pub const ALL: [ProcessVictim; 3] = [
        ProcessVictim::Agent,
        ProcessVictim::IkeDaemon,
        ProcessVictim::Monitor,
    ];
}

/// A victim's name in the report.
pub trait Named: Copy + Eq {
    /// The name.
    fn name(self) -> &'static str;
}

impl Named for Victim {
    fn name(self) -> &'static str {
        Victim::name(self)
    }
}

impl Named for ProcessVictim {
    fn name(self) -> &'static str {
        match self {
            ProcessVictim::Agent => "agent (SIGKILL)",
            ProcessVictim::IkeDaemon => "charon",
            ProcessVictim::Monitor => "ovs-monitor-ipsec",
        }
    }
}

/// One injected fault, replayable from its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault<V = Victim> {
    /// Its place in the run.
    pub index: usize,
    /// Where it lands.
    pub point: Point,
    /// What it kills.
    pub victim: V,
    /// The seed that drew it (the run's seed and the index).
    pub seed: u64,
}

/// The faults of one run: every (point, victim) pair once per round, in an
/// order drawn from `seed`, for `rounds` rounds. A victim is never killed
/// twice in a row, so that one actor's backoff schedule (1, 2, 4 … 30 s,
/// reset after 60 s healthy) does not pace the whole run; the schedule
/// itself is still exercised by the rounds.
pub fn matrix<V: Named>(seed: u64, rounds: usize, victims: &[V]) -> Vec<Fault<V>> {
    let mut rng = SplitMix64(seed);
    let mut out: Vec<Fault<V>> = Vec::new();
    for _ in 0..rounds {
        let mut round: Vec<(Point, V)> = Point::ALL
            .iter()
            .flat_map(|p| victims.iter().map(move |v| (*p, *v)))
            .collect();
        // Fisher–Yates with the seeded RNG.
        for i in (1..round.len()).rev() {
            let j = rng.below(i + 1);
            round.swap(i, j);
        }
        // Order the round so that no two neighbours share a victim: each
        // step takes, of the victims other than the previous one, the one
        // with the most faults left (so none is left to bunch up at the
        // end), its first fault in the shuffled order.
        let mut prev = out.last().map(|f| f.victim);
        let mut ordered = Vec::with_capacity(round.len());
        while !round.is_empty() {
            let left = |v: V| round.iter().filter(|(_, w)| *w == v).count();
            let pick = (0..round.len())
                .filter(|&i| Some(round[i].1) != prev)
                .max_by_key(|&i| (left(round[i].1), std::cmp::Reverse(i)))
                .unwrap_or(0);
            let next = round.remove(pick);
            prev = Some(next.1);
            ordered.push(next);
        }
        let round = ordered;
        for (point, victim) in round {
            let index = out.len();
            out.push(Fault {
                index,
                point,
                victim,
                seed: seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_is_every_point_and_victim_once_never_the_same_victim_twice_in_a_row() {
        let m = matrix(7, 3, &Victim::ALL);
        assert_eq!(m.len(), 3 * Point::ALL.len() * Victim::ALL.len());
        for round in m.chunks(Point::ALL.len() * Victim::ALL.len()) {
            let mut pairs: Vec<_> = round.iter().map(|f| (f.point, f.victim)).collect();
            pairs.sort();
            pairs.dedup();
            assert_eq!(pairs.len(), round.len());
        }
        for w in m.windows(2) {
            assert_ne!(w[0].victim, w[1].victim, "{w:?}");
        }
        assert!(m.iter().enumerate().all(|(i, f)| f.index == i));
    }

    #[test]
    fn the_seed_replays_the_matrix_and_another_seed_reorders_it() {
        assert_eq!(
            matrix(42, 2, &Victim::ACTORS),
            matrix(42, 2, &Victim::ACTORS)
        );
        assert_ne!(
            matrix(42, 1, &Victim::ACTORS),
            matrix(43, 1, &Victim::ACTORS)
        );
    }
}
