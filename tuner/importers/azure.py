"""Azure LLM inference traces (CSV): `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`.

Every row is one request of its own; the trace says nothing of sessions or prefixes, so prompts are
all new tokens.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
from pydantic import Field

from tuner.catalog import IMPORTER_FORMATS
from tuner.config import StrictModel
from tuner.errors import WorkloadError
from tuner.importers.base import IMPORTERS, import_builder
from tuner.workloads import MAX_PROMPT_TOKENS, Trace

__all__ = ["AzureImporter", "AzureOptions"]

_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class AzureOptions(StrictModel):
    tag: str = Field(default="azure", description="Tag given to every request.")
    limit: int | None = Field(default=None, gt=0, description="Import only the first N rows.")


@IMPORTERS.register("azure")
class AzureImporter:
    description = IMPORTER_FORMATS["azure"]
    options_model = AzureOptions

    def read(self, path: Path, options: AzureOptions, *, name: str) -> Trace:
        header_line, blank_lines = _scan(path)
        if header_line is not None and header_line[1].lstrip().startswith(("{", "[")):
            raise WorkloadError(f"{path}:{header_line[0]}: a JSON line, not the CSV header {', '.join(_COLUMNS)}")
        header_at = header_line[0] if header_line is not None else 1
        # Two passes, a chunk of rows at a time: the first validates every row and finds the earliest
        # time (offsets count from it), the second builds the requests as columns.
        earliest = [
            int(nanoseconds.min()) for nanoseconds, _ in _chunks(path, options.limit, blank_lines, header_at=header_at)
        ]
        start = min(earliest, default=0)
        builder = import_builder(path, name)
        index = 0
        for nanoseconds, counts in _chunks(path, options.limit, blank_lines, header_at=header_at):
            offsets = [round(elapsed / 1e9, 6) for elapsed in (nanoseconds - start).tolist()]
            contexts, generated = counts["ContextTokens"], counts["GeneratedTokens"]
            lines = contexts.index.tolist()  # each row's line in the file
            for line, offset, context, output in zip(
                lines, offsets, contexts.tolist(), generated.tolist(), strict=True
            ):
                try:
                    builder.add_own_session(
                        f"r{index}",
                        offset_s=offset,
                        new_tokens=int(context),
                        output_tokens=int(output),
                        tag=options.tag,
                    )
                except ValueError as exc:
                    raise WorkloadError(f"{path}:{line}: {exc}") from None
                index += 1
        return builder.build().in_arrival_order()


_CHUNK_ROWS = 100_000


def _chunks(
    path: Path, limit: int | None, blank_lines: set[int], *, header_at: int
) -> Iterator[tuple[npt.NDArray[np.int64], dict[str, pd.Series]]]:
    """The rows' times (nanoseconds since the epoch, UTC) and token counts, validated, a chunk at a time;
    at most `limit` rows."""
    left = limit
    for chunk in _read_frames(path, limit, blank_lines, header_at=header_at):
        missing = [c for c in _COLUMNS if c not in chunk.columns]
        if missing:
            found = ", ".join(str(c) for c in chunk.columns) or "none"
            raise WorkloadError(
                f"{path}: missing column(s) {', '.join(missing)}; the header has {found}; "
                f"an Azure trace's header is {','.join(_COLUMNS)}"
            )
        # With blank lines kept as rows, row i is line header_at + 1 + i of the file.
        chunk.index = chunk.index + header_at + 1
        frame = chunk[~chunk.index.isin(blank_lines)]
        if left is not None:
            frame = frame.head(left)
            left -= len(frame)
        if not len(frame):
            if left == 0:
                return
            continue
        # The 2023 traces write naive times, the 2024 ones `+00:00`; both are UTC, and a file joining the two
        # must not stop at pandas' "Mixed timezones": read every time as UTC.
        times = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
        counts = {column: pd.to_numeric(frame[column], errors="coerce") for column in _COLUMNS[1:]}
        bad = frame.index[times.isna() | counts["ContextTokens"].isna() | counts["GeneratedTokens"].isna()]
        if len(bad):
            shown = ",".join("" if pd.isna(cell := frame.loc[bad[0], c]) else str(cell) for c in _COLUMNS)
            raise WorkloadError(f"{path}:{int(bad[0])}: unreadable timestamp or token count: {shown}")
        for column, values in counts.items():
            # Reported, not clamped: a request of 0 or -3 tokens is a broken row, and replaying it as 1
            # token would measure traffic that never happened.
            invalid = frame.index[(values < 1) | (values % 1 != 0) | (values > MAX_PROMPT_TOKENS)]
            if len(invalid):
                raise WorkloadError(
                    f"{path}:{int(invalid[0])}: {column} must be a whole number from 1 to {MAX_PROMPT_TOKENS:,}, "
                    f"got {frame.loc[invalid[0], column]}"
                )
        yield times.to_numpy(dtype="datetime64[ns]").astype(np.int64), counts
        if left == 0:
            return


def _scan(path: Path) -> tuple[tuple[int, str] | None, set[int]]:
    """The first non-blank line (number, text) and the numbers of blank lines, read as a stream."""
    first: tuple[int, str] | None = None
    blank: set[int] = set()
    try:
        with path.open(encoding="utf-8-sig", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    blank.add(number)
                elif first is None:
                    first = (number, line)
    except FileNotFoundError:
        raise WorkloadError(f"{path}: file not found") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror}") from None
    return first, blank


def _read_frames(path: Path, limit: int | None, blank_lines: set[int], *, header_at: int) -> Iterator[pd.DataFrame]:
    """The CSV in chunks, with blank lines kept as empty rows, so that a row's index gives its line in
    the file (pandas' default skips them and every later line would be reported too early). Reads
    enough rows for `limit` data rows past the blank lines among them; blank lines above the header are
    skipped."""
    rows = None if limit is None else limit + len(blank_lines)
    try:
        # A spreadsheet's byte-order mark dropped, a byte that is not UTF-8 left to the row's own check (which
        # names its line). A first row with more fields than the header would make pandas take its first
        # column as the index, and with index_col=False drop the extra field with a warning: an error here.
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            with pd.read_csv(
                path, nrows=rows, skip_blank_lines=False, skiprows=header_at - 1, chunksize=_CHUNK_ROWS,
                index_col=False, encoding="utf-8-sig", encoding_errors="replace",
            ) as reader:  # fmt: skip
                yield from reader
    except pd.errors.ParserWarning:
        first_row = next(n for n in itertools.count(header_at + 1) if n not in blank_lines)
        raise WorkloadError(
            f"{path}:{first_row}: not an Azure trace CSV (the row has more fields than the header {','.join(_COLUMNS)})"
        ) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        # The tokenizer's own words name the line ("Expected 3 fields in line 7, saw 5"): lead with it.
        where = re.search(r"line (\d+)", str(exc))
        at = f"{path}:{int(where.group(1)) + header_at - 1}" if where else str(path)
        raise WorkloadError(f"{at}: not an Azure trace CSV ({str(exc).strip()})") from None
