"""Azure LLM inference traces (CSV): `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`.

Every row is one request of its own; the trace says nothing of sessions or prefixes, so prompts are
all new tokens.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pydantic import Field

from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, imported_trace
from tuner.workloads import PromptShape, Trace, TraceRequest

__all__ = ["AzureImporter", "AzureOptions"]

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class AzureOptions(StrictModel):
    tag: str = Field(default="azure", description="Tag given to every request.")
    limit: int | None = Field(default=None, gt=0, description="Import only the first N rows.")


@IMPORTERS.register("azure")
class AzureImporter:
    description = "Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens"
    options_model = AzureOptions

    def read(self, path: Path, options: AzureOptions, *, name: str) -> Trace:
        try:
            frame = pd.read_csv(path, nrows=options.limit)
        except FileNotFoundError:
            raise WorkloadError(f"{path}: file not found") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{path}: not a CSV file: {exc}") from None
        missing = [c for c in _COLUMNS if c not in frame.columns]
        if missing:
            raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(_COLUMNS)}")
        times = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce")
        for column in ("ContextTokens", "GeneratedTokens"):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
        bad = frame.index[times.isna() | frame["ContextTokens"].isna() | frame["GeneratedTokens"].isna()]
        if len(bad):
            raise WorkloadError(f"{path}:{int(bad[0]) + 2}: unreadable timestamp or token count")
        offsets = (times - times.min()).dt.total_seconds()
        requests = [
            TraceRequest(
                id=f"r{index}",
                offset_s=round(float(offset), 6),
                session=f"r{index}",
                prompt=PromptShape(new_tokens=max(1, int(context))),
                output_tokens=max(1, int(generated)),
                tag=options.tag,
            )
            for index, (offset, context, generated) in enumerate(
                zip(offsets, frame["ContextTokens"], frame["GeneratedTokens"], strict=True)
            )
        ]
        return imported_trace(path, name, requests)
