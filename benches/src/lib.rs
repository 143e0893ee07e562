//! Shared pieces of the bench binaries.

pub mod rawhttp;
