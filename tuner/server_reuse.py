"""The restart-or-reuse policy: which server a round runs on, the running one where that measures the same
as a restart, else a restart (docs/architecture.md, "Reusing a running server")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.config import ParamValue
from tuner.engines.base import Engine
from tuner.observers import StudyObserver
from tuner.runs import RunDirectory
from tuner.trial_runner import TrialRunner

__all__ = ["Servers"]


@dataclass(kw_only=True)
class _RunningServer:
    """The server the last start left running: its server settings and the trials it measured a round of."""

    settings: dict[str, ParamValue]
    trials: set[int]


class Servers:
    """Which server a round runs on: the running one where that measures the same as a restart (`deploy`).
    `gate`: the correctness gate is on, so the probes warm a new server that asks them."""

    def __init__(
        self, runner: TrialRunner, engine: Engine, run_dir: RunDirectory, observer: StudyObserver, *, gate: bool
    ) -> None:
        self.runner = runner
        self.engine = engine
        self.run_dir = run_dir
        self.observer = observer
        self.gate = gate
        self.running: _RunningServer | None = None  # None: the next round restarts the server

    def forget(self) -> None:
        """The running server is not reused (it may have died, or a failed step left it in another state)."""
        self.running = None

    async def deploy(
        self, settings: Mapping[str, ParamValue], *, number: int, log_name: str = "server.log", probing: bool = False
    ) -> int:
        """Readies a server for a round of trial `number`: the running one where that measures the same as a
        restart, else a restart; returns the round's prompts variant, 0 on a restarted server, else how many
        rounds the reused one measured before. `probing`: the correctness probes come next, and warm a new
        server as the warm-up would, so it gets none.

        A running server is reused for a round only if its server settings equal the trial's, it has not
        measured a round of this trial yet, and the engine and the runner say every slot was cleared; the
        reasons are in docs/architecture.md.
        """
        engine, log_path = self.engine, str(self.run_dir.trial_dir(number) / log_name)
        server = engine.server_settings(settings)
        running, self.running = self.running, None  # a failed reuse or start leaves nothing to reuse
        if running is not None and running.settings == server and number not in running.trials:
            refusal = engine.reuse_refusal(settings)
            if refusal is None:
                refusal = await self.runner.reuse(settings, number=number, log_path=log_path)
            if refusal is None:
                variant = len(running.trials)
                running.trials.add(number)
                self.running = running
                self.observer.server_reused(number=number)
                return variant
        warm_up = not (probing and self.gate)
        self.observer.server_starting(number=number)
        await self.runner.start(settings, number=number, log_path=log_path, warm_up=warm_up)
        self.running = _RunningServer(settings=server, trials={number})
        return 0
