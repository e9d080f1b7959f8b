#!/usr/bin/env bash
# Drift: what the newest releases pyproject.toml's ranges allow would do to serve-tuner, seen before they
# are locked. Installs them into a scratch environment (.venv-drift, never .venv), names each package
# newer than the lock, shows the warnings they raise as serve-tuner imports them (which `tuner` commands
# hide from the operator, and a maintainer should read), and runs the fast tier on them.
#
#   scripts/drift.sh                  # then, if it passes: scripts/lock.sh --upgrade && ./scripts/test.sh
#
# Not part of CI: its outcome follows the registry's releases of the day, not this repository. Run it
# before moving the lock, and now and then (weekly) to hear of a breaking release before a fresh
# install would; docs/testing.md, "The lock".
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
echo "installing the newest releases pyproject.toml allows (with the dev extra) into .venv-drift ..."
"$python" -m venv --clear .venv-drift
install_log=$(mktemp)
trap 'rm -f "$install_log"' EXIT
if ! .venv-drift/bin/python -m pip install --disable-pip-version-check --upgrade --upgrade-strategy eager \
  -r requirements/build.in -e ".[dev]" \
  >"$install_log" 2>&1; then
  tail -n 20 "$install_log" >&2
  echo "error: the newest releases do not install together (above): the ranges in pyproject.toml need a look" >&2
  exit 1
fi
.venv-drift/bin/python -m pip check
echo
echo "newer than the lock (requirements/dev.txt):"
.venv-drift/bin/python scripts/check_lock.py requirements/dev.txt 2>&1 | sed -n 's/^  /  /p' || true
echo
echo "warnings the newest releases raise as serve-tuner's modules import them (hidden from the operator):"
.venv-drift/bin/python -W default -c '
import importlib
for module in ("tuner.transports.ssh", "tuner.search", "tuner.report", "tuner.metrics", "tuner.workloads"):
    importlib.import_module(module)
' 2>&1 | sed 's/^/  /' || true
echo
echo "the fast tier on the newest releases:"
# The one fast test that holds the environment to the lock is left out: this one is not the lock on purpose.
exec .venv-drift/bin/python -m pytest tests/fast -n 4 -p no:cacheprovider -q \
  --deselect tests/fast/test_lock.py::test_this_environment_holds_exactly_the_dev_lock "$@"
