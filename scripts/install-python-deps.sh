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
# The pinned megatron-core, read from the image's pins: unpacked beside the venv (never
# on its path; its wheels are cp312) for the tests that run Megatron's own argument
# parser on the argvs the appliance builds.
MEGATRON_CORE_VERSION=$("$PYTHON" - <<'PY'
import tomllib
with open("nvrx_appliance/image/pins.toml", "rb") as fh:
    print(tomllib.load(fh)["megatron"]["core_version"])
PY
)
MEGATRON_CORE_DIR="$VENV/megatron-core-$MEGATRON_CORE_VERSION"
# py-spy, as the image pins it: each rank's guard samples its stack with it.
PY_SPY_VERSION=$("$PYTHON" - <<'PY'
import tomllib
with open("nvrx_appliance/image/pins.toml", "rb") as fh:
    print(tomllib.load(fh)["stacks"]["py_spy"])
PY
)
stamp="$VENV/.deps-$NVRX_VERSION-torch-$TORCH_VERSION-mcore-$MEGATRON_CORE_VERSION-pyspy-$PY_SPY_VERSION"

# The package's own metadata (console scripts, dependencies) as installed: a checkout
# whose pyproject.toml changed must reinstall it, or a renamed entry point stays stale.
project_stamp="$VENV/.project-$(sha256sum pyproject.toml | cut -c1-16)"

if [ -f "$stamp" ] && "$VENV/bin/python" -c 'import nvrx_appliance, torch, nvidia_resiliency_ext' 2>/dev/null; then
  if [ ! -f "$project_stamp" ]; then
    echo "install-python-deps: pyproject.toml changed: reinstalling nvrx-appliance (editable)"
    "$VENV/bin/python" -m pip --quiet --disable-pip-version-check install -e '.[dev,apptainer]'
    rm -f "$VENV"/.project-*
    touch "$project_stamp"
  fi
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

echo "install-python-deps: py-spy==$PY_SPY_VERSION"
"${pip[@]}" install -c "$keep" "py-spy==$PY_SPY_VERSION"

echo "install-python-deps: nvrx-appliance (editable) and test tools"
"${pip[@]}" install -e '.[dev,apptainer]'

echo "install-python-deps: megatron-core==$MEGATRON_CORE_VERSION (unpacked for the parser tests)"
if [ ! -d "$MEGATRON_CORE_DIR/megatron/training" ]; then
  wheels=$(mktemp -d)
  "${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform "manylinux_2_28_$(uname -m)" -d "$wheels" "megatron-core==$MEGATRON_CORE_VERSION"
  rm -rf "$MEGATRON_CORE_DIR.partial"
  "$VENV/bin/python" -m zipfile -e "$wheels"/megatron_core-*.whl "$MEGATRON_CORE_DIR.partial"
  mv "$MEGATRON_CORE_DIR.partial" "$MEGATRON_CORE_DIR"
  rm -rf "$wheels"
fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
v = md.version("nvidia-resiliency-ext")
assert v == "0.7.0", f"expected NVRx 0.7.0, found {v}"
import nvidia_resiliency_ext.fault_tolerance  # noqa: F401  (imports cleanly on this Python)
print(f"install-python-deps: NVRx {v}, torch {md.version('torch')}")
PY
touch "$stamp"
rm -f "$VENV"/.project-*
touch "$project_stamp"
