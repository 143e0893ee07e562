//! The chaos suite: the agent's actors killed at each point of an
//! activation while the agent runs on the real components, and the
//! invariants checked after every fault (docs/chaos.md).
//!
//! - [`plan`]: the points, the victims, and the matrix a seed draws.
//! - [`inject`]: the fault switch and the decorators of the agent's
//!   adapters that stop a caller at the armed point while the victim is
//!   killed (through `runtime::agent::Seams`).
//! - [`check`]: the invariants, over what the test reads from the node.
//! - [`report`]: the table per run and the recovery distribution.
//!
//! The runs themselves are the tests in `tests/`.

pub mod check;
pub mod inject;
pub mod plan;
pub mod report;
