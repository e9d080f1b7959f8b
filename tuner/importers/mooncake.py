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
import numpy.typing as npt
from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, import_builder, stream_lines
from tuner.workloads import Trace
from tuner.workloads.columns import IndexedStrings

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
        builder.preset_block_names(shared.names)
        block_tokens = options.block_tokens
        for index, (number, (at, prompt_tokens, output_tokens, ids)) in enumerate(_records(path)):
            codes = shared.leading_codes(ids, -(-prompt_tokens // block_tokens))
            tokens = [min(block_tokens, prompt_tokens - position * block_tokens) for position in range(len(codes))]
            new = prompt_tokens - sum(tokens)
            try:
                builder.add_coded_session(
                    f"r{index}",
                    offset_s=round(at - start, 6),
                    new_tokens=max(new, 0 if codes else 1),
                    output_tokens=output_tokens,
                    tag=options.tag,
                    codes=codes,
                    tokens=tokens,
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
        except ValueError as exc:  # a JSONDecodeError, or an integer past Python's 4,300 digits
            if "\ufffd" in line:  # stream_lines' mark of a byte that is not UTF-8
                raise WorkloadError(f"{path}:{number}: not UTF-8 text; {_EXPECTED}") from None
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "a number of more than 4,300 digits"
            raise WorkloadError(f"{path}:{number}: not valid JSON ({why}); {_EXPECTED}") from None
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
    """Which block ids more than one request names, in bounded memory: a million-request trace names tens
    of millions of blocks, far too many for a dict of counts (or, at 8 bytes a use, an array of them).
    Mooncake numbers its blocks 0, 1, 2, ... as they first appear, so ids below _DENSE_IDS are marked in
    two byte arrays indexed by id (named once, named again): 2 bytes an id up to the largest. Other
    whole numbers go into an array counted at the end (8 bytes a use), other ids into a counter."""

    _DENSE_IDS = 1 << 25  # at most 64 MB of marks, for traces of up to 33 million blocks
    _CHUNK = 1 << 20  # uses marked at once

    def __init__(self) -> None:
        self._pending = array("q")  # dense ids not marked yet, each once a request
        self._named = np.zeros(0, dtype=bool)
        self._named_again = np.zeros(0, dtype=bool)
        self._numbers = array("q")  # other whole numbers of 64 bits, each once a request
        self._others: Counter[int | str] = Counter()  # ids that are not whole numbers of 64 bits

    def add(self, ids: list[int | str]) -> None:
        keys = {block_id if type(block_id) is int else _block_key(block_id) for block_id in ids}  # once a request
        dense = self._DENSE_IDS
        for key in keys:
            if type(key) is int and 0 <= key < dense:
                self._pending.append(key)
            elif type(key) is int and key in _INT64:
                self._numbers.append(key)
            else:
                self._others[key] += 1
        if len(self._pending) >= self._CHUNK:
            self._mark()

    def _mark(self) -> None:
        ids = np.frombuffer(self._pending, dtype=np.int64).copy()
        self._pending = array("q")
        if not len(ids):
            return
        if int(ids.max()) >= len(self._named):  # grown by half again, so that a growing trace copies little
            size = min(self._DENSE_IDS, max(int(ids.max()) + 1, len(self._named) * 3 // 2))
            self._named = np.concatenate([self._named, np.zeros(size - len(self._named), dtype=bool)])
            self._named_again = np.concatenate([self._named_again, np.zeros(size - len(self._named_again), dtype=bool)])
        ids.sort()
        repeated = np.zeros(len(ids), dtype=bool)  # named by another request of this chunk too
        repeated[1:] = ids[1:] == ids[:-1]
        repeated[:-1] |= repeated[1:]
        self._named_again[ids] |= self._named[ids] | repeated
        self._named[ids] = True

    def shared(self) -> _SharedBlocks:
        """The ids more than one request names, sorted: 8 bytes an id."""
        self._mark()
        dense = np.flatnonzero(self._named_again).astype(np.int64)
        self._named = self._named_again = np.zeros(0, dtype=bool)
        uses = np.frombuffer(self._numbers, dtype=np.int64)
        uses.sort()  # in place, so the uses are held once
        # The first use of each id that has a second: one byte a use besides the uses themselves.
        first_of_run = np.ones(len(uses), dtype=bool)
        first_of_run[1:] = uses[1:] != uses[:-1]
        has_second = np.zeros(len(uses), dtype=bool)
        has_second[:-1] = ~first_of_run[1:]
        sparse = uses[first_of_run & has_second]
        del uses, first_of_run, has_second
        self._numbers = array("q")
        # Dense ids are 0 to _DENSE_IDS - 1, the others below or above: sorted end to end.
        numbers = np.concatenate([sparse[sparse < 0], dense, sparse[sparse >= 0]])
        return _SharedBlocks(numbers, {key for key, count in self._others.items() if count >= 2})


class _SharedBlocks:
    """The block ids more than one request names, coded by their place: whole numbers of 64 bits in a
    sorted array (8 bytes an id: a set took 70), then the others, sorted as text. `names` names them
    `mc-<id>`, made when read."""

    def __init__(self, numbers: npt.NDArray[np.int64], others: set[int | str]) -> None:
        self._numbers = numbers
        self._others = sorted(others, key=str)
        self._other_codes = {key: len(numbers) + i for i, key in enumerate(self._others)}
        self.names = _BlockNames(numbers, self._others)

    def leading_codes(self, ids: list[int | str], at_most: int) -> list[int]:
        """The codes of a request's first ids that are shared (its prefix stops at the first that is not),
        at most `at_most` of them."""
        ids = ids[:at_most]
        numbers = self._numbers
        if all(type(block_id) is int for block_id in ids):  # numpy would read "05" as 5
            try:
                keys = np.fromiter(ids, dtype=np.int64, count=len(ids))
            except OverflowError:  # past 64 bits: a name
                pass
            else:
                if not len(numbers) or not len(keys):
                    return []
                at = np.minimum(np.searchsorted(numbers, keys), len(numbers) - 1)
                found = numbers[at] == keys
                count = len(keys) if found.all() else int(np.argmin(found))
                return at[:count].tolist()  # type: ignore[no-any-return]
        codes = []
        for block_id in ids:
            code = self._code(block_id if type(block_id) is int else _block_key(block_id))
            if code is None:
                break
            codes.append(code)
        return codes

    def _code(self, key: int | str) -> int | None:
        if type(key) is int and key in _INT64 and len(self._numbers):
            at = int(np.searchsorted(self._numbers, key))
            if at < len(self._numbers) and int(self._numbers[at]) == key:
                return at
        return self._other_codes.get(key)


class _BlockNames(IndexedStrings):
    """`mc-<id>` of each shared block by its code, made when read."""

    def __init__(self, numbers: npt.NDArray[np.int64], others: list[int | str]) -> None:
        self._numbers, self._others = numbers, others

    def __len__(self) -> int:
        return len(self._numbers) + len(self._others)

    def _item(self, index: int) -> str:
        count = len(self._numbers)
        return f"mc-{int(self._numbers[index])}" if index < count else f"mc-{self._others[index - count]}"


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
    milliseconds = _finite(timestamp)
    if milliseconds is None:
        raise _Invalid(f"timestamp must be a number of milliseconds, got {_shown(timestamp)}")
    lengths = []
    for key, least in (("input_length", 1), ("output_length", 1)):
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise _Invalid(f"{key} must be a whole number of at least {least}, got {_shown(value)}")
        lengths.append(value)
    hash_ids = row["hash_ids"]
    # Types compared exactly (a bool is an int to isinstance): JSON gives no subclasses.
    ids_ok = type(hash_ids) is list and set(map(type, hash_ids)) <= {int, str}
    if not ids_ok:
        raise _Invalid(f"hash_ids must be a list of block ids, got {json.dumps(hash_ids)[:80]}")
    return milliseconds / 1000.0, lengths[0], lengths[1], hash_ids


def _finite(value: Any) -> float | None:
    """A JSON number as a finite float, else None: a bool, a string, NaN, infinity, or an integer too large
    for a float (JSON's integers have no bound; `math.isfinite` of one raises)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> str:
    """A value as an error quotes it: at most 40 characters (a 400-digit number is not read out)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
