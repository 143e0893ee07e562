#!/usr/bin/env bash
# Installs every Debian package the lab and the tests need (TESTBED.md), idempotently.
# Safe to run repeatedly: a package that is already present is not touched, and
# `apt-get update` runs only when something is missing.
set -euo pipefail

PACKAGES=(
  openvswitch-switch openvswitch-ipsec ovn-central ovn-host
  strongswan strongswan-swanctl charon-systemd libcharon-extra-plugins
  libstrongswan-extra-plugins iproute2
  # ovs-monitor-ipsec proposes only AES-GCM; its plugin is in this package
  # (without it IKE fails with "AES_GCM_16 not supported").
  libstrongswan-standard-plugins
  # The full kernel for the kernel checks (testbed::guest, TESTBED.md): qemu
  # boots Debian's stock kernel (fetched with `apt-get download` at test time
  # into a cache, never installed into /boot) with an initramfs built from
  # busybox-static by cpio; ping and tcpdump look at the traffic.
  # depmod (kmod) indexes the unpacked kernel's modules for modprobe.
  qemu-system-x86 busybox-static cpio kmod iputils-ping tcpdump
  # The datapath-health checks drop ESP on one node's underlay with nft.
  nftables
  # Build and test tooling used by scripts/test.sh.
  build-essential pkg-config python3 python3-venv openssl patch util-linux procps psmisc
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: must run as root (apt-get, network namespaces, XFRM)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The Debian packages try to start their services through systemd/invoke-rc.d;
  # in a container without an init that fails harmlessly, but a policy-rc.d that
  # forbids starts keeps postinst scripts from hanging or erroring.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    created_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ "${created_policy:-0}" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
else
  echo "install-deps: all Debian packages present"
fi

# The guest kernel's package is found through apt's package lists
# (testbed::guest fetches it with `apt-get download`; scripts/test.sh runs
# `koi-kernel-run --prepare`): images that ship without lists get them here.
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
  echo "install-deps: no apt package lists for linux-image-amd64; running apt-get update"
  apt-get update -qq
fi

# kubectl is the independent client the embedded API server's tests run
# against. The project's machines carry a current one (/usr/bin/kubectl);
# where it is missing, Debian's kubernetes-client is the only packaged one
# (1.20: older than what the tests were written against, so a failure there
# names kubectl's version rather than passing silently).
if ! command -v kubectl >/dev/null 2>&1; then
  echo "install-deps: kubectl not found; installing Debian's kubernetes-client"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends kubernetes-client
fi

# The Debian packages start system-wide daemons when an init exists. The lab and
# the tests run their own instances in temp dirs; nothing here depends on them.
