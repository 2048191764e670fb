#!/usr/bin/env bash
# Debian packages everything in this project needs: the local Slurm cluster, the image
# builder and its test runner, strace (the benchmark that counts what the lease costs the
# file system), Prometheus, Alertmanager and node_exporter (the alert rules' test and
# promtool), and a Python that can make virtual environments.
# Idempotent: installs only what is missing, so a warm machine pays one dpkg query.
set -euo pipefail

packages=(
  make python3 python3-venv python3-dev gcc git ca-certificates
  slurm-wlm slurmdbd slurm-client munge mariadb-server
  iproute2 procps psmisc util-linux numactl strace
  debootstrap squashfs-tools bubblewrap
  prometheus prometheus-alertmanager prometheus-node-exporter
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps: run as root (it installs Debian packages)" >&2
  exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: needs a Debian or Ubuntu machine (apt-get not found)" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-system-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No daemon may start on its own: the local cluster starts its daemons itself, with
# its own configuration, inside network namespaces.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Debian enables these daemons for the next boot even when policy-rc.d kept them from
# starting now; the alert rules' test starts its own, on loopback, with its own files.
# (systemctl disables offline too, without a running systemd.)
for unit in prometheus prometheus-alertmanager prometheus-node-exporter; do
  if [[ " ${missing[*]} " == *" $unit "* ]] && command -v systemctl >/dev/null; then
    systemctl disable "$unit.service" >/dev/null 2>&1 || true
  fi
done
