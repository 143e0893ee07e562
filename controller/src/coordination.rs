//! Enable/disable coordination (SPEC §7): the decision over the record
//! ([`machine`]) and the judgement of a node's signed evidence
//! ([`evidence`]), both pure. The leader's loop that observes the cluster,
//! performs decisions and publishes the cohort's status is built on them
//! (docs/coordination.md).

pub mod evidence;
pub mod machine;
