#!/usr/bin/env bash
# The login-node install, as a user would do it: the wheel from `make dist` goes into a
# clean venv of the system Python, owned by a user who is not root, and `submit
# --dry-run` renders a chain from it. Run as root, it uses a throwaway user (created
# here, removed again); run as anyone else, it runs as that user.
#
#   bash scripts/check-wheel.sh DIST_DIR
set -euo pipefail

dist=$(cd "${1:?usage: check-wheel.sh DIST_DIR}" && pwd)
wheel=$(ls "$dist"/nvrx_appliance-*.whl)
PYTHON=${PYTHON:-/usr/bin/python3}   # a login node's Python, not a developer's
CHECK_USER=${CHECK_USER:-nvrx-wheel-check}

check() {
  # Runs as the checking user, in a directory of its own.
  set -euo pipefail
  local home=$1 wheel=$2 python=$3
  "$python" -m venv "$home/venv"
  "$home/venv/bin/python" -m pip install --quiet "$wheel"
  # The host tool needs only its host dependencies: no spython, no torch.
  if "$home/venv/bin/python" -c 'import spython' 2>/dev/null; then
    echo "check-wheel: spython was installed without the apptainer extra" >&2
    exit 1
  fi
  "$home/venv/bin/nvrx-appliance" --version
  # The alert rules come with the wheel, found where it installed them.
  local rules
  rules=$("$home/venv/bin/nvrx-watch" --alert-rules)
  if [[ $rules != "$home/venv/"* ]] || ! grep -q -- '- alert: NvrxChainStopped' "$rules"; then
    echo "check-wheel: nvrx-watch --alert-rules names no rules file in the venv: $rules" >&2
    exit 1
  fi
  # The work dir must not be node-local (/tmp is refused): the check lives in a home.
  "$home/venv/bin/nvrx-appliance" submit --dry-run --work-dir "$home/run" --workload cpu \
    --train-tasks 2 --hot-spares 1 --gpus-per-node 8 --depth 2 >"$home/dry-run.txt"
  grep -q '^sbatch ' "$home/dry-run.txt"
  grep -q 'nvrx-entrypoint' "$home/dry-run.txt"
  echo "check-wheel: $(basename "$wheel") installs, renders a chain and has its alert rules ($rules) as $(id -un)"
}

if [ "$(id -u)" -ne 0 ]; then
  home=$(mktemp -d -p "$HOME" nvrx-wheel-check.XXXXXX)
  trap 'rm -rf "$home"' EXIT
  check "$home" "$wheel" "$PYTHON"
  exit 0
fi

created=""
if ! id "$CHECK_USER" >/dev/null 2>&1; then
  useradd --system --create-home --shell /bin/bash "$CHECK_USER"
  created=1
fi
home=$(runuser -u "$CHECK_USER" -- bash -c 'mktemp -d -p ~ nvrx-wheel-check.XXXXXX')
copy="$home/$(basename "$wheel")"
cleanup() {
  rm -rf "$home"
  if [ -n "$created" ]; then userdel --remove "$CHECK_USER" 2>/dev/null || true; fi
}
trap cleanup EXIT
# The user reads the wheel from its own directory: root's checkout may be closed to it.
install -o "$CHECK_USER" -m 0644 "$wheel" "$copy"
runuser -u "$CHECK_USER" -- bash -c "cd '$home' && $(declare -f check); check '$home' '$copy' '$PYTHON'"
