#!/usr/bin/env bash
# The chaos suite (docs/chaos.md): the agent's actors killed at every point
# of an activation; the agent process, charon and ovs-monitor-ipsec SIGKILLed
# at every point; the cleanup process SIGKILLed at every step of a release
# (and at every pair of steps); agents and the controller's leader crashed at
# each barrier of enable and disable; API errors, clock jumps and a full key
# directory. The invariants checked after each fault, a table per suite.
# The options size the actor kills (--rounds and --seed the process kills too).
#
#   scripts/chaos.sh                 four agents, one round of the matrix each (288 faults)
#   scripts/chaos.sh --ci            the CI form: sixteen agents, two to a matrix (576 faults)
#   scripts/chaos.sh --long          eight agents, four rounds each (2304 faults)
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
while [ $# -gt 0 ]; do
  case "$1" in
    --ci) rounds=1; nodes=16; shares=2; shift ;;
    --long) rounds=4; nodes=8; shift ;;
    --rounds) rounds="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "chaos.sh: unknown argument $1 (--ci, --long, --rounds N, --nodes M, --seed S)" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

export CHAOS_ROUNDS="$rounds" CHAOS_NODES="$nodes" CHAOS_SHARES="$shares"
if [ -n "$seed" ]; then
  export CHAOS_SEED="$seed"
fi
# One test at a time: each measures recovery against wall-clock bounds.
RUST_BACKTRACE=0 cargo test --locked -q -p chaos-tests --tests -- --ignored --nocapture --test-threads=1
