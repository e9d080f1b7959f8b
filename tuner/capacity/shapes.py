"""What a capacity sweep's users ask: the study's own requests, or seed 004's document summaries.

Users take the shape's requests in turn (user u's k-th request is the lap's request k * users + u), each
with prompts of its own: a level, a round and a lap of the shape each get fresh tokens, so that no request
is served from another's cache beyond what the shape itself shares (its shared prefixes, the summaries'
system prompt), as in production.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from tuner.config import ParamValue
from tuner.engines.base import Engine
from tuner.models import ReplayRequest
from tuner.trial_runner import PreparedStudy
from tuner.workloads import Trace
from tuner.workloads.synthesis import synthesize_sessions, thin_sessions
from tuner.workloads.synthetic import SynthOptions, synthesize_trace

__all__ = ["CapacityRequests", "shape_trace"]

# A lap of the shape: the study's workload thinned to about this many requests, or this many summaries.
_LAP_REQUESTS = 2048
# Seed 004 asked for at most 256 tokens and the answers averaged 129 to 150; a replayed request asks for an
# exact count, so a summary asks for their middle.
SUMMARY_OUTPUT_TOKENS = 140
# Far from the study's rounds (1, 2, ...), the confirmation's and `tuner apply`'s verification run.
_PROMPTS_BASE = 3_000_000_000


def shape_trace(prepared: PreparedStudy, shape: str) -> Trace:
    """The requests one lap of the shape holds, in the order users take them."""
    if shape == "summary":
        options = SynthOptions(users=_LAP_REQUESTS, turns=1, seed=prepared.spec.workload.seed, long_tokens=0)
        return synthesize_trace("summarize", options)
    trace = prepared.trace
    if len(trace) > _LAP_REQUESTS:
        trace = thin_sessions(trace, keep=_LAP_REQUESTS / len(trace), seed=prepared.spec.workload.seed)
    return trace.in_arrival_order()


class CapacityRequests:
    """The requests of one level's round: `next_for(user)` is that user's next request."""

    def __init__(
        self,
        prepared: PreparedStudy,
        trace: Trace,
        settings: Mapping[str, ParamValue],
        *,
        users: int,
        round_: int,
        output_tokens: int | None = None,
    ) -> None:
        self._prepared, self._engine, self._trace = prepared, prepared.engine, trace
        self._settings, self._users, self._round, self._output_tokens = settings, users, round_, output_tokens
        self._laps: OrderedDict[int, _Lap] = OrderedDict()
        # Users take a lap's requests side by side: at its end some are in the next lap while others finish
        # this one, and more users than the lap holds span several laps at once. Those are all kept.
        self._laps_kept = users // len(trace) + 2
        self._taken = [0] * users

    def next_for(self, user: int) -> ReplayRequest:
        index = self._taken[user] * self._users + user
        self._taken[user] += 1
        lap, at = divmod(index, len(self._trace))
        request = self._lap(lap).request(at)
        return request.model_copy(
            update={
                "request_id": f"{self._users}u-r{self._round}-user{user}-{self._taken[user]}",
                "session": f"user{user}",
                "turn": self._taken[user],
                "offset_s": 0.0,
                "think_s": 0.0,
                "answer_spans": (),  # a user's requests are its own conversation's only in the study's replay
                **({} if self._output_tokens is None else {"output_tokens": self._output_tokens}),
            }
        )

    def _lap(self, lap: int) -> _Lap:
        made = self._laps.get(lap)
        if made is not None:
            self._laps.move_to_end(lap)
            return made
        made = self._laps[lap] = _Lap(
            self._trace,
            self._engine,
            self._settings,
            seed=self._prepared.spec.workload.seed,
            round_index=_PROMPTS_BASE + (self._round * 10_000 + self._users) * 1_000 + lap,
        )
        if len(self._laps) > self._laps_kept:
            self._laps.popitem(last=False)
        return made


class _Lap:
    """One lap of the shape's requests with their prompts, made a session at a time as users reach them:
    a level that asks for ten requests makes about ten, not the lap's 2,048 (about 0.6 s of the controller's
    CPU on the cores the server measures)."""

    def __init__(
        self, trace: Trace, engine: Engine, settings: Mapping[str, ParamValue], *, seed: int, round_index: int
    ) -> None:
        self._trace, self._engine, self._settings = trace, engine, settings
        self._sessions = synthesize_sessions(
            trace, token_range=engine.prompt_token_range(), seed=seed, round_index=round_index
        )
        self._lora_mix = trace.lora_mix()
        self._made: dict[str, ReplayRequest] = {}

    def request(self, at: int) -> ReplayRequest:
        """The lap's request `at` (in the trace's order), its session made if it was not yet."""
        wanted = self._trace.ids[at]
        while wanted not in self._made:
            session = next(self._sessions)  # every request's session comes, by the first of its turns
            # Request-scope knobs (a LoRA policy) as a trial with these settings sends them.
            for request in self._engine.apply_request_settings(session, self._settings, lora_mix=self._lora_mix):
                self._made[request.request_id] = request
        return self._made[wanted]
