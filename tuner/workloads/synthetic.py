"""Synthetic traces for the traffic shapes of the source articles, written in the trace format.

Closed loop needs no mode of its own: a session whose turns all have offset 0 and no think time is a
user who sends the next request as soon as the previous answer ends.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tuner.registry import Registry
from tuner.workloads.trace import (
    TRACE_FORMAT,
    TRACE_VERSION,
    PrefixBlock,
    PromptShape,
    Trace,
    TraceHeader,
    TraceRequest,
)

__all__ = ["GENERATORS", "SynthOptions", "synthesize_trace"]

# 004_*.txt: document summaries are about 640 prompt tokens behind a shared 67-token system prompt.
_SYSTEM = PrefixBlock(block="system", tokens=67)


@dataclass(frozen=True, kw_only=True)
class SynthOptions:
    users: int
    turns: int
    seed: int
    long_tokens: int


Generator = Callable[[SynthOptions, random.Random], list[TraceRequest]]
GENERATORS: Registry[tuple[str, Generator]] = Registry("workload generator")


def _request(
    user: int,
    turn: int,
    *,
    offset: float,
    new: int,
    output: int,
    tag: str,
    think: float = 0.0,
    prefix: bool = True,
    history: int = 0,
) -> TraceRequest:
    return TraceRequest(
        id=f"{tag}-{user}.{turn}",
        offset_s=round(offset, 3),
        session=f"{tag}-{user}",
        turn=turn,
        think_s=round(think, 3),
        prompt=PromptShape(shared_prefix=[_SYSTEM] if prefix else [], history_tokens=history, new_tokens=new),
        output_tokens=output,
        tag=tag,
    )


def _summarize(options: SynthOptions, rng: random.Random) -> list[TraceRequest]:
    return [
        _request(user, turn, offset=0.0, new=rng.randint(576, 704), output=256, tag="summary")
        for user in range(options.users)
        for turn in range(options.turns)
    ]


def _chat_sessions(
    options: SynthOptions,
    rng: random.Random,
    *,
    start_within_s: float,
    new: tuple[int, int],
    output: tuple[int, int],
    think: Callable[[], float],
) -> list[TraceRequest]:
    """One conversation per user, starting at a random time, with `think()` seconds between turns; each
    turn repeats the conversation so far (its history) before the user's new message."""
    requests = []
    for user in range(options.users):
        start = rng.uniform(0.0, start_within_s)
        history = 0
        for turn in range(options.turns):
            request = _request(
                user,
                turn,
                offset=start,
                new=rng.randint(*new),
                output=rng.randint(*output),
                tag="chat",
                think=0.0 if turn == 0 else think(),
                history=history,
            )
            requests.append(request)
            history += request.prompt.new_tokens + request.output_tokens
    return requests


def _chat(options: SynthOptions, rng: random.Random) -> list[TraceRequest]:
    # About one turn every 90 s per user, with about 12 s of it spent generating (roughly 300 tokens).
    return _chat_sessions(
        options, rng, start_within_s=90.0, new=(30, 250), output=(150, 450), think=lambda: rng.expovariate(1 / 78.0)
    )


def _stall(options: SynthOptions, rng: random.Random) -> list[TraceRequest]:
    # Streaming chats with short pauses, and among them resumed conversations and summary turns whose
    # new prompt tokens are many times a chat's: the situation in which other users' streams stall.
    requests = _chat_sessions(
        options, rng, start_within_s=2.0, new=(60, 200), output=(200, 400), think=lambda: rng.uniform(1.0, 4.0)
    )
    span = 8.0 * options.turns
    for index in range(max(1, options.users // 2)):
        requests.append(
            _request(
                index,
                0,
                offset=rng.uniform(2.0, span),
                tag="resume" if index % 2 == 0 else "summary",
                new=rng.randint(options.long_tokens // 2, options.long_tokens),
                output=rng.randint(16, 64),
            )
        )
    return requests


def _agent(options: SynthOptions, rng: random.Random) -> list[TraceRequest]:
    # Agents and batch jobs: no think time, all users at once; each step re-sends the whole context so
    # far with a new tool result appended.
    requests = []
    for user in range(options.users):
        history = 0
        for turn in range(options.turns):
            request = _request(
                user,
                turn,
                offset=0.0,
                new=rng.randint(200, 800),
                output=rng.randint(100, 400),
                tag="agent",
                prefix=False,
                history=history,
            )
            requests.append(request)
            history += request.prompt.new_tokens + request.output_tokens
    return requests


for _kind, _description, _generator in (
    (
        "summarize",
        "closed loop: every user summarizes documents back to back (~640-token prompts, 256 out)",
        _summarize,
    ),
    ("chat", "chat sessions with think time: a turn about every 90 s per user", _chat),
    ("stall", "streaming chats with long resumed or summary prompts arriving among them", _stall),
    ("agent", "agent-like streams: no think time, long tool-result prompts", _agent),
):
    GENERATORS.register(_kind)((_description, _generator))


def synthesize_trace(kind: str, options: SynthOptions) -> Trace:
    description, generator = GENERATORS.get(kind)
    requests = generator(options, random.Random(options.seed))
    header = TraceHeader(
        format=TRACE_FORMAT,
        version=TRACE_VERSION,
        name=f"{kind}-{options.users}u",
        description=f"{description}; {options.users} users, {options.turns} turns each, seed {options.seed}",
    )
    return Trace(header=header, requests=sorted(requests, key=lambda r: (r.offset_s, r.id)))
