#!/usr/bin/env bash
# The whole test suite on a fresh machine: lint, format, types, tests. `.ci/run` calls exactly this.
# The first run builds llama-server (about 10 minutes on 2 cores) and Ollama (from its Go module: Go 1.24+).
# A test whose real part is missing (a build, sshd, sudo, the systemd host, chromium) fails naming it under
# CI=true, and elsewhere skips, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh dev
if ! setup_error=$(.venv/bin/tuner setup --ollama 2>&1); then
  echo "$setup_error" >&2
  export SERVE_TUNER_SETUP_ERROR="$(printf '%s\n' "$setup_error" | tail -n 1)"
fi
# The ssh transport is tested against a real sshd on loopback, the systemd deployer's unprivileged
# login through sudo, the morning report in a headless chromium and the fleet on a real PostgreSQL;
# install them where this user may.
missing=""
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
[ -x /usr/bin/sudo ] || missing="$missing sudo"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
# The fleet tests start a real PostgreSQL (initdb in a temporary directory) for Optuna's shared storage.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
# The container deployer's tests run llama-server and Ollama in podman containers, as root, on runc (Debian's
# default crun refuses some cgroup layouts; tests/support/containers.py selects runc).
command -v podman >/dev/null 2>&1 || missing="$missing podman"
[ -x /usr/sbin/runc ] || missing="$missing runc"
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing$missing for the ssh, systemd, browser, fleet and container tests ..."
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null 2>&1; }; } \
    || echo "warning: could not install$missing; the tests that need them fail under CI=true and skip elsewhere, saying why" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -gt 0 ]; then
  .venv/bin/mypy
  exec .venv/bin/pytest "$@"
fi
# Two phases, each listing its slowest tests (where CI's minutes go, read from the run itself). The tier
# is the directory (tests/conftest.py): tests/fast needs no real part, tests/real does.
# 1. Every test that asserts no measured figure. The tests on the systemd host run in a process of their
#    own (one host, its tests in order), beside the others in two workers; many of them wait on a
#    restart, a timer or a subprocess rather than the CPU. mypy (about 40 s of one core) runs beside them
#    as well. Their outputs, mypy's first, follow the others'.
#    The three run as jobs (`set -m`), each in a process group of its own with SIGINT as usual: Ctrl-C
#    reaches the script alone, and its traps pass it on to each, whose teardown stops its host and
#    servers. (Without job control bash starts them ignoring SIGINT, and Ctrl-C left them running.)
host_log=$(mktemp)
types_log=$(mktemp)
jobs_beside=()
stop_jobs() {
  for job in "${jobs_beside[@]}"; do kill -INT -- "-$job" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$types_log" "$host_log"
}
trap stop_jobs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
set -m
.venv/bin/mypy >"$types_log" 2>&1 &
types_check=$!
jobs_beside+=("$types_check")
.venv/bin/pytest tests/real -m "on_systemd_host and not measures" -p no:xdist --durations=15 >"$host_log" 2>&1 &
host_tests=$!
jobs_beside+=("$host_tests")
.venv/bin/pytest tests/fast tests/real -m "not on_systemd_host and not measures" -n 2 --durations=25 &
other_tests=$!
jobs_beside+=("$other_tests")
set +m
status=0
wait "$other_tests" || status=$?
wait "$types_check" || status=$?
wait "$host_tests" || status=$?
jobs_beside=()
cat "$types_log" "$host_log"
trap - EXIT INT TERM
rm -f "$types_log" "$host_log"
[ "$status" = 0 ] || exit "$status"
# 2. The real tests that assert a measured figure or verdict (marked `measures`), in one process: their
#    measurements share the machine with nothing else.
exec .venv/bin/pytest tests/real -m measures -p no:xdist --durations=15
