//! Which agent binary a test crate runs.
//!
//! Cargo tells a crate's integration tests where that crate's binaries are
//! only at compile time (`CARGO_BIN_EXE_<name>`), so the path must come
//! from the test crate, not from this library: the runtime's tests run
//! `kube-ovn-ipsec`, the chaos suite `kube-ovn-ipsec-chaos` (the same
//! command line with its fault points). [`use_agent_binary!`] names it once
//! per test; every fixture that starts an agent or a cleanup asks
//! [`agent`]. A test that forgets fails at its first spawn with a message
//! that says so, never with another binary.
//!
//! [`use_agent_binary!`]: crate::use_agent_binary

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static AGENT: OnceLock<PathBuf> = OnceLock::new();

/// Records `path` as the agent binary of this test process. Calling it
/// again with the same path is a no-op; with another path it panics (one
/// test process runs one agent binary).
pub fn register_agent(path: Option<&'static str>) {
    let Some(path) = path else {
        panic!(
            "harness: this test crate builds no agent binary (neither \
             kube-ovn-ipsec nor kube-ovn-ipsec-chaos is one of its binaries)"
        );
    };
    let set = AGENT.get_or_init(|| PathBuf::from(path));
    assert_eq!(
        set,
        Path::new(path),
        "harness: one test process runs one agent binary"
    );
}

/// The agent binary registered by [`use_agent_binary!`](crate::use_agent_binary).
///
/// # Panics
/// When the test did not register one: a fixture must never guess.
pub fn agent() -> &'static Path {
    AGENT.get().map(PathBuf::as_path).unwrap_or_else(|| {
        panic!(
            "harness: no agent binary registered; call \
             `harness::use_agent_binary!()` at the start of the test"
        )
    })
}

/// Registers the calling test crate's agent binary: `kube-ovn-ipsec-chaos`
/// in the chaos suite, `kube-ovn-ipsec` in the runtime's tests (expanded in
/// the caller, so `option_env!` sees the caller's `CARGO_BIN_EXE_*`).
#[macro_export]
macro_rules! use_agent_binary {
    () => {
        $crate::binaries::register_agent(
            option_env!("CARGO_BIN_EXE_kube-ovn-ipsec-chaos")
                .or(option_env!("CARGO_BIN_EXE_kube-ovn-ipsec")),
        )
    };
}
