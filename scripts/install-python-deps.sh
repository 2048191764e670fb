#!/usr/bin/env bash
# The project's virtual environment: this package (editable), its test tools, CPU
# PyTorch, and the real NVRx 0.7.0.
#
# NVRx goes in through the same script the appliance image uses
# (nvrx_appliance/image/install-nvrx.sh), which says why it needs its own step on
# Python < 3.12. Only its compiled straggler module (nvrx_cupti_module) stays unusable
# on such a host; nothing of ours needs it.
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}   # pinned: an unpinned torch pulls a multi-GB CUDA build
NVRX_VERSION=0.7.0
stamp="$VENV/.deps-$NVRX_VERSION-torch-$TORCH_VERSION"

if [ -f "$stamp" ] && "$VENV/bin/python" -c 'import nvrx_appliance, torch, nvidia_resiliency_ext' 2>/dev/null; then
  echo "install-python-deps: $VENV is up to date"
  exit 0
fi

echo "install-python-deps: creating $VENV"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)

echo "install-python-deps: torch==$TORCH_VERSION (CPU build)"
"${pip[@]}" install "torch==$TORCH_VERSION"

echo "install-python-deps: nvidia-resiliency-ext==$NVRX_VERSION"
keep=$(mktemp)
trap 'rm -f "$keep"' EXIT
echo "torch==$TORCH_VERSION" >"$keep"
bash nvrx_appliance/image/install-nvrx.sh "$(cd "$VENV" && pwd)/bin/python" "$NVRX_VERSION" "$keep"

echo "install-python-deps: nvrx-appliance (editable) and test tools"
"${pip[@]}" install -e '.[dev]'

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
v = md.version("nvidia-resiliency-ext")
assert v == "0.7.0", f"expected NVRx 0.7.0, found {v}"
import nvidia_resiliency_ext.fault_tolerance  # noqa: F401  (imports cleanly on this Python)
print(f"install-python-deps: NVRx {v}, torch {md.version('torch')}")
PY
touch "$stamp"
