#!/usr/bin/env bash
# Sets up and runs the lab: the README's first quick-start command.
#
# Installs the Debian packages (scripts/install-deps.sh), builds the lab binary
# and runs it on its embedded defaults. Extra arguments are passed to
# `kube-ovn-ipsec-lab` (default: the `demo` subcommand).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
source scripts/lib/toolchain.sh
require_toolchain

cargo build --release --locked -p kube-ovn-ipsec-lab
if [ "$#" -eq 0 ]; then set -- demo; fi
exec ./target/release/kube-ovn-ipsec-lab "$@"
