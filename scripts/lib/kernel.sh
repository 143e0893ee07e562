# Shared by scripts/kernel-tests.sh and scripts/chaos.sh: building test
# binaries and running a script on a full kernel (ESP, GENEVE, the OVS kernel
# datapath) through testbed's koi-kernel-run — the host's kernel when it has
# them, otherwise Debian's under qemu (docs/kernel.md).

# Prints the executables cargo builds for the given cargo test arguments.
executables() {
  cargo test --locked "$@" --no-run --message-format=json \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] in (["test"], ["bench"]):
        print(m["executable"])
'
}

# Builds koi-kernel-run and prints its absolute path.
kernel_runner() {
  cargo build --locked -q -p testbed --bin koi-kernel-run
  realpath "${CARGO_TARGET_DIR:-target}/debug/koi-kernel-run"
}
