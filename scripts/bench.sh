#!/usr/bin/env bash
# Runs every benchmark in full and prints its figure next to the baseline it is
# compared with in the same run. Figures go into docs/performance.md by hand,
# with the date and the machine they were measured on.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

cargo bench --locked -p kube-ovn-ipsec-benches --benches
for bin in $(sed -n 's/^name = "\(.*\)"$/\1/p' benches/Cargo.toml | grep -v '^kube-ovn-ipsec-benches$'); do
  if [ -f "benches/src/bin/$bin.rs" ]; then
    cargo run --release --locked -p kube-ovn-ipsec-benches --bin "$bin"
  fi
done
