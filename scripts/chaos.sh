#!/usr/bin/env bash
# The chaos suite (docs/chaos.md): the agent's actors killed at every point
# of an activation; the agent process, charon and ovs-monitor-ipsec SIGKILLed
# at every point; the cleanup process SIGKILLed at every step of a release
# (and at every pair of steps); agents and the controller's leader crashed at
# each barrier of enable and disable; API errors, clock jumps and a full key
# directory. The invariants checked after each fault, a table per suite.
# The options size the actor kills (--rounds and --seed the process kills too).
# --long adds the process kills on the encrypted overlay at activation points
# (a CA rotation's renewal), on a full kernel: under qemu where the host
# lacks ESP, GENEVE or openvswitch (about ten minutes there).
#
#   scripts/chaos.sh                 four agents, one round of the matrix each (288 faults)
#   scripts/chaos.sh --ci            the CI form: sixteen agents, two to a matrix (576 faults)
#   scripts/chaos.sh --long          eight agents, four rounds each (2304 faults), and the
#                                    overlay kills at activation points (6 faults)
#   scripts/chaos.sh --seed 0x1234   replay a run (the table prints its seed)
#   scripts/chaos.sh --rounds N --nodes M
#
# Installs what it needs (scripts/install-deps.sh), as root.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=1
nodes=4
shares=1
seed=""
long=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) rounds=1; nodes=16; shares=2; shift ;;
    --long) rounds=4; nodes=8; long=1; shift ;;
    --rounds) rounds="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "chaos.sh: unknown argument $1 (--ci, --long, --rounds N, --nodes M, --seed S)" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
source scripts/lib/kernel.sh
require_toolchain

export CHAOS_ROUNDS="$rounds" CHAOS_NODES="$nodes" CHAOS_SHARES="$shares"
if [ -n "$seed" ]; then
  export CHAOS_SEED="$seed"
fi
# The suites' ledger lines, for the run's figures at the end.
log=$(mktemp --suffix=.log /tmp/koi-chaos.XXXXXX)
runner=$(mktemp --suffix=.sh /tmp/koi-chaos-overlay.XXXXXX)
trap 'rm -f "$log" "$runner"' EXIT
# One test at a time: each measures recovery against wall-clock bounds.
RUST_BACKTRACE=0 cargo test --locked -q -p chaos-tests --tests -- --ignored --nocapture --test-threads=1 \
  2>&1 | tee "$log"

if [ "$long" = 1 ]; then
  # The overlay at activation points: one round (six faults, three of them
  # inside a CA rotation's renewal), the seed replayable like the rest.
  bin=$(executables --workspace --test overlay_kills)
  [ -n "$bin" ] || { echo "chaos.sh: the overlay kills did not build" >&2; exit 1; }
  kernel_run=$(kernel_runner)
  {
    echo "export CHAOS_OVERLAY_POINTS=1 RUST_BACKTRACE=0"
    [ -n "$seed" ] && echo "export CHAOS_SEED=$seed"
    echo "exec $bin --exact charon_monitor_and_agent_killed_under_encrypted_traffic_leak_no_plaintext --test-threads=1 --nocapture"
  } > "$runner"
  # The tests find their fixtures relative to the runtime crate, as under cargo.
  (cd runtime && "$kernel_run" --timeout 1800 -- sh "$runner") 2>&1 | grep -av '^\[ *[0-9.]*\]' | tee -a "$log"
fi
# Every suite's faults and the recovery distribution over all of them.
"${CARGO_TARGET_DIR:-target}/debug/kube-ovn-ipsec-chaos-ledger" "$log"
