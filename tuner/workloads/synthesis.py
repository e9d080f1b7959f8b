"""Turns trace shapes into concrete prompts: token ids with exact counts and real prefix sharing.

A shared block always yields the same ids (seeded by its block id), so the server's prompt cache sees
the reuse it would see in production. A session is replayed as a growing conversation: a turn's
history is the conversation so far (earlier prompts and answers), so the slot that served the previous
turn finds it in its cache. Answers are placeholders here; the load generator swaps in the ids the
server actually generated (`answer_spans`), because those are what the server cached. New tokens are
seeded by session and round, so nothing is reused by accident, not even across rounds.

A `variant` other than 0 draws every token afresh, shared blocks included, and keeps the round's shape: the
same lengths, the same sharing between its own requests. It is for a server that is reused instead of
restarted (`tuner.server_reuse.Servers.deploy`): its host-RAM prompt cache still holds the prompts of the rounds
it measured before, which no request empties, and a variant shares no prefix with them but a chance token.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from tuner.models import AnswerSpan, ReplayRequest
from tuner.workloads.trace import Trace
from tuner.workloads.trace_format import TraceRequest

__all__ = ["synthesize_requests", "synthesize_sessions", "thin_sessions"]


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _draw(rng: random.Random, low: int, high: int, count: int) -> list[int]:
    """`[rng.randrange(low, high) for _ in range(count)]`, the same numbers from the same generator, at
    half the cost: the replay makes a thousand-token prompt in the time it has between two requests."""
    width = high - low
    if width <= 0:
        raise ValueError(f"empty token range [{low}, {high})")
    bits, take = width.bit_length(), rng.getrandbits
    drawn = []
    for _ in range(count):
        number = take(bits)
        while number >= width:
            number = take(bits)
        drawn.append(low + number)
    return drawn


class _Conversation:
    """A session's tokens so far, and which stretches of them are answers of which request."""

    def __init__(self, rng: random.Random, token_range: tuple[int, int]) -> None:
        self._rng = rng
        self._low, self._high = token_range
        self.tokens: list[int] = []
        self.answers: list[AnswerSpan] = []

    def fresh(self, count: int) -> list[int]:
        return _draw(self._rng, self._low, self._high, count)

    def history(self, count: int) -> tuple[list[int], list[AnswerSpan]]:
        """The first `count` tokens of the conversation, invented where the trace began mid-session."""
        if count > len(self.tokens):
            self.tokens.extend(self.fresh(count - len(self.tokens)))
        spans = [
            AnswerSpan(start=span.start, length=min(span.length, count - span.start), request_id=span.request_id)
            for span in self.answers
            if span.start < count
        ]
        return self.tokens[:count], spans


def thin_sessions(trace: Trace, *, keep: float, seed: int) -> Trace:
    """About `keep` of the trace's sessions, each kept or dropped whole by a hash of the seed and its
    name: compressing time by `keep` and keeping this share of sessions keeps the arrival rate, and
    so the concurrency over time, of the original. Always at least one session."""
    if keep >= 1.0:
        return trace
    used = np.unique(trace.session_codes)
    scores = np.asarray([_rng("thin", seed, trace.session_name(code)).random() for code in used.tolist()])
    kept = used[scores < keep]
    if not len(kept):
        kept = used[[int(np.argmin(scores))]]
    return trace.take(np.flatnonzero(np.isin(trace.session_codes, kept)))


def synthesize_requests(
    trace: Trace,
    *,
    token_range: tuple[int, int],
    seed: int,
    round_index: int,
    variant: int = 0,
    time_scale: float = 1.0,
) -> list[ReplayRequest]:
    """Every request of the trace with its prompt, in the trace's order."""
    built = {
        request.request_id: request
        for session in synthesize_sessions(
            trace, token_range=token_range, seed=seed, round_index=round_index, variant=variant, time_scale=time_scale
        )
        for request in session
    }
    return [built[request_id] for request_id in trace.ids]


# Shared blocks kept made (a Mooncake day names hundreds of thousands): a block made again is the same.
_BLOCKS_KEPT = 4096


def synthesize_sessions(
    trace: Trace,
    *,
    token_range: tuple[int, int],
    seed: int,
    round_index: int,
    variant: int = 0,
    time_scale: float = 1.0,
) -> Iterator[list[ReplayRequest]]:
    """Each session's requests with their prompts, its turns in order, sessions in the order of their
    first arrival; made as they are read, so a replay holds only the sessions under way. What is made
    does not depend on the order: a session's tokens come from its own seed, a block's from its id.
    `variant`: see the module's text; 0 makes the prompts every earlier version made."""
    low, high = token_range
    salt: tuple[str, ...] = () if variant == 0 else (f"variant {variant}",)
    blocks: OrderedDict[str, list[int]] = OrderedDict()
    codes, turns, offsets = trace.session_codes, trace.turn, trace.offset_s
    by_session = np.lexsort((offsets, turns, codes))
    ordered_codes = codes[by_session]
    starts = np.flatnonzero(np.concatenate(([True], ordered_codes[1:] != ordered_codes[:-1])))
    ends = np.concatenate((starts[1:], [len(by_session)]))
    first_offsets = offsets[by_session[starts]]
    for group in np.argsort(first_offsets, kind="stable").tolist():
        conversation: _Conversation | None = None
        session: list[ReplayRequest] = []
        rows = by_session[starts[group] : ends[group]].tolist()
        for turn, shape in enumerate(map(trace.request, rows), start=1):
            prefix: list[int] = []
            for block in shape.prompt.shared_prefix:
                made = blocks.get(block.block)
                if made is None or len(made) < block.tokens:
                    made = blocks[block.block] = _draw(_rng("block", seed, *salt, block.block), low, high, block.tokens)
                    if len(blocks) > _BLOCKS_KEPT:
                        blocks.popitem(last=False)
                blocks.move_to_end(block.block)
                prefix.extend(made[: block.tokens])
            if conversation is None:
                conversation = _Conversation(_rng("session", seed, round_index, *salt, shape.session), token_range)
            history, spans = conversation.history(shape.prompt.history_tokens)
            new = conversation.fresh(shape.prompt.new_tokens)
            # The last turn's answer is never part of a prompt: its placeholder is not made (the session's
            # generator is its own, so no other prompt changes).
            answer = conversation.fresh(shape.output_tokens) if turn < len(rows) else []
            conversation.tokens = history + new + answer
            conversation.answers = [
                *spans,
                AnswerSpan(start=len(history) + len(new), length=shape.output_tokens, request_id=shape.id),
            ]
            session.append(
                _replay_request(
                    shape,
                    prefix + history + new,
                    tuple(span.shifted(len(prefix)) for span in spans),
                    time_scale,
                )
            )
        yield session


def _replay_request(
    shape: TraceRequest, tokens: list[int], answer_spans: tuple[AnswerSpan, ...], time_scale: float
) -> ReplayRequest:
    return ReplayRequest(
        request_id=shape.id,
        session=shape.session,
        turn=shape.turn,
        offset_s=shape.offset_s * time_scale,
        think_s=shape.think_s * time_scale,
        prompt_token_ids=tuple(tokens),
        answer_spans=answer_spans,
        output_tokens=shape.output_tokens,
        tag=shape.tag,
        lora=tuple((use.adapter, use.scale) for use in shape.lora) if shape.lora else None,
    )
