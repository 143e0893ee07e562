#!/usr/bin/env bash
# Sets up and runs every test of kube-ovn-ipsec: the README's second quick-start
# command, and the only thing .ci/run calls.
#
# It installs what the tests need (Debian packages from scripts/install-deps.sh),
# checks formatting and lints, runs the whole test suite against the real
# ovsdb-server, ovn-northd, strongSwan, ovs-monitor-ipsec and kernel XFRM, and
# smoke-runs every bench once so a bench that no longer works fails here.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== docs/architecture.md crate graph matches cargo metadata"
python3 scripts/crate-graph.py --check docs/architecture.md

echo "== cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (real daemons; a missing program fails by name)"
# Two test threads: the machine has two cores, and the integration tests start
# real daemons whose start-up latency is what they measure against timeouts.
# --all-targets includes the criterion benches: built in the test profile and
# run by `cargo test` without `--bench`, criterion runs each benchmark once as a
# smoke test, so a bench that no longer works fails here (figures come from
# scripts/bench.sh, in release).
RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}" cargo test --workspace --all-targets --locked --no-fail-fast

# Checks this machine cannot do (kernel ESP data path: TESTBED.md) are not
# silent: the tests assert the exact failure reason instead and print a
# SKIPPED/NOT CHECKED line, which libtest captures for passing tests. Show
# those lines here so every run says what it did not check.
echo "== checks not possible on this machine (kernel-dependent)"
RUST_TEST_THREADS=1 cargo test --locked -p kube-ovn-ipsec-runtime \
  --test ike_monitor --test monitor_patch --test agent_runtime -- --nocapture 2>&1 \
  | grep -E "SKIPPED|NOT CHECKED" | sort -u || echo "(none: every kernel-dependent check ran)"

echo "== all tests passed"
