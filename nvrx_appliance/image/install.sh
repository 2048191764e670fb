#!/usr/bin/env bash
# The one install script: everything an appliance image holds beyond its base goes in
# here, whichever front end runs it (enroot, Apptainer, or the rootfs builder). It runs
# as root inside the image being built, next to build.env (the pins, rendered by
# pins.py) and wheels/ (this appliance, built from source at build time).
#
# Any failing command fails the build, and the front ends then leave no image behind.
set -euo pipefail

context=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=/dev/null
. "$context/build.env"

step() { printf '==> %s\n' "$*"; }
fail() { printf 'install: %s\n' "$*" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

step "system packages"
# numactl: NVRX_GPUS_PER_NUMA makes ft_launcher wrap every rank in it, and it dies at
# once when the binary is missing. git: the Megatron-LM checkout (gpu flavour).
# python3-venv: the cpu flavour's Python lives in its own venv (below).
missing=()
command -v numactl >/dev/null || missing+=(numactl)
if [ "$IMAGE_FLAVOR" = gpu ]; then
  command -v git >/dev/null || missing+=(git)
else
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3 python3-venv)
fi
[ -e /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if [ "${#missing[@]}" -gt 0 ]; then
  # --error-on=any: an index that failed to update is an error, not a warning.
  apt-get update -qq --error-on=any
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  rm -rf /var/lib/apt/lists/*
  # The rootfs builder mounts a download cache here; anywhere else the .debs go.
  mountpoint -q /var/cache/apt/archives || apt-get clean
fi

step "Python environment"
if [ "$IMAGE_FLAVOR" = gpu ]; then
  # The base's own Python: it holds the base's CUDA PyTorch, which must stay as it is.
  py=$(command -v python3)
else
  # A venv, so pip never fights Debian's own Python packages.
  python3 -m venv /opt/nvrx-appliance/venv
  py=/opt/nvrx-appliance/venv/bin/python
  step "PyTorch $TORCH_VERSION (CPU build)"
  "$py" -m pip install --progress-bar off "torch==$TORCH_VERSION"
fi
pip=("$py" -m pip install --progress-bar off)
# Whatever PyTorch the image now has stays: a requirement such as torch>=2.3 must never
# replace it (NGC's pre-release build does not satisfy such ranges by pip's rules, and
# the replacement would be a multi-GB download of a different build).
keep=$(mktemp)
trap 'rm -f "$keep"' EXIT
"$py" -c 'import torch; print("torch==" + torch.__version__)' >"$keep" \
  || fail "the base has no importable PyTorch ($py)"

step "NVRx $NVRX_VERSION"
# install-nvrx.sh says why NVRx needs its own step on Python < 3.12.
bash "$context/install-nvrx.sh" "$py" "$NVRX_VERSION" "$keep"

step "py-spy $PY_SPY_VERSION"
# Each rank's guard samples its workload's stack with it (a hang names its node).
"${pip[@]}" -c "$keep" "py-spy==$PY_SPY_VERSION"

step "nvrx-appliance $APPLIANCE_VERSION (in-container side)"
wheels=("$context"/wheels/nvrx_appliance-*.whl)
[ -f "${wheels[0]}" ] || fail "no nvrx_appliance wheel in $context/wheels"
"${pip[@]}" -c "$keep" "${wheels[@]}"

if [ "$IMAGE_FLAVOR" = gpu ]; then
  step "Megatron: megatron-core $MEGATRON_CORE_VERSION and Megatron-LM $MEGATRON_COMMIT ($MEGATRON_TAG)"
  bash "$context/install-megatron.sh" "$py" "$MEGATRON_CORE_VERSION" "$MEGATRON_REPOSITORY" \
    "$MEGATRON_COMMIT" "$MEGATRON_PATH" "$keep"
else
  # The venv's commands where every runtime looks, whatever PATH the job brings.
  for command in nvrx-entrypoint ft_launcher; do
    ln -sf "/opt/nvrx-appliance/venv/bin/$command" "/usr/local/bin/$command"
  done
fi

# Mount points for the host's name resolution, which runtimes bind over them; an image
# started read-only cannot grow them at start.
for file in /etc/hosts /etc/resolv.conf; do
  [ -e "$file" ] || : >"$file"
done

step "manifest $IMAGE_MANIFEST"
"$py" -m nvrx_appliance.image.image_manifest --settings "$context/build.env" --out "$IMAGE_MANIFEST"
[ -n "${PIP_CACHE_DIR:-}" ] || rm -rf /root/.cache/pip
step "done"
