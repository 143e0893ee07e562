#!/usr/bin/env bash
# Runs the kernel-dependent integration tests (kernel ESP, SA attribution,
# the ESP data path) on a full kernel through testbed's koi-kernel-run: the
# host's kernel when it has ESP, GENEVE and openvswitch, otherwise Debian's
# under qemu (one boot for all of them). Fails when a test fails or when any
# check still says SKIPPED or NOT CHECKED. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/toolchain.sh
require_toolchain

TESTS=(ike_monitor monitor_patch agent_runtime)
args=()
for t in "${TESTS[@]}"; do args+=(--test "$t"); done
bins=$(cargo test --locked -p kube-ovn-ipsec-runtime "${args[@]}" --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])
')
[ -n "$bins" ] || { echo "kernel-tests: no test binaries built" >&2; exit 1; }
cargo build --locked -q -p testbed --bin koi-kernel-run

runner=$(mktemp --suffix=.sh /tmp/koi-kernel-tests.XXXXXX)
log=$(mktemp --suffix=.log /tmp/koi-kernel-tests.XXXXXX)
trap 'rm -f "$runner" "$log"' EXIT
{
  echo 'rc=0'
  for b in $bins; do
    echo "echo \"== in the kernel: \$(basename $b)\"; t0=\$(date +%s)"
    echo "$b --test-threads=1 --nocapture || rc=1"
    echo "echo \"== $(basename "$b"): \$((\$(date +%s) - t0)) s\""
  done
  echo 'exit $rc'
} > "$runner"

# The tests find their fixtures relative to the runtime crate, as under cargo.
set +e
(cd runtime && RUST_BACKTRACE=0 ../target/debug/koi-kernel-run --timeout 1500 -- sh "$runner") 2>&1 \
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
