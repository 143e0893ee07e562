//! Enable/disable coordination (SPEC §7): the decision over the record
//! ([`machine`]) and the judgement of a node's signed evidence
//! ([`evidence`]), both pure; the election on the Lease ([`leader`]) and
//! the leader's loop that observes the cluster, performs the decisions and
//! publishes the cohort's status ([`run`]) (docs/coordination.md).

pub mod evidence;
pub mod leader;
pub mod machine;
pub mod run;
