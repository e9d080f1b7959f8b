"""Mooncake-style traces (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

Each hash id names one block of `block_tokens` prompt tokens (512 in Mooncake's traces), chained so
that equal ids mean equal prefixes. Blocks that more than one request names become shared prefix
blocks, so the replay reuses exactly the prefixes the trace reused; the rest of a prompt is new tokens.
"""

from __future__ import annotations

import json
import math
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, import_builder, stream_lines
from tuner.workloads import Trace

__all__ = ["MooncakeImporter", "MooncakeOptions"]

_EXPECTED = "a Mooncake record has timestamp (ms), input_length, output_length, hash_ids"


class MooncakeOptions(StrictModel):
    block_tokens: int = Field(default=512, gt=0, description="Tokens per hash id block.")
    tag: str = Field(default="mooncake", description="Tag given to every request.")


@IMPORTERS.register("mooncake")
class MooncakeImporter:
    description = IMPORTER_FORMATS["mooncake"]
    options_model = MooncakeOptions

    def read(self, path: Path, options: MooncakeOptions, *, name: str) -> Trace:
        # Two passes over the file, a line at a time: the first validates every record and counts which
        # blocks more than one request names (only those are shared prefixes), the second builds the
        # requests as columns. Nothing is held per record but its columns.
        start = math.inf
        counted = _BlockUses()
        for _, (at, _, _, ids) in _records(path):
            counted.add(ids)
            start = min(start, at)
        shared = counted.shared()
        del counted
        builder = import_builder(path, name)
        block_tokens = options.block_tokens
        for index, (number, (at, prompt_tokens, output_tokens, ids)) in enumerate(_records(path)):
            blocks: list[tuple[str, int]] = []
            for position, block_id in enumerate(ids):
                size = min(block_tokens, prompt_tokens - position * block_tokens)
                if size <= 0 or (block_id if type(block_id) is int else _block_key(block_id)) not in shared:
                    break
                blocks.append((f"mc-{block_id}", size))
            new = prompt_tokens - sum(tokens for _, tokens in blocks)
            try:
                builder.add_own_session(
                    f"r{index}",
                    offset_s=round(at - start, 6),
                    new_tokens=max(new, 0 if blocks else 1),
                    output_tokens=output_tokens,
                    tag=options.tag,
                    blocks=blocks,
                )
            except ValueError as exc:
                raise WorkloadError(f"{path}:{number}: {exc}") from None
        return builder.build().in_arrival_order()


def _records(path: Path) -> Iterator[tuple[int, tuple[float, int, int, list[int | str]]]]:
    """Each record's line number and fields, read as a stream; `WorkloadError` naming the line."""
    for number, line in stream_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg}); {_EXPECTED}") from None
        try:
            yield number, _fields(row)
        except _Invalid as exc:
            raise WorkloadError(f"{path}:{number}: {exc}") from None


class _Invalid(Exception):
    pass


_INT64 = range(-(2**63), 2**63)


def _block_key(block_id: int | str) -> int | str:
    """The key a block id is counted by: ids 5 and "5" name one block (both are written `mc-5`)."""
    if isinstance(block_id, int):
        return block_id
    digits = block_id[1:] if block_id.startswith("-") else block_id
    if digits.isascii() and digits.isdigit() and len(digits) <= 20:  # longer is no 64-bit id
        number = int(block_id)
        if str(number) == block_id:
            return number
    return block_id


class _BlockUses:
    """How many requests name each block id, in 8 bytes a use: a million-request trace names tens of
    millions of blocks, far too many for a dict of counts. Whole-number ids (Mooncake's) go into one
    array counted at the end; other ids into a counter."""

    def __init__(self) -> None:
        self._numbers = array("q")
        self._others: Counter[int | str] = Counter()  # ids that are not whole numbers of 64 bits

    def add(self, ids: list[int | str]) -> None:
        keys = {block_id if type(block_id) is int else _block_key(block_id) for block_id in ids}  # once a request
        for key in keys:
            if type(key) is int and key in _INT64:
                self._numbers.append(key)
            else:
                self._others[key] += 1

    def shared(self) -> set[int | str]:
        """The ids more than one request names. Sorted in place, so the uses are held once."""
        uses = np.frombuffer(self._numbers, dtype=np.int64)
        uses.sort()
        # The first use of each id that has a second: one byte a use besides the uses themselves.
        first_of_run = np.ones(len(uses), dtype=bool)
        first_of_run[1:] = uses[1:] != uses[:-1]
        has_second = np.zeros(len(uses), dtype=bool)
        has_second[:-1] = ~first_of_run[1:]
        numbers: set[int | str] = set(uses[first_of_run & has_second].tolist())
        del uses, first_of_run, has_second
        self._numbers = array("q")
        return numbers | {key for key, count in self._others.items() if count >= 2}


def _fields(row: Any) -> tuple[float, int, int, list[int | str]]:
    """A record's arrival (s), lengths and block ids. A missing or invalid value is reported with the
    value, never defaulted or clamped: a trace that silently lost its prefixes or gained tokens would be
    replayed as traffic that never happened."""
    if not isinstance(row, dict):
        raise _Invalid(f"expected a JSON object; {_EXPECTED}")
    missing = [key for key in ("timestamp", "input_length", "output_length", "hash_ids") if key not in row]
    if missing:
        raise _Invalid(f"missing field(s) {', '.join(missing)}; {_EXPECTED}")
    timestamp = row["timestamp"]
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or not math.isfinite(timestamp):
        raise _Invalid(f"timestamp must be a number of milliseconds, got {timestamp!r}")
    lengths = []
    for key, least in (("input_length", 1), ("output_length", 1)):
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise _Invalid(f"{key} must be a whole number of at least {least}, got {value!r}")
        lengths.append(value)
    hash_ids = row["hash_ids"]
    # Types compared exactly (a bool is an int to isinstance): JSON gives no subclasses.
    ids_ok = type(hash_ids) is list and set(map(type, hash_ids)) <= {int, str}
    if not ids_ok:
        raise _Invalid(f"hash_ids must be a list of block ids, got {json.dumps(hash_ids)[:80]}")
    return float(timestamp) / 1000.0, lengths[0], lengths[1], hash_ids
