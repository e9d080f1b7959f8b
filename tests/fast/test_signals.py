"""P2's signal half: Ctrl-C or SIGTERM cancels a host command, its clean-up (the restore) runs to the
end however many more signals arrive and whenever they arrive, and the exit code is 130 or 143.

The child below is `tuner`'s own signal handling (`_stop_on_signals`, `_raise_if_stopped` and `main`'s
exit codes) around a task whose clean-up takes a while, as a restore does; the parent sends signals
for the whole life of the child, from before the loop starts until after it closed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    from tuner.cli import EXIT_INTERRUPTED, EXIT_TERMINATED, signals

    # A thread still alive at exit, as a library may leave one: the signals the main thread blocks at the
    # end still reach the process through it, up to the last moment of Python's shutdown.
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    received = []

    async def command():
        signals.stop_on_signals(received)
        print("running", flush=True)
        try:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                # A library that absorbs a cancellation (anyio's shielded clean-up of a response does):
                # the job must be cancelled again, or it would run on for its whole length.
                asyncio.current_task().uncancel()
            await asyncio.sleep(60)
        finally:
            # The restore: several awaits, each a point where a cancellation could cut it short.
            for _ in range(20):
                await asyncio.sleep(0.01)
            print("restored", flush=True)

    def run():
        try:
            asyncio.run(command())
        except asyncio.CancelledError:
            signals.raise_if_stopped(received)
            raise
        signals.raise_if_stopped(received)
        return 0

    def main():  # as cli.main: the exit codes of a stop
        try:
            return run()
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except asyncio.CancelledError:
            return EXIT_TERMINATED

    code = main()
    signals.hold_late_signals()  # as cli.entry
    print(f"exit {code}", flush=True)
    sys.exit(code)
    """
)


@pytest.mark.parametrize(("sig", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("gap_s", [0.0, 0.003, 0.02])
def test_signals_at_any_moment_never_cut_the_restore_short_and_exit_with_their_code(
    sig: signal.Signals, exit_code: int, gap_s: float
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "running"
        sent = 0
        deadline = time.monotonic() + 30  # a generous bound: the child needs well under a second
        while child.poll() is None and time.monotonic() < deadline:
            child.send_signal(sig)  # before, during and after the clean-up, and as the loop closes
            sent += 1
            if gap_s:
                time.sleep(gap_s)
        out, err = child.communicate(timeout=30)
    assert sent > 1
    assert child.returncode == exit_code, err[-2000:]
    assert out.split() == ["restored", "exit", str(exit_code)], (out, err[-2000:])
    # Under this bombardment CPython may write one "Signal N ignored due to race condition" (a signal it
    # noted just as its handler became SIG_IGN) as an unraisable error; nothing else may appear.
    unraisable = [block for block in err.split("Exception ignored") if "ignored due to race condition" not in block]
    assert "Traceback" not in "".join(unraisable), err[-2000:]


def test_main_called_in_process_leaves_the_callers_signal_handlers_as_they_were(tmp_path: Path) -> None:
    """Tests (and any program) may call `tuner.cli.main` in-process: its handlers must not outlive it,
    or a later child process would inherit an ignored SIGTERM. The run gets as far as its event loop
    (whose handlers it sets), then fails its baseline: /bin/false cannot start."""
    from tuner import cli

    def mine(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    study = Path(__file__).resolve().parents[1] / "data" / "tiny-study.toml"
    run = ["run", str(study), "--runs-dir", str(tmp_path), "--set", 'engine.binary="/bin/false"']
    run += ["--set", 'deploy.kind="process"', "--set", "deploy.start_timeout_s=5"]
    # SIGINT as the caller has it: Python's default, unless a test before this one in the worker left it otherwise.
    caller_sigint = signal.getsignal(signal.SIGINT)
    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli.main(run) == 1
        assert cli.main(["kinds"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is caller_sigint
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_signal_after_the_loop_closed_is_still_recorded_not_the_default_kill() -> None:
    """The moment the bombardment above reaches only sometimes (a signal as the loop closes), made certain:
    asyncio puts the default action back for its own signal handlers when its loop closes, so ours must
    not be the loop's. A SIGTERM after the loop is recorded for `raise_if_stopped`, not a kill."""
    import asyncio

    from tuner.cli import signals

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    received: list[int] = []

    async def command() -> None:
        signals.stop_on_signals(received)

    try:
        asyncio.run(command())
        handler = signal.getsignal(signal.SIGTERM)
        # Checked before the signal is raised: the default action would end this test's process.
        assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), handler
        signal.raise_signal(signal.SIGTERM)
        assert received == [signal.SIGTERM]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
