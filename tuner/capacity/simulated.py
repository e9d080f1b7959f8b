"""A sweep on the simulated llama-server's own clock: each config's server made from its launch as a trial's
is (`SimulatedTrialRunner`), the closed-loop users replayed virtually with the same warm-up, window and drain
as on a real server (`closed_loop.py`). A sweep of the demo's size takes seconds, so the capacity's
dependence on the settings (slots, batch sizes) and on a calibration can be predicted and tested."""

from __future__ import annotations

from tuner.capacity.closed_loop import LevelRun
from tuner.capacity.record import SweptConfig
from tuner.capacity.shapes import CapacityRequests
from tuner.models import ReplayRequest
from tuner.sim.inputs import CostModel, NoiseModel
from tuner.sim.runner import SimulatedTrialRunner
from tuner.sim.virtual import replay_virtual
from tuner.trial_runner import PreparedStudy

__all__ = ["SimulatedCapacityTarget"]


class SimulatedCapacityTarget:
    def __init__(
        self, prepared: PreparedStudy, *, seed: int, cost: CostModel | None = None, noise: NoiseModel | None = None
    ) -> None:
        self._prepared = prepared
        self._runner = SimulatedTrialRunner(prepared, seed=seed, cost=cost, noise=noise)

    async def start(self, config: SweptConfig, *, round_: int) -> None:
        engine = self._prepared.engine
        server = {k: v for k, v in config.settings.items() if engine.knobs[k].scope == "server"}
        await self._runner.start(server, number=config.trial or 0, log_path="")

    async def run_level(self, users: int, requests: CapacityRequests, *, warm_up_s: float, window_s: float) -> LevelRun:
        started = self._runner.started
        answered: set[str] = set()
        in_flight: dict[str, float] = {}  # session -> when its request was sent (the replay's clock)
        window: list[float] = []

        def next_turn(session: str, ended_s: float) -> ReplayRequest | None:
            in_flight.pop(session, None)
            answered.add(session)
            if not window and len(answered) == users:
                window.extend((max(ended_s, warm_up_s), max(ended_s, warm_up_s) + window_s))
            # Past the window, the load goes on only while a request sent before its end has not ended.
            measuring = window and any(sent < window[1] for sent in in_flight.values())
            if window and ended_s >= window[1] and not measuring:
                return None
            in_flight[session] = ended_s
            return requests.next_for(int(session.removeprefix("user")))

        first = [requests.next_for(user) for user in range(users)]
        for request in first:
            in_flight[request.session] = 0.0
        done = replay_virtual(
            first,
            started.server,
            engine=self._prepared.engine,
            start_s=started.clock_s,
            request_timeout_s=self._prepared.spec.workload.request_timeout_s,
            next_turn=next_turn,
        )
        elapsed_s = done.ended_s - started.clock_s
        started.clock_s = done.ended_s + 1.0
        assert window, "every user's first request ends"
        return LevelRun(records=done.records, window=(window[0], window[1]), elapsed_s=elapsed_s)
