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

# Each section prints how long the one before it took, so a slow CI run
# shows where its time went.
SECONDS=0
section_started=0
section() {
  if [ -n "${section_name:-}" ]; then
    echo "== ($section_name: $((SECONDS - section_started)) s; $SECONDS s so far)"
  fi
  section_name="$1"
  section_started=$SECONDS
  echo "== $1"
}

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

section "cargo fmt --check"
cargo fmt --all -- --check

section "docs/architecture.md crate graph matches cargo metadata"
python3 scripts/crate-graph.py --check docs/architecture.md

section "the Helm chart: renders, lints, validates, matches SPEC and helm/rendered/"
bash scripts/chart-test.sh

section "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# A workspace build unifies features across every crate; a binary built on
# its own (scripts/lab.sh, the image) gets only its own. Check each alone.
section "each binary crate builds on its own"
for p in kube-ovn-ipsec-lab kube-ovn-ipsec-runtime kube-ovn-ipsec-controller; do
  cargo check --locked -q -p "$p"
done

section "the full kernel for the kernel checks (fetched once into its cache)"
cargo build --locked -q -p testbed --bin koi-kernel-run
"${CARGO_TARGET_DIR:-target}/debug/koi-kernel-run" --prepare

section "cargo test (real daemons; a missing program fails by name)"
# Two test threads: the machine has two cores, and the integration tests start
# real daemons whose start-up latency is what they measure against timeouts.
# --all-targets includes the criterion benches: built in the test profile and
# run by `cargo test` without `--bench`, criterion runs each benchmark once as a
# smoke test, so a bench that no longer works fails here (figures come from
# scripts/bench.sh, in release).
RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}" cargo test --workspace --all-targets --locked --no-fail-fast

# The kernel-dependent tests again, on a kernel that has ESP, GENEVE and the
# OVS kernel datapath: the host's when it has them, otherwise Debian's stock
# kernel under qemu (docs/kernel.md). On the host above they printed
# SKIPPED/NOT CHECKED for what this kernel cannot do; there every check must
# run, so any such line, or a failure, fails this step.
section "kernel-dependent tests on a full kernel"
# The chaos faults CI injects come from one fixed seed (the overlay kills
# here, the chaos section below), so every run checks the same faults and a
# failure replays as it is; scripts/chaos.sh draws fresh ones. CHAOS_SEED
# from the caller's environment overrides it.
export CHAOS_SEED="${CHAOS_SEED:-0x18ee71a41c0bbbf2}"
# Every chaos suite prints its ledger lines; this log collects them from
# the guest and the host for the whole run's figures after the chaos
# section.
chaos_log=$(mktemp --suffix=.log /tmp/koi-chaos-ledger.XXXXXX)
trap 'rm -f "$chaos_log"' EXIT
bash scripts/kernel-tests.sh 2>&1 | tee "$chaos_log"

# The chaos suite (docs/chaos.md), from the fixed seed above (the table
# prints it; scripts/chaos.sh --seed replays it):
# - actors of sixteen agents killed at each point of an activation (the node
#   coordinator among them): eight rounds of the matrix, two agents to a
#   matrix (576 faults; more agents with fewer faults each take less wall
#   time);
# - the agent, charon and the monitor SIGKILLed at each point (24);
# - the cleanup process SIGKILLed at each step of a release and each pair
#   of steps (31);
# - environment faults (13);
# - agents and the controller's leader crashed at each barrier of enable and
#   disable, the controller process SIGKILLed at each phase of both (11).
# The overlay kills (3) run with the kernel tests above. One test at a time.
section "the chaos suite"
# --workspace with each suite named, not -p (the same rebuild as the lab's).
# Each suite must also leave its ledger (--expect below).
chaos_suites=()
expect=()
for t in chaos-tests/tests/*.rs; do
  chaos_suites+=(--test "$(basename "$t" .rs)")
  expect+=(--expect "$(basename "$t" .rs)")
done
CHAOS_ROUNDS=1 CHAOS_NODES=16 CHAOS_SHARES=2 RUST_BACKTRACE=0 \
  cargo test --locked -q --workspace "${chaos_suites[@]}" -- --ignored --nocapture --test-threads=1 \
  2>&1 | tee -a "$chaos_log"
# The whole run's faults, time in the suites and recovery distribution
# (p50/p99/max over every fault, the overlay kills in the guest included);
# a suite that left no ledger fails here.
"${CARGO_TARGET_DIR:-target}/debug/kube-ovn-ipsec-chaos-ledger" "${expect[@]}" "$chaos_log"

# The lab's own run, end to end (README's first command, three nodes, the
# whole lifecycle on the full kernel) with its JSON summary checked, and
# `down` leaving nothing behind. Alone: it measures windows and losses that
# a parallel build would distort.
section "the lab end to end"
# --workspace, not -p: the lab alone would resolve its own features and
# rebuild crates the workspace test build already has.
RUST_BACKTRACE=0 cargo test --locked -q --workspace --test lab_e2e -- --ignored --nocapture

section "all tests passed"
