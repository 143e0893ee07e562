#!/usr/bin/env bash
# Installs or upgrades kube-ovn-ipsec with Helm, driven by the same
# environment variables as Kube-OVN's install script:
#
#   ENABLE_OVN_IPSEC=true|false     IPsec on or off (default false)
#   CERT_MANAGER_IPSEC_CERT=true|false
#                                   forward validated CSRs to cert-manager
#   CERT_MANAGER_ISSUER_NAME=NAME   the dedicated ClusterIssuer (kube-ovn)
#   IPSEC_CERT_DURATION=SECONDS     requested certificate lifetime
#   OVN_IPSEC_KEY_DIR=PATH          key directory (Talos: /var/lib/ovs_ipsec_keys)
#   IPSEC_PREVIOUS_STATE=auto|true|false
#                                   with IPsec off: whether nodes may still
#                                   hold IPsec state (auto: ask the cluster
#                                   for the coordination record)
#   NAMESPACE=kube-system  RELEASE=kube-ovn-ipsec
#   IMAGE_REPOSITORY=...   IMAGE_TAG=...
#
# With IPsec off after it was on, the chart replaces the `ipsec` container
# with the one-shot `ipsec-cleanup` init container (docs/chart.md), as the
# design's install script does.
#
#   scripts/install.sh            helm upgrade --install
#   scripts/install.sh --dry-run  print the values and the rendered
#                                 manifests; change nothing
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

bool() { # name value -> true|false, or a clear error
  case "${2,,}" in
    true|false) echo "${2,,}" ;;
    *) echo "install.sh: $1=$2: expected true or false" >&2; exit 2 ;;
  esac
}

NAMESPACE=${NAMESPACE:-kube-system}
RELEASE=${RELEASE:-kube-ovn-ipsec}
enable=$(bool ENABLE_OVN_IPSEC "${ENABLE_OVN_IPSEC:-false}")
cert_manager=$(bool CERT_MANAGER_IPSEC_CERT "${CERT_MANAGER_IPSEC_CERT:-false}")
previous=${IPSEC_PREVIOUS_STATE:-auto}
case "$previous" in auto|true|false) ;; *)
  echo "install.sh: IPSEC_PREVIOUS_STATE=$previous: expected auto, true or false" >&2; exit 2 ;;
esac
if [ -n "${IPSEC_CERT_DURATION:-}" ] && ! [[ "$IPSEC_CERT_DURATION" =~ ^[0-9]+$ ]]; then
  echo "install.sh: IPSEC_CERT_DURATION=$IPSEC_CERT_DURATION: expected whole seconds" >&2; exit 2
fi

# With IPsec off, decide here whether the cleanup init container is needed
# when the cluster can be asked: the coordination record exists once IPsec
# was ever enabled. Unreachable, the chart's own `auto` decides (it renders
# the cleanup, which exits at once on a node without state).
if [ "$enable" = false ] && [ "$previous" = auto ] && command -v kubectl >/dev/null 2>&1; then
  if out=$(kubectl get configmap ovn-ipsec-coordination -n "$NAMESPACE" \
             --request-timeout=5s -o name 2>&1); then
    previous=true
  elif echo "$out" | grep -q NotFound; then
    previous=false
  fi
fi

values=$(mktemp)
trap 'rm -f "$values"' EXIT
{
  echo "features:"
  echo "  enableOvnIpsec: $enable"
  echo "ipsec:"
  if [ -n "${IPSEC_CERT_DURATION:-}" ]; then echo "  certificateDuration: $IPSEC_CERT_DURATION"; fi
  if [ -n "${OVN_IPSEC_KEY_DIR:-}" ]; then echo "  keyDirectory: \"$OVN_IPSEC_KEY_DIR\""; fi
  echo "  certManager:"
  echo "    enabled: $cert_manager"
  echo "    issuerName: \"${CERT_MANAGER_ISSUER_NAME:-kube-ovn}\""
  echo "  cleanup:"
  if [ "$previous" = auto ]; then echo "    previousState: auto"; else echo "    previousState: $previous"; fi
  if [ -n "${IMAGE_REPOSITORY:-}${IMAGE_TAG:-}" ]; then
    echo "image:"
    if [ -n "${IMAGE_REPOSITORY:-}" ]; then echo "  repository: \"$IMAGE_REPOSITORY\""; fi
    if [ -n "${IMAGE_TAG:-}" ]; then echo "  tag: \"$IMAGE_TAG\""; fi
  fi
} > "$values"

if [ "$dry_run" = 1 ]; then
  echo "# values ($RELEASE in $NAMESPACE)"
  cat "$values"
  echo "# rendered manifests"
  if command -v helm >/dev/null 2>&1; then
    helm template "$RELEASE" helm/kube-ovn-ipsec -n "$NAMESPACE" -f "$values"
  else
    # No helm binary: the same Helm library, embedded (scripts/lib/chart-tools.sh).
    source scripts/lib/chart-tools.sh
    ensure_chart_tools >&2
    "$(chart_python)" - "$values" "$RELEASE" "$NAMESPACE" <<'PY'
import sys, yaml, helm_python
values = yaml.safe_load(open(sys.argv[1]))
try:
    with helm_python.Chart.load("helm/kube-ovn-ipsec") as chart:
        out = chart.render(values, name=sys.argv[2], namespace=sys.argv[3], is_install=True)
except helm_python.HelmError as e:
    sys.exit(f"install.sh: the chart refused these values: {e}")
for path, text in sorted(out.items()):
    if text.strip():
        print(f"---\n# Source: {path}\n{text.strip()}")
PY
  fi
  exit 0
fi

if ! command -v helm >/dev/null 2>&1; then
  echo "install.sh: helm not found; install Helm 3.8+ (or use --dry-run and apply the manifests yourself)" >&2
  exit 1
fi
helm upgrade --install "$RELEASE" helm/kube-ovn-ipsec -n "$NAMESPACE" -f "$values"
