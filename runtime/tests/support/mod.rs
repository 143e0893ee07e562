//! Shared fixtures of the runtime integration tests.
pub mod cluster;
