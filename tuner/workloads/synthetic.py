"""Synthetic traces for the traffic shapes of the source articles, written in the trace format.

Closed loop needs no mode of its own: a session whose turns all have offset 0 and no think time is a
user who sends the next request as soon as the previous answer ends.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError
from tuner.registry import Registry
from tuner.workloads.trace import Trace
from tuner.workloads.trace_format import (
    TRACE_FORMAT,
    TRACE_VERSION,
    PrefixBlock,
    PromptShape,
    TraceHeader,
    TraceRequest,
)

__all__ = ["GENERATORS", "SynthOptions", "check_synthesis_fits", "synthesis_requests", "synthesize_trace"]

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


# Measured peak per request while a trace is generated, written and summarized: about 2.7 KB (the model,
# its JSON line, the summary's arrays); 4 KiB leaves room for the interpreter's own growth.
_BYTES_PER_REQUEST = 4096


def synthesis_requests(kind: str, options: SynthOptions) -> int:
    """How many requests `synthesize_trace` writes for these options, without generating them."""
    GENERATORS.get(kind)  # an unknown kind is named here too
    extra = max(1, options.users // 2) if kind == "stall" else 0  # the long prompts among the chats
    return options.users * options.turns + extra


def _available_memory() -> int | None:
    """Bytes this machine can give without swapping (MemAvailable), or None where it cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _gib(size: float) -> str:
    return f"{size / 2**30:,.1f} GiB" if size >= 2**30 else f"{size / 2**20:,.0f} MiB"


def check_synthesis_fits(kind: str, options: SynthOptions, *, available: int | None = None) -> None:
    """Refuses, before anything is generated, a trace that would not fit in this machine's free memory."""
    requests = synthesis_requests(kind, options)
    need = requests * _BYTES_PER_REQUEST
    free = available if available is not None else _available_memory()
    if free is not None and need > free:
        raise ConfigError(
            f"workload synth {kind}: {options.users:,} users x {options.turns:,} turns is {requests:,} requests, "
            f"which need about {_gib(need)} of memory and {_gib(free)} is free; pass fewer --users or --turns"
        )
