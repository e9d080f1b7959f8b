#!/usr/bin/env bash
# Moves the lock forward: requirements/{base,dev,fleet,dashboard}.txt, every package serve-tuner installs
# (direct and indirect) pinned with the hashes of its files, which scripts/bootstrap.sh installs and
# nothing else. The lock moves only here, on purpose, never as a side effect of an install.
#
#   scripts/lock.sh                              # after a change to pyproject.toml: resolve again, every other pin kept
#   scripts/lock.sh --upgrade                    # every package to the newest release the ranges allow
#   scripts/lock.sh --upgrade-package NAME       # one package (repeatable), the rest kept
#
# Then run ./scripts/test.sh and commit the lock with what it ran (docs/testing.md, "The lock").
# scripts/drift.sh shows beforehand what the newest releases would break, without locking them.
#
# The resolver is uv, itself installed from its own lock (requirements/lock-tool.txt) into .venv-lock:
# one universal resolution (every platform, Python 3.11 and later, environment markers kept) in pip's
# requirements format, which pip installs with --require-hashes and no other tool.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
# A package named for --upgrade-package that the lock does not hold is a typo: uv would ignore it.
expect_name=""
for arg in "$@"; do
  name=""
  case "$arg" in
    --upgrade-package=* | -P=*) name=${arg#*=} ;;
    --upgrade-package | -P) expect_name=1 && continue ;;
    *) [ -n "$expect_name" ] && name=$arg ;;
  esac
  expect_name=""
  [ -z "$name" ] && continue
  canonical=$(printf '%s' "$name" | tr 'A-Z_.' 'a-z--')
  if ! grep -q "^$canonical==" requirements/dev.txt; then
    echo "error: --upgrade-package $name: the lock holds no such package; give a name from requirements/dev.txt" >&2
    exit 2
  fi
done
if [ ! -x .venv-lock/bin/uv ] || ! cmp -s requirements/lock-tool.txt .venv-lock/lock-tool.txt; then
  echo "installing the resolver (uv, requirements/lock-tool.txt) into .venv-lock ..."
  "$python" -m venv --clear .venv-lock
  .venv-lock/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
    -r requirements/lock-tool.txt
  cp requirements/lock-tool.txt .venv-lock/lock-tool.txt
fi
uv=.venv-lock/bin/uv
# Where pip is told to look for packages, uv looks too (uv reads no pip.conf); the lock names no index.
index=$(.venv-lock/bin/python -m pip config get global.index-url 2>/dev/null || true)
[ -n "$index" ] && export UV_INDEX_URL="$index"
[ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE="$PIP_CERT"

# Written beside the lock first and moved over it only when every file resolved: a failed resolution
# leaves the lock as it was.
scratch=$(mktemp -d requirements/.lock.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for name in base dev fleet dashboard; do
  [ -f "requirements/$name.txt" ] && cp "requirements/$name.txt" "$scratch/$name.txt"
done
compile() {  # compile NAME [uv options]: requirements/NAME.txt from pyproject.toml and the build backend
  local name=$1
  shift
  "$uv" pip compile pyproject.toml requirements/build.in --universal --python-version 3.11 --generate-hashes \
    --custom-compile-command "scripts/lock.sh" --quiet -o "$scratch/$name.txt" "$@"
}
# dev holds every extra (the test tools, fleet's and dashboard's packages): it is resolved first, and
# the others take its versions, so that the demo, a fleet host and CI run the same release of a package.
compile dev --extra dev "$@"
compile base -c "$scratch/dev.txt"
compile fleet --extra fleet -c "$scratch/dev.txt"
compile dashboard --extra dashboard -c "$scratch/dev.txt"
"$uv" pip compile requirements/lock-tool.in --universal --python-version 3.11 --generate-hashes \
  --custom-compile-command "scripts/lock.sh" --quiet -o "$scratch/lock-tool.txt"
for name in base dev fleet dashboard lock-tool; do
  # uv writes the constraint's temporary path into each pin's "via" note; the lock names dev.txt.
  sed -i "s|$scratch/|requirements/|g" "$scratch/$name.txt"
  if ! cmp -s "$scratch/$name.txt" "requirements/$name.txt"; then
    mv "$scratch/$name.txt" "requirements/$name.txt"
    echo "requirements/$name.txt: changed"
  fi
done
git --no-pager diff --stat -- requirements/ 2>/dev/null || true
echo "lock: $("$python" scripts/check_lock.py --id) (run ./scripts/test.sh, then commit requirements/ with what it ran)"
