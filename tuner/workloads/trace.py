"""A trace held as columns (`Trace`: about 80 bytes a request and 22 a shared block, so that a
million-request day fits in a few hundred MB), filled a request at a time by `TraceBuilder`; its string
columns and block coding are `columns.py`, the format of its lines `trace_format.py`, reading and writing
its file `trace_file.py`."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from tuner.workloads.columns import BlockCoder, IndexedStrings, Int32Array, Int64Array, Strings
from tuner.workloads.trace_format import (
    MAX_PROMPT_TOKENS,
    LoraUse,
    PrefixBlock,
    PromptShape,
    TraceHeader,
    TraceRequest,
    shape_problem,
)

__all__ = ["Float64Array", "IndexedStrings", "Int64Array", "Int32Array", "Trace", "TraceBuilder"]


Float64Array = npt.NDArray[np.float64]


class Trace:
    """A trace's header and requests, held as columns: about 100 bytes a request besides its id and
    session names (a `TraceRequest` model is about 3 KB), so that a day of a busy server, a million
    requests, fits in a few hundred MB. `requests` reads as a sequence of `TraceRequest`, each made
    when it is read; code that walks every request of a big trace uses the columns instead.

    Requests keep the order they were given in; `load_trace` and the importers give arrival order."""

    __slots__ = (
        "_block_tokens",
        "_content",
        "_duration_s",
        "_history_tokens",
        "_ids",
        "_lora_codes",
        "_lora_table",
        "_new_tokens",
        "_odd_positions",
        "_odd_tokens",
        "_output_tokens",
        "_prefix_blocks",
        "_prefix_names",
        "_prefix_start",
        "_session_codes",
        "_sessions",
        "_tag_codes",
        "_tags",
        "_think_s",
        "_turn",
        "header",
        "offset_s",
    )

    def __init__(self, *, header: TraceHeader, requests: Iterable[TraceRequest]) -> None:
        builder = TraceBuilder(header)
        for request in requests:
            builder.add(request)
        builder.fill(self)

    # The columns, one entry a request; codes index the tables.
    header: TraceHeader
    offset_s: Float64Array
    _think_s: Float64Array
    _duration_s: Float64Array
    _turn: Int32Array
    _new_tokens: Int32Array
    _history_tokens: Int32Array
    _output_tokens: Int32Array
    _session_codes: Int32Array
    _tag_codes: Int32Array
    _lora_codes: Int32Array
    # Request i's prefix blocks are positions _prefix_start[i] to _prefix_start[i + 1] of these two.
    _prefix_start: Int64Array
    _prefix_blocks: Int32Array
    # A block's tokens are those of its first use (Mooncake's 512); a use of another size (a prompt's
    # last, partial block) is kept apart, by position: 4 bytes a use instead of 8.
    _block_tokens: Int32Array
    _odd_positions: Int64Array
    _odd_tokens: Int32Array
    _ids: Strings
    _sessions: list[str]
    _tags: list[str]
    _lora_table: list[tuple[tuple[str, float], ...]]
    _prefix_names: Sequence[str]  # by block code
    _content: dict[int, dict[str, Any]]

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def requests(self) -> Sequence[TraceRequest]:
        return _TraceRows(self)

    @property
    def ids(self) -> Sequence[str]:
        return self._ids

    @property
    def session_codes(self) -> Int32Array:
        """Each request's session as an index into `sessions`."""
        return self._session_codes

    def session_name(self, code: int) -> str:
        """The session a code in `session_codes` stands for."""
        return self._ids[-code - 1] if code < 0 else self._sessions[code]

    @property
    def turn(self) -> Int32Array:
        return self._turn

    @property
    def think_s(self) -> Float64Array:
        return self._think_s

    @property
    def new_tokens(self) -> Int32Array:
        return self._new_tokens

    @property
    def history_tokens(self) -> Int32Array:
        return self._history_tokens

    @property
    def output_tokens(self) -> Int32Array:
        return self._output_tokens

    @property
    def duration_s(self) -> Float64Array:
        """NaN where the request has no recorded duration."""
        return self._duration_s

    @property
    def prefix_tokens(self) -> Int64Array:
        """Each request's shared-prefix tokens in all."""
        sums = np.zeros(len(self), dtype=np.int64)
        for rows in _row_chunks(len(self)):
            lo, hi = int(self._prefix_start[rows.start]), int(self._prefix_start[rows.stop])
            if hi == lo:
                continue
            running = np.concatenate(([0], np.cumsum(self.use_tokens(lo, hi), dtype=np.int64)))
            starts = self._prefix_start[rows.start : rows.stop + 1] - lo
            sums[rows] = running[starts[1:]] - running[starts[:-1]]
        return sums

    def use_tokens(self, lo: int, hi: int) -> Int32Array:
        """The tokens of block uses lo to hi - 1 (positions in the block codes of `prefix_columns`)."""
        tokens = self._block_tokens[self._prefix_blocks[lo:hi]]
        first, last = np.searchsorted(self._odd_positions, [lo, hi])
        if last > first:
            tokens[self._odd_positions[first:last] - lo] = self._odd_tokens[first:last]
        return tokens

    def prefix_blocks(self, index: int) -> list[tuple[str, int]]:
        """The request's shared-prefix blocks in order: (block id, tokens)."""
        lo, hi = int(self._prefix_start[index]), int(self._prefix_start[index + 1])
        names = self._prefix_names
        blocks, tokens = self._prefix_blocks[lo:hi].tolist(), self.use_tokens(lo, hi).tolist()
        return [(names[b], t) for b, t in zip(blocks, tokens, strict=True)]

    def prefix_columns(self) -> tuple[Int64Array, Int32Array]:
        """Every request's prefix blocks as columns: request i's blocks are positions start[i] to
        start[i + 1] of the block codes (equal codes, equal block ids); `use_tokens` gives their tokens."""
        return self._prefix_start, self._prefix_blocks

    @property
    def tags(self) -> list[str]:
        return self._tags

    @property
    def tag_codes(self) -> Int32Array:
        return self._tag_codes

    def lora_mix(self) -> dict[tuple[tuple[str, float], ...], int]:
        """Requests per adapter set ((adapter, scale), ...; () for none), in the order of each set's first
        request."""
        values, first, counts = np.unique(self._lora_codes, return_index=True, return_counts=True)
        return {self._lora_table[int(values[i])]: int(counts[i]) for i in np.argsort(first).tolist()}

    def request(self, index: int) -> TraceRequest:
        """The request at `index` as a model (not validated again: every request was validated once)."""
        prompt = PromptShape.model_construct(
            shared_prefix=[PrefixBlock.model_construct(block=b, tokens=t) for b, t in self.prefix_blocks(index)],
            history_tokens=int(self._history_tokens[index]),
            new_tokens=int(self._new_tokens[index]),
        )
        fields: dict[str, Any] = {
            "id": self._ids[index],
            "offset_s": float(self.offset_s[index]),
            "session": self.session_name(int(self._session_codes[index])),
            "turn": int(self._turn[index]),
            "think_s": float(self._think_s[index]),
            "prompt": prompt,
            "output_tokens": int(self._output_tokens[index]),
            "lora": [LoraUse.model_construct(adapter=a, scale=s) for a, s in self._lora_table[self._lora_codes[index]]],
            "tag": self._tags[self._tag_codes[index]],
        }
        duration = float(self._duration_s[index])
        if not math.isnan(duration):
            fields["duration_s"] = duration
        content = self._content.get(index)
        if content is not None:
            fields["content"] = content
        return TraceRequest.model_construct(**fields)

    def stored_rows(self, indices: range) -> Iterator[dict[str, Any]]:
        """The requests at `indices` as the dicts their models dump with `exclude_defaults=True`: the
        same keys, in the same order, leaving out every value equal to its field's default."""
        offsets, turns, thinks = (
            self.offset_s[indices].tolist(),
            self._turn[indices].tolist(),
            self._think_s[indices].tolist(),
        )
        history, new = self._history_tokens[indices].tolist(), self._new_tokens[indices].tolist()
        outputs, durations = self._output_tokens[indices].tolist(), self._duration_s[indices].tolist()
        sessions, tags, loras = (
            self._session_codes[indices].tolist(),
            self._tag_codes[indices].tolist(),
            self._lora_codes[indices].tolist(),
        )
        ids = self._ids.spans(indices.start, indices.stop)
        # The batch's block uses as plain lists, read once: per request, numpy slices cost more than the rest.
        block_starts = self._prefix_start[indices.start : indices.stop + 1].tolist()
        first_use = block_starts[0]
        names = self._prefix_names
        block_names = [names[code] for code in self._prefix_blocks[first_use : block_starts[-1]].tolist()]
        block_tokens = self.use_tokens(first_use, block_starts[-1]).tolist()
        for position, index in enumerate(indices):
            row: dict[str, Any] = {"id": ids[position], "offset_s": offsets[position]}
            code = sessions[position]
            row["session"] = ids[position] if code < 0 else self._sessions[code]
            if turns[position] != 0:
                row["turn"] = turns[position]
            if thinks[position] != 0.0:
                row["think_s"] = thinks[position]
            prompt: dict[str, Any] = {}
            lo, hi = block_starts[position] - first_use, block_starts[position + 1] - first_use
            if hi > lo:
                prompt["shared_prefix"] = [
                    {"block": block, "tokens": tokens}
                    for block, tokens in zip(block_names[lo:hi], block_tokens[lo:hi], strict=True)
                ]
            if history[position] != 0:
                prompt["history_tokens"] = history[position]
            prompt["new_tokens"] = new[position]
            row["prompt"] = prompt
            row["output_tokens"] = outputs[position]
            uses = self._lora_table[loras[position]]
            if uses:
                row["lora"] = [{"adapter": a} if scale == 1.0 else {"adapter": a, "scale": scale} for a, scale in uses]
            tag = self._tags[tags[position]]
            if tag != "chat":
                row["tag"] = tag
            if not math.isnan(durations[position]):
                row["duration_s"] = durations[position]
            content = self._content.get(index)
            if content is not None:
                row["content"] = content
            yield row

    def take(self, indices: Int64Array | Sequence[int]) -> Trace:
        """The requests at `indices`, in that order, as a trace of their own with the same header."""
        chosen = np.asarray(indices, dtype=np.int64)
        taken = Trace.__new__(Trace)
        taken.header = self.header
        for name in (
            "offset_s",
            "_turn",
            "_think_s",
            "_new_tokens",
            "_history_tokens",
            "_output_tokens",
            "_duration_s",
            "_tag_codes",
            "_lora_codes",
        ):
            setattr(taken, name, getattr(self, name)[chosen])
        # A session coded by its request's position follows the request to its new position.
        codes = self._session_codes[chosen]
        own = codes < 0
        codes[own] = -(np.flatnonzero(own) + 1)
        taken._session_codes = codes
        taken._ids = self._ids.take(chosen)
        taken._sessions, taken._tags, taken._lora_table = self._sessions, self._tags, self._lora_table
        starts, ends = self._prefix_start[chosen], self._prefix_start[chosen + 1]
        lengths = ends - starts
        taken._prefix_start = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        picks = (np.repeat(starts - taken._prefix_start[:-1], lengths) + np.arange(int(lengths.sum()))).astype(np.int64)
        taken._prefix_blocks, taken._prefix_names, taken._block_tokens = (
            self._prefix_blocks[picks],
            self._prefix_names,
            self._block_tokens,
        )
        odd = np.isin(picks, self._odd_positions)
        taken._odd_positions = np.flatnonzero(odd).astype(np.int64)
        taken._odd_tokens = self._odd_tokens[np.searchsorted(self._odd_positions, picks[odd])]
        position = {old: new for new, old in enumerate(chosen.tolist())} if self._content else {}
        taken._content = {position[i]: c for i, c in self._content.items() if i in position}
        return taken

    def in_arrival_order(self) -> Trace:
        """The same requests sorted by arrival, ties kept in their order."""
        order = np.argsort(self.offset_s, kind="stable")
        if bool(np.all(order == np.arange(len(order)))):
            return self
        return self.take(order)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return self.header == other.header and list(self.requests) == list(other.requests)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Trace(name={self.header.name!r}, requests={len(self)})"


class _TraceRows(Sequence[TraceRequest]):
    def __init__(self, trace: Trace) -> None:
        self._trace = trace

    def __len__(self) -> int:
        return len(self._trace)

    @overload
    def __getitem__(self, index: int) -> TraceRequest: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TraceRequest]: ...
    def __getitem__(self, index: int | slice) -> TraceRequest | Sequence[TraceRequest]:
        if isinstance(index, slice):
            return [self._trace.request(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._trace.request(index)

    def __iter__(self) -> Iterator[TraceRequest]:
        return (self._trace.request(i) for i in range(len(self)))


class TraceBuilder:
    """Collects validated requests into columns, one at a time, so that a trace read from a file is
    never held as models."""

    def __init__(self, header: TraceHeader) -> None:
        self.header = header
        self._id_blob, self._id_ends = bytearray(), array("q")
        self._floats = {name: array("d") for name in ("offset_s", "think_s", "duration_s")}
        # 4 bytes a value: token counts are at most 10 million, turns and codes at most 2**31 - 1.
        self._ints = {name: array("i") for name in ("turn", "new", "history", "output", "session", "tag", "lora")}
        self._prefix_start = array("q", [0])
        # 4 bytes a block: a Mooncake request names dozens of them.
        self._prefix_blocks, self._block_tokens = array("i"), array("i")
        self._odd_positions, self._odd_tokens = array("q"), array("i")
        self._codes: dict[str, dict[Any, int]] = {"session": {}, "tag": {}, "lora": {}}
        self._blocks = BlockCoder()
        self._pending_tokens = array("i")  # the tokens of the uses whose names wait in `_blocks`
        self._uses = 0  # block uses so far, coded or waiting
        self._preset: Sequence[str] | None = None  # block names an importer coded itself
        self._pending_codes = array("i")  # the codes of its uses not yet sized
        self._content: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._id_ends)

    def _code(self, table: str, value: Any) -> int:
        codes = self._codes[table]
        code = codes.get(value)
        if code is None:
            code = codes[value] = len(codes)
        return code

    def add_own_session(
        self,
        request_id: str,
        *,
        offset_s: float,
        new_tokens: int,
        output_tokens: int,
        tag: str,
        blocks: Sequence[tuple[str, int]] = (),
    ) -> None:
        """A request that is a session of its own (turn 0, no think time, LoRA, duration or content), as an
        importer reads it, without the model: validating a model of 30 blocks costs more than the rest of
        a million-row import. The values are checked against the same limits the model holds; ValueError
        names the one broken."""
        problem = shape_problem(offset_s=offset_s, new_tokens=new_tokens, output_tokens=output_tokens, blocks=blocks)
        if problem is not None:
            raise ValueError(problem)
        if blocks and self._preset is not None:
            raise ValueError("this builder's block names are preset: add blocks with add_coded_session")
        self._own_row(request_id, offset_s=offset_s, new_tokens=new_tokens, output_tokens=output_tokens, tag=tag)
        for block, tokens in blocks:
            self._use_block(block, tokens)
        self._prefix_start.append(self._uses)

    def _own_row(self, request_id: str, *, offset_s: float, new_tokens: int, output_tokens: int, tag: str) -> None:
        """The columns of a request that is a session of its own, but for its blocks."""
        index = len(self._id_ends)
        self._id_blob += request_id.encode()
        self._id_ends.append(len(self._id_blob))
        floats, ints = self._floats, self._ints
        floats["offset_s"].append(offset_s)
        floats["think_s"].append(0.0)
        floats["duration_s"].append(math.nan)
        for name, value in (("turn", 0), ("new", new_tokens), ("history", 0), ("output", output_tokens)):
            ints[name].append(value)
        ints["session"].append(-(index + 1))
        ints["tag"].append(self._code("tag", tag))
        ints["lora"].append(self._code("lora", ()))

    def preset_block_names(self, names: Sequence[str]) -> None:
        """Block names an importer coded itself (Mooncake's, by its sorted array of shared ids: a name
        costs no more than `names` holds, and none is coded by hash): `add_coded_session` names its blocks
        by their index in `names`. Set before the first block; `add` and `add_own_session`'s named
        blocks are refused after."""
        if self._uses:
            raise ValueError("block names are preset before the first block is added")
        self._preset = names
        self._block_tokens = array("i", bytes(4 * len(names)))  # 0: no use seen yet

    def add_coded_session(
        self,
        request_id: str,
        *,
        offset_s: float,
        new_tokens: int,
        output_tokens: int,
        tag: str,
        codes: Sequence[int],
        tokens: Sequence[int],
    ) -> None:
        """`add_own_session` with blocks named by their index in `preset_block_names`' names."""
        names = self._preset
        if names is None:
            raise ValueError("add_coded_session names blocks preset by preset_block_names: preset them first")
        if len(codes) != len(tokens) or (codes and not (min(codes) >= 0 and max(codes) < len(names))):
            raise ValueError(f"{len(codes)} block codes of 0 to {len(names) - 1} and {len(tokens)} sizes: one each")
        if tokens and not (min(tokens) >= 1 and max(tokens) <= MAX_PROMPT_TOKENS):
            bad = next(i for i, t in enumerate(tokens) if not 1 <= t <= MAX_PROMPT_TOKENS)
            blocks = [(names[codes[bad]], tokens[bad])]
        else:
            blocks = [("", 1)] if tokens else []  # its tokens checked: only "no token at all" is left to check
        problem = shape_problem(offset_s=offset_s, new_tokens=new_tokens, output_tokens=output_tokens, blocks=blocks)
        if problem is not None:
            raise ValueError(problem)
        self._own_row(request_id, offset_s=offset_s, new_tokens=new_tokens, output_tokens=output_tokens, tag=tag)
        self._pending_codes.extend(codes)
        self._pending_tokens.extend(tokens)
        self._uses += len(codes)
        self._prefix_start.append(self._uses)
        self._code_blocks_when_a_batch_waits()

    def _use_block(self, name: str, tokens: int) -> None:
        if self._preset is not None:
            raise ValueError("this builder's block names are preset: add blocks with add_coded_session")
        self._blocks.pending.append(name)
        self._pending_tokens.append(tokens)
        self._uses += 1
        self._code_blocks_when_a_batch_waits()

    def _code_blocks_when_a_batch_waits(self) -> None:
        if len(self._pending_tokens) >= BlockCoder.BATCH:
            self._code_blocks()

    def _code_blocks(self) -> None:
        """The waiting uses coded: a new block's tokens are its first use's; a use of another size is kept
        apart, by position."""
        if not self._pending_tokens:
            return
        first_position = len(self._prefix_blocks)
        tokens = np.frombuffer(self._pending_tokens, dtype=np.int32).copy()
        self._pending_tokens = array("i")
        if self._preset is None:
            codes, new_first = self._blocks.code()
            self._block_tokens.frombytes(tokens[new_first].astype(np.int32).tobytes())
            sizes = np.frombuffer(self._block_tokens, dtype=np.int32)
        else:
            codes = np.frombuffer(self._pending_codes, dtype=np.int32).copy()
            self._pending_codes = array("i")
            sizes = np.frombuffer(self._block_tokens, dtype=np.int32)
            used, first = np.unique(codes, return_index=True)  # a block's size: its first use's
            unsized = sizes[used] == 0
            sizes[used[unsized]] = tokens[first[unsized]]
        odd = np.flatnonzero(sizes[codes] != tokens)
        del sizes  # a view of the column, which grows again
        self._odd_positions.frombytes((odd + first_position).astype(np.int64).tobytes())
        self._odd_tokens.frombytes(tokens[odd].astype(np.int32).tobytes())
        self._prefix_blocks.frombytes(codes.astype(np.int32).tobytes())

    def add(self, request: TraceRequest) -> None:
        index = len(self._id_ends)
        self._id_blob += request.id.encode()
        self._id_ends.append(len(self._id_blob))
        floats, ints = self._floats, self._ints
        floats["offset_s"].append(request.offset_s)
        floats["think_s"].append(request.think_s)
        floats["duration_s"].append(math.nan if request.duration_s is None else request.duration_s)
        prompt = request.prompt
        ints["turn"].append(request.turn)
        ints["new"].append(prompt.new_tokens)
        ints["history"].append(prompt.history_tokens)
        ints["output"].append(request.output_tokens)
        # A session named like its request (every imported Azure or Mooncake request is a session of its
        # own) is coded -(index + 1) and read from the id column: no table entry, no second string.
        ints["session"].append(
            -(index + 1) if request.session == request.id else self._code("session", request.session)
        )
        ints["tag"].append(self._code("tag", request.tag))
        ints["lora"].append(self._code("lora", tuple((use.adapter, use.scale) for use in request.lora)))
        for block in prompt.shared_prefix:
            self._use_block(block.block, block.tokens)
        self._prefix_start.append(self._uses)
        if request.content is not None:
            self._content[index] = request.content

    def build(self) -> Trace:
        trace = Trace.__new__(Trace)
        self.fill(trace)
        return trace

    def fill(self, trace: Trace) -> None:
        """Moves the columns into `trace`, without copying them; the builder is empty after."""
        floats, ints = self._floats, self._ints
        self._code_blocks()

        trace.header = self.header
        trace.offset_s, trace._think_s = _view(floats, "offset_s", np.float64), _view(floats, "think_s", np.float64)
        trace._duration_s = _view(floats, "duration_s", np.float64)
        trace._turn, trace._new_tokens = _view(ints, "turn", np.int32), _view(ints, "new", np.int32)
        trace._history_tokens, trace._output_tokens = _view(ints, "history", np.int32), _view(ints, "output", np.int32)
        trace._session_codes, trace._tag_codes = _view(ints, "session", np.int32), _view(ints, "tag", np.int32)
        trace._lora_codes = _view(ints, "lora", np.int32)
        prefix = {
            "start": self._prefix_start,
            "blocks": self._prefix_blocks,
            "sizes": self._block_tokens,
            "odd at": self._odd_positions,
            "odd": self._odd_tokens,
        }
        trace._prefix_start, trace._prefix_blocks = _view(prefix, "start", np.int64), _view(prefix, "blocks", np.int32)
        trace._block_tokens = _view(prefix, "sizes", np.int32)
        trace._odd_positions, trace._odd_tokens = _view(prefix, "odd at", np.int64), _view(prefix, "odd", np.int32)
        trace._ids = Strings(self._id_blob, _view({"ends": self._id_ends}, "ends", np.int64))
        # A session named like one of its requests and also named by others has a table code: the request
        # coded by its position gets that code too, or the session would count as two.
        table = self._codes["session"]
        if table:
            own = np.flatnonzero(trace._session_codes < 0)
            for index, name in zip(own.tolist(), (trace._ids[i] for i in own.tolist()), strict=True):
                code = table.get(name)
                if code is not None:
                    trace._session_codes[index] = code
        trace._sessions = list(self._codes["session"])
        trace._tags = list(self._codes["tag"])
        trace._lora_table = list(self._codes["lora"])
        if self._preset is not None:
            trace._prefix_names = self._preset
        else:
            names = self._blocks
            trace._prefix_names = Strings(names.names_blob, _view({"ends": names.names_ends}, "ends", np.int64))
        trace._content = self._content
        self.__init__(self.header)  # type: ignore[misc]  # empty again: the columns are the trace's now


_CHUNK_ROWS = 65_536


def _row_chunks(count: int) -> list[range]:
    """Ranges of rows to walk a big trace's block uses a chunk at a time."""
    return [range(start, min(start + _CHUNK_ROWS, count)) for start in range(0, count, _CHUNK_ROWS)]


def _view(columns: dict[str, array[Any]], name: str, dtype: type[np.generic]) -> Any:
    """The builder's column as a numpy array over the same memory (no copy: a million requests' columns
    are held once). The column leaves the builder, which must never grow it again."""
    values = columns.pop(name)
    return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)
