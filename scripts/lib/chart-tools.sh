# Shared by scripts/test.sh and scripts/install.sh: the Python tools that
# render, lint and validate the Helm chart without a helm binary or a
# cluster (TESTBED.md), in their own virtualenv, installed once from PyPI
# at pinned versions. Idempotent: a venv that already imports them at these
# versions is left alone.
CHART_VENV="${KOI_CHART_VENV:-/opt/kube-ovn-ipsec/chart-venv}"
CHART_TOOLS=(helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 PyYAML==6.0.2)

ensure_chart_tools() {
  local py="$CHART_VENV/bin/python"
  if [ -x "$py" ] && "$py" - "${CHART_TOOLS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    if version(name) != want:
        sys.exit(1)
import helm_python, kubernetes_validate, yaml  # noqa: E401,F401
PY
  then
    return 0
  fi
  echo "chart-tools: installing ${CHART_TOOLS[*]} into $CHART_VENV"
  mkdir -p "$(dirname "$CHART_VENV")"
  python3 -m venv "$CHART_VENV"
  "$CHART_VENV/bin/pip" install -q --disable-pip-version-check "${CHART_TOOLS[@]}"
}

chart_python() {
  echo "$CHART_VENV/bin/python"
}
