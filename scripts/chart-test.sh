#!/usr/bin/env bash
# Checks the Helm chart (scripts/chart-test.py): renders every value style,
# lints, validates against Kubernetes 1.32, holds each render to SPEC §8-§9,
# refuses bad values, compares helm/rendered/. `--update` rewrites
# helm/rendered/ after a deliberate chart change.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/chart-tools.sh
ensure_chart_tools
exec "$(chart_python)" scripts/chart-test.py "$@"
