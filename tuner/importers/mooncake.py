"""Mooncake-style traces (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

Each hash id names one block of `block_tokens` prompt tokens (512 in Mooncake's traces), chained so
that equal ids mean equal prefixes. Blocks that more than one request names become shared prefix
blocks, so the replay reuses exactly the prefixes the trace reused; the rest of a prompt is new tokens.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pydantic import Field

from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, imported_trace, read_lines
from tuner.workloads import PrefixBlock, PromptShape, Trace, TraceRequest

__all__ = ["MooncakeImporter", "MooncakeOptions"]


class MooncakeOptions(StrictModel):
    block_tokens: int = Field(default=512, gt=0, description="Tokens per hash id block.")
    tag: str = Field(default="mooncake", description="Tag given to every request.")


@IMPORTERS.register("mooncake")
class MooncakeImporter:
    description = "Mooncake-style JSONL: timestamp (ms), input_length, output_length, hash_ids"
    options_model = MooncakeOptions

    def read(self, path: Path, options: MooncakeOptions, *, name: str) -> Trace:
        rows = []
        for number, line in enumerate(read_lines(path), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append(
                    (
                        float(row["timestamp"]) / 1000.0,
                        int(row["input_length"]),
                        int(row["output_length"]),
                        [str(h) for h in row.get("hash_ids", [])],
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                problem = f"missing field {exc}" if isinstance(exc, KeyError) else "not a Mooncake record"
                raise WorkloadError(
                    f"{path}:{number}: {problem}; expected timestamp, input_length, output_length, hash_ids"
                ) from None
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
                    output_tokens=max(1, output_tokens),
                    tag=options.tag,
                )
            )
        return imported_trace(path, name, requests)
