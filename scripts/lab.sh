#!/usr/bin/env bash
# Sets up and runs the lab: the README's first quick-start command.
#
# Installs the Debian packages (scripts/install-deps.sh), builds the lab, the
# agent and the controller, and runs the lab on its embedded defaults. Extra arguments are passed to
# `kube-ovn-ipsec-lab` (default: `up`, the whole lifecycle on three nodes).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

# The lab runs the agent and the controller as processes, found beside
# its own binary: build all three.
cargo build --release --locked -p kube-ovn-ipsec-lab -p kube-ovn-ipsec-runtime -p kube-ovn-ipsec-controller
# `up` fetches the full kernel itself when this one lacks ESP, GENEVE or
# openvswitch (once, into its cache).
if [ "$#" -eq 0 ]; then set -- up; fi
exec "${CARGO_TARGET_DIR:-target}/release/kube-ovn-ipsec-lab" "$@"
