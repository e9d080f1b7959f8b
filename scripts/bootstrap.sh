#!/usr/bin/env bash
# Makes .venv with serve-tuner installed, reinstalling only when pyproject.toml changed.
# Usage: ./scripts/bootstrap.sh [dev] (dev: with the test and lint tools), or sourced by demo.sh and test.sh.
# A failure returns from a sourced run (a shell that sourced it stays open) and exits an executed one.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || { return 1 2>/dev/null || exit 1; }
python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: $python not found; install Python 3.11 or newer (Debian/Ubuntu: apt-get install python3 python3-venv)" >&2
  return 1 2>/dev/null || exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: serve-tuner needs Python 3.11 or newer, $python is $("$python" -V 2>&1); set PYTHON=python3.11" >&2
  return 1 2>/dev/null || exit 1
fi
extras=${1:-}
project_hash="$(sha256sum pyproject.toml | cut -c1-16)"
stamp_want="$project_hash-${extras:-base}"
stamp_have="$(cat .venv/.serve-tuner-stamp 2>/dev/null || true)"
# An install with the dev extras also serves the demo.
[ -z "$extras" ] && [ "$stamp_have" = "$project_hash-dev" ] && stamp_want="$stamp_have"
if [ ! -x .venv/bin/python ] || [ "$stamp_have" != "$stamp_want" ]; then
  echo "installing serve-tuner into .venv ..."
  "$python" -m venv .venv || { echo "error: cannot create a virtual environment; install python3-venv" >&2; return 1 2>/dev/null || exit 1; }
  target="."
  [ -n "$extras" ] && target=".[$extras]"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$target" 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import tuner' || { echo "error: installing serve-tuner into .venv failed" >&2; return 1 2>/dev/null || exit 1; }
  echo "$stamp_want" > .venv/.serve-tuner-stamp
fi
