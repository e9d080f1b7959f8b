"""Turns trace shapes into concrete prompts: token ids with exact counts and real prefix sharing.

A shared block always yields the same ids (seeded by its block id), so the server's prompt cache sees
the reuse it would see in production; new tokens are seeded by request id and round, so nothing is
reused by accident, not even across rounds.
"""

from __future__ import annotations

import hashlib
import random

from tuner.models import ReplayRequest
from tuner.workloads.trace import Trace

__all__ = ["synthesize_requests"]


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def synthesize_requests(
    trace: Trace,
    *,
    token_range: tuple[int, int],
    seed: int,
    round_index: int,
    time_scale: float = 1.0,
) -> list[ReplayRequest]:
    low, high = token_range
    requests = []
    for shape in trace.requests:
        tokens: list[int] = []
        for block in shape.prompt.shared_prefix:
            block_rng = _rng("block", seed, block.block)
            tokens.extend(block_rng.randrange(low, high) for _ in range(block.tokens))
        new_rng = _rng("new", seed, round_index, shape.id)
        tokens.extend(new_rng.randrange(low, high) for _ in range(shape.prompt.new_tokens))
        requests.append(
            ReplayRequest(
                request_id=shape.id,
                session=shape.session,
                turn=shape.turn,
                offset_s=shape.offset_s * time_scale,
                think_s=shape.think_s * time_scale,
                prompt_token_ids=tuple(tokens),
                output_tokens=shape.output_tokens,
                tag=shape.tag,
            )
        )
    return requests
