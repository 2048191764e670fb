#!/usr/bin/env bash
# Install NVRx into one Python: install-nvrx.sh PYTHON VERSION [CONSTRAINTS_FILE]
# Shared by the image's install script and the host's scripts/install-python-deps.sh,
# so the host venv and the image get NVRx the same way.
#
# NVRx 0.7.0 publishes cp312 / manylinux_2_39 wheels only, so on an older Python pip
# silently falls back to 0.4.1, which lacks cycle-info files, --ft-segment, the
# checkpoint-iteration tracker and exit 93. Its fault_tolerance package is pure Python:
# fetch the wheel for its own tag, lay it into site-packages without dependencies, then
# install the dependencies its metadata declares. The constraints file keeps whatever
# PyTorch the Python already has (a dependency range must never swap it for another
# multi-GB build).
set -euo pipefail

py=$1
version=$2
constraints=${3:-}
pip=("$py" -m pip install --progress-bar off --disable-pip-version-check)
[ -n "$constraints" ] && pip+=(-c "$constraints")

if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
  "${pip[@]}" "nvidia-resiliency-ext==$version"
  exit 0
fi

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
"${pip[@]}" --no-deps --target "$staging" --python-version 3.12 --implementation cp \
  --platform "manylinux_2_39_$(uname -m)" --only-binary=:all: \
  "nvidia-resiliency-ext==$version"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
bin=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])')
rm -rf "$site"/nvidia_resiliency_ext "$site"/nvidia_resiliency_ext-*.dist-info
cp -r "$staging"/nvidia_resiliency_ext "$staging"/nvidia_resiliency_ext-*.dist-info "$site"/
# Console scripts were written for the staging pip's interpreter: point them at $py.
for script in "$staging"/bin/*; do
  sed "1s|^#!.*|#!$py|" "$script" >"$bin/$(basename "$script")"
  chmod 755 "$bin/$(basename "$script")"
done
mapfile -t requirements < <("$py" - "$staging" <<'PY'
import pathlib
import sys
from email.parser import Parser

metadata = next(pathlib.Path(sys.argv[1]).glob("nvidia_resiliency_ext-*.dist-info/METADATA"))
for requirement in Parser().parsestr(metadata.read_text()).get_all("Requires-Dist") or []:
    if "extra ==" not in requirement:
        print(requirement)
PY
)
"${pip[@]}" "${requirements[@]}"
