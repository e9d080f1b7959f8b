"""Mooncake-style traces (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

Each hash id names one block of `block_tokens` prompt tokens (512 in Mooncake's traces), chained so
that equal ids mean equal prefixes. Blocks that more than one request names become shared prefix
blocks, so the replay reuses exactly the prefixes the trace reused; the rest of a prompt is new tokens.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, imported_trace, read_lines
from tuner.workloads import PrefixBlock, PromptShape, Trace, TraceRequest

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
        rows = []
        for number, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{number}: not valid JSON ({exc.msg}); {_EXPECTED}") from None
            try:
                rows.append(_fields(row))
            except _Invalid as exc:
                raise WorkloadError(f"{path}:{number}: {exc}") from None
        uses = Counter(h for *_, ids in rows for h in set(ids))
        start = min((r[0] for r in rows), default=0.0)
        requests = []
        for index, (at, prompt_tokens, output_tokens, ids) in enumerate(rows):
            blocks: list[PrefixBlock] = []
            for position, block_id in enumerate(ids):
                size = min(options.block_tokens, prompt_tokens - position * options.block_tokens)
                if uses[block_id] < 2 or size <= 0:
                    break
                blocks.append(PrefixBlock(block=f"mc-{block_id}", tokens=size))
            new = prompt_tokens - sum(b.tokens for b in blocks)
            requests.append(
                TraceRequest(
                    id=f"r{index}",
                    offset_s=round(at - start, 6),
                    session=f"r{index}",
                    prompt=PromptShape(shared_prefix=blocks, new_tokens=max(new, 0 if blocks else 1)),
                    output_tokens=output_tokens,
                    tag=options.tag,
                )
            )
        return imported_trace(path, name, requests)


class _Invalid(Exception):
    pass


def _fields(row: Any) -> tuple[float, int, int, list[str]]:
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
    ids_ok = isinstance(hash_ids, list) and all(isinstance(h, int | str) and not isinstance(h, bool) for h in hash_ids)
    if not ids_ok:
        raise _Invalid(f"hash_ids must be a list of block ids, got {json.dumps(hash_ids)[:80]}")
    return float(timestamp) / 1000.0, lengths[0], lengths[1], [str(h) for h in hash_ids]
