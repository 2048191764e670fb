#!/usr/bin/env bash
# The project's virtual environment: this package (editable), its test tools, CPU
# PyTorch, and the real NVRx 0.7.0.
#
# Why NVRx is installed by hand: 0.7.0 publishes cp312 / manylinux_2_39 wheels only,
# so on Python 3.11 / glibc 2.36 (Debian 12) a plain `pip install` silently falls back
# to 0.4.1, which lacks cycle-info files, --ft-segment, the checkpoint-iteration
# tracker and exit code 93. Its fault_tolerance package is pure Python, so we fetch
# the 0.7.0 wheel for its own platform tag, unpack it into the venv's site-packages
# without dependencies, and install those dependencies normally. Only the compiled
# straggler module (nvrx_cupti_module) stays unusable here; nothing of ours needs it.
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

echo "install-python-deps: nvidia-resiliency-ext==$NVRX_VERSION (pure-Python part, see the comment above)"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
"${pip[@]}" install --no-deps --target "$staging" --python-version 3.12 --implementation cp \
  --platform manylinux_2_39_x86_64 --only-binary=:all: "nvidia-resiliency-ext==$NVRX_VERSION"
rm -rf "$site"/nvidia_resiliency_ext "$site"/nvidia_resiliency_ext-*.dist-info
cp -r "$staging"/nvidia_resiliency_ext "$staging"/nvidia_resiliency_ext-*.dist-info "$site"/
# Console scripts were written with the staging pip's interpreter: re-point them at the venv.
for script in "$staging"/bin/*; do
  name=$(basename "$script")
  sed "1s|^#!.*|#!$(cd "$VENV" && pwd)/bin/python|" "$script" > "$VENV/bin/$name"
  chmod +x "$VENV/bin/$name"
done
"${pip[@]}" install defusedxml fastapi grpcio grpcio-tools httpx numpy nvidia-ml-py packaging \
  protobuf psutil pydantic pydantic-settings pyyaml slowapi 'uvicorn[standard]'

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
