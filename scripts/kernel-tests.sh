#!/usr/bin/env bash
# Runs the kernel-dependent integration tests (kernel ESP, SA attribution,
# the ESP data path, the encrypted overlay end to end) and the overlay and
# SA rekey benches in their quick mode on a full kernel through testbed's
# koi-kernel-run: the host's kernel when it has ESP, GENEVE and openvswitch, otherwise Debian's
# under qemu (one boot for all of them; each test timed on its own). Fails
# when a test fails or when any check still says SKIPPED or NOT CHECKED.
# Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/toolchain.sh
source scripts/lib/kernel.sh
require_toolchain

# Test binaries that need the full kernel (the runtime crate's, and the chaos
# suite's process kills on the encrypted overlay), and the benches that do
# (run with --quick: a bench that no longer works fails here;
# scripts/bench.sh takes its figures).
TESTS=(ike_monitor monitor_patch agent_runtime overlay coordination_overlay datapath_health overlay_kills)
BENCHES=(overlay_datapath sa_rekey)
# Of these binaries, only the tests named here need the full kernel; the
# others assert nothing the host's kernel lacks and ran in the workspace
# run (monitor_patch's refresh tests assert on IKE_SAs; the lab and
# coordination_overlay refresh tunnels beside installed CHILD_SAs;
# agent_runtime's capability test refuses before any kernel state).
declare -A ONLY=(
  [monitor_patch]="a_renewal_keeps_established_connections_until_one_is_gone_or_rebuilt a_new_tunnel_is_brought_up_by_the_monitors_without_traffic"
  [agent_runtime]="real_ike_daemon_and_monitor_restart_with_guards_in_place"
)

# --workspace, not -p: a single package resolves its own features and would
# rebuild dozens of crates that `cargo test --workspace` already built.
args=()
for t in "${TESTS[@]}"; do args+=(--test "$t"); done
bins=$(executables --workspace "${args[@]}")
args=()
for b in "${BENCHES[@]}"; do args+=(--bench "$b"); done
benches=$(executables --workspace "${args[@]}")
[ -n "$bins" ] && [ -n "$benches" ] || { echo "kernel-tests: no test binaries built" >&2; exit 1; }
kernel_run=$(kernel_runner)

runner=$(mktemp --suffix=.sh /tmp/koi-kernel-tests.XXXXXX)
log=$(mktemp --suffix=.log /tmp/koi-kernel-tests.XXXXXX)
trap 'rm -f "$runner" "$log"' EXIT
# One guest boot for everything; each test on its own (--exact), timed, so
# the log says what each one costs on the full kernel.
{
  echo 'rc=0; T0=$(date +%s)'
  # The guest does not inherit this environment: a seed the caller fixed
  # (scripts/test.sh) goes in with the command.
  if [ -n "${CHAOS_SEED:-}" ]; then echo "export CHAOS_SEED=$CHAOS_SEED"; fi
  echo 'step() { name=$1; shift; echo "== in the kernel: $name"; t0=$(date +%s); "$@"; r=$?; [ $r -eq 0 ] || { rc=1; echo "== FAILED: $name (exit $r)"; }; echo "== $name: $(($(date +%s) - t0)) s"; return $r; }'
  for b in $bins; do
    name=$(basename "$b" | sed 's/-[0-9a-f]*$//')
    for t in $("$b" --list --format terse 2>/dev/null | sed -n 's/: test$//p'); do
      if [ -n "${ONLY[$name]:-}" ] && ! [[ " ${ONLY[$name]} " == *" $t "* ]]; then continue; fi
      echo "step '$name::$t' $b --exact '$t' --test-threads=1 --nocapture"
    done
  done
  for b in $benches; do
    echo "(cd ../benches && step '$(basename "$b" | sed 's/-[0-9a-f]*$//') --quick' $b --quick) || rc=1"
  done
  echo 'echo "== every kernel step: $(($(date +%s) - T0)) s"'
  echo 'exit $rc'
} > "$runner"
# A renamed test must not drop out of the kernel run unnoticed.
for name in "${!ONLY[@]}"; do
  for t in ${ONLY[$name]}; do
    grep -q "step '$name::$t'" "$runner" || { echo "kernel-tests: $name has no test $t" >&2; exit 1; }
  done
done

# The tests find their fixtures relative to the runtime crate, as under cargo.
set +e
(cd runtime && RUST_BACKTRACE=0 "$kernel_run" --timeout 2100 -- sh "$runner") 2>&1 \
  | grep -av '^\[ *[0-9.]*\]' | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if grep -aqE 'SKIPPED|NOT CHECKED' "$log"; then
  echo "kernel-tests: a check was skipped on the full kernel:" >&2
  grep -aE 'SKIPPED|NOT CHECKED' "$log" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || { echo "kernel-tests: failed (exit $rc)" >&2; exit "$rc"; }
echo "kernel-tests: every kernel-dependent check ran"
