#!/usr/bin/env bash
# Makes .venv with serve-tuner and exactly the locked versions of everything it needs (requirements/*.txt,
# every file's hash checked), reinstalling only when the lock or pyproject.toml changed.
# Usage: ./scripts/bootstrap.sh [dev|fleet|dashboard] (dev: with the test and lint tools, and fleet's and
# dashboard's packages), or sourced by demo.sh and test.sh. The lock moves only by scripts/lock.sh.
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
lock_name=${1:-base}
case "$lock_name" in
  base | dev | fleet | dashboard) ;;
  *)
    echo "error: no lock named '$lock_name'; give one of dev, fleet, dashboard, or nothing for the base install" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
stamp_of() { echo "$1-$(cat pyproject.toml "requirements/$1.txt" | sha256sum | cut -c1-16)"; }
stamp_want="$(stamp_of "$lock_name")"
stamp_have="$(cat .venv/.serve-tuner-stamp 2>/dev/null || true)"
# dev's lock holds every other lock's pins (scripts/lock.sh resolves them from it): an install of dev
# serves the demo, a fleet host and the dashboard as it is.
held="$lock_name"
[ "$stamp_have" = "$(stamp_of dev)" ] && stamp_want="$stamp_have" && held=dev
install=""
if [ ! -x .venv/bin/python ] || [ "$stamp_have" != "$stamp_want" ]; then
  install="installing serve-tuner and requirements/$lock_name.txt into .venv ..."
elif ! differences=$(.venv/bin/python scripts/check_lock.py --quiet "requirements/$held.txt" 2>&1); then
  # Something changed .venv behind the lock's back (a `pip install` by hand): the tests would run on it.
  echo "$differences" >&2
  install="installing requirements/$lock_name.txt into .venv again: it is no longer the lock (above) ..."
fi
if [ -n "$install" ]; then
  echo "$install"
  # A new environment each time: what an earlier install left (a package the lock dropped, a newer
  # version) would otherwise stay, and the tests would run on something CI never installs.
  "$python" -m venv --clear .venv || { echo "error: cannot create a virtual environment; install python3-venv" >&2; return 1 2>/dev/null || exit 1; }
  install_log=$(mktemp)
  # --no-deps: the lock is complete, so pip resolves nothing and fetches only what it names, each file
  # checked against its hash. serve-tuner itself goes in with the locked setuptools (no build isolation,
  # which would fetch an unlocked one).
  if ! { .venv/bin/python -m pip install --disable-pip-version-check --require-hashes --no-deps -r "requirements/$lock_name.txt" \
    && .venv/bin/python -m pip install --disable-pip-version-check --no-deps --no-build-isolation -e . \
    && .venv/bin/python -m pip check; } >"$install_log" 2>&1; then
    grep -v '^WARNING: Location' "$install_log" | tail -n 20 >&2
    rm -f "$install_log" .venv/.serve-tuner-stamp
    echo "error: installing requirements/$lock_name.txt into .venv failed (above); .venv is incomplete until ./scripts/bootstrap.sh $lock_name runs again once the cause is fixed" >&2
    return 1 2>/dev/null || exit 1
  fi
  rm -f "$install_log"
  .venv/bin/python scripts/check_lock.py "requirements/$lock_name.txt" || { return 1 2>/dev/null || exit 1; }
  echo "$stamp_want" > .venv/.serve-tuner-stamp
fi
