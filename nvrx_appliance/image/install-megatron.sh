#!/usr/bin/env bash
# Megatron, both halves of one release (pins.toml says why both):
#   install-megatron.sh PYTHON CORE_VERSION REPOSITORY COMMIT PATH CONSTRAINTS
# 1. the megatron-core package at CORE_VERSION, into PYTHON's environment, with the
#    image's PyTorch held by CONSTRAINTS (a file of pip constraints);
# 2. the Megatron-LM source at COMMIT, checked out at PATH, for pretrain_gpt.py;
# 3. the check that makes them one release: the checkout's package_info.py must say
#    CORE_VERSION, and the fault injector and pretrain_gpt.py must be there.
# Any failure fails the build. pip reads its usual settings (PIP_INDEX_URL,
# PIP_FIND_LINKS, ...); REPOSITORY may be any git URL, a local mirror included.
set -euo pipefail

if [ "$#" -ne 6 ]; then
  echo "usage: install-megatron.sh PYTHON CORE_VERSION REPOSITORY COMMIT PATH CONSTRAINTS" >&2
  exit 2
fi
py=$1 version=$2 repository=$3 commit=$4 path=$5 constraints=$6

fail() { printf 'install-megatron: %s\n' "$*" >&2; exit 1; }

"$py" -m pip install --progress-bar off -c "$constraints" "megatron-core==$version"
installed=$("$py" -c 'import importlib.metadata as md; print(md.version("megatron-core"))')
[ "$installed" = "$version" ] \
  || fail "pip installed megatron-core $installed, not the pinned $version"

rm -rf "$path"
mkdir -p "$path"
git -C "$path" init -q
# A commit, not a branch or tag: what the build fetches cannot move under it.
git -C "$path" fetch -q --depth 1 "$repository" "$commit" \
  || fail "cannot fetch Megatron-LM commit $commit from $repository"
git -C "$path" checkout -q --detach FETCH_HEAD
[ "$(git -C "$path" rev-parse HEAD)" = "$commit" ] \
  || fail "Megatron-LM checkout is not at $commit"
[ -f "$path/pretrain_gpt.py" ] \
  || fail "Megatron-LM $commit has no pretrain_gpt.py; pin another commit in pins.toml"
[ -f "$path/megatron/core/fault_injector.py" ] \
  || fail "Megatron-LM $commit lacks the fault injector (--fault-injector-* flags); pin a later release in pins.toml"

# package_info.py names the release in MAJOR/MINOR/PATCH/PRE_RELEASE assignments; read
# them as text, since importing it runs git.
source_version=$("$py" - "$path/megatron/core/package_info.py" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
parts = {}
for name in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE"):
    found = re.search(rf"^{name}\s*=\s*['\"]?([^'\"\s#]*)['\"]?", text, re.M)
    parts[name] = found.group(1) if found else "?"
print(f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts['PRE_RELEASE']}")
PY
)
[ "$source_version" = "$version" ] \
  || fail "Megatron-LM $commit is release $source_version, but megatron-core is pinned at $version; pin the commit of release $version in pins.toml"
echo "install-megatron: megatron-core $version and Megatron-LM $commit agree"
