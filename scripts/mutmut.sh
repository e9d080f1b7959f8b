#!/usr/bin/env bash
# Mutation testing of the pure modules (tuner/scoring.py, tuner/metrics.py, tuner/config/ and the
# unit-file rendering functions of tuner/deployers/systemd/unit_file.py) with mutmut, then the score per
# module.
#
#   source scripts/bootstrap.sh dev && scripts/mutmut.sh            # a fresh run and the report
#   scripts/mutmut.sh --diffs                                        # the report with each survivor's diff
#
# mutmut copies tuner/ and tests/ into mutants/ (ignored by git) and mutates only that copy; the
# working tree's files are never touched. It runs the fast unit tests named in pyproject.toml's
# [tool.mutmut], never the real-part ones. The copy is made anew on every run: mutmut would otherwise
# reuse a file it copied before, however stale. Afterwards `.venv/bin/mutmut show NAME` prints a mutant
# and `.venv/bin/mutmut browse` walks them. Exit status: that of scripts/mutmut_report.py (0 when every
# module scores at least 85% and no survivor is left unexplained).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/mutmut ]; then
  echo "error: mutmut is not installed in .venv; run: source scripts/bootstrap.sh dev" >&2
  exit 1
fi
rm -rf mutants
mkdir mutants
started=$(date +%s)
echo "mutmut: mutating and testing (log: mutants/mutmut-run.log) ..."
# mutmut redraws a progress line many times a second: keep it in the log, show the last state.
if ! .venv/bin/mutmut run >mutants/mutmut-run.log 2>&1; then
  tail -c 2000 mutants/mutmut-run.log >&2
  echo "error: mutmut run failed (the clean test run or the forced-fail check); see mutants/mutmut-run.log" >&2
  exit 1
fi
took=$(($(date +%s) - started))
echo "mutmut: done in $((took / 60))m$((took % 60))s"
.venv/bin/python scripts/mutmut_report.py "$@"
