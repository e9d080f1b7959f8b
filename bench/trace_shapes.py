"""The shapes `bench/big_traces.py` draws its sources from, measured on the public traces themselves and
set beside the same figures of the synthetic sources (no trace is shipped or fetched: pass the files).

    bench/trace_shapes.py --mooncake conversation_trace.jsonl --azure-conv AzureLLMInferenceTrace_conv.csv \
        --azure-code AzureLLMInferenceTrace_code.csv

Mooncake's conversation trace is in its repository's FAST25-release/traces/; Azure's 2023 LLM inference
traces are in its public dataset's data/ folder. Each synthetic source is drawn with as many rows as the
real one has.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from big_traces import write_azure, write_mooncake


def _quantile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


def mooncake_shape(path: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids = [len(row["hash_ids"]) for row in rows]
    prompts = [row["input_length"] for row in rows]
    answers = [row["output_length"] for row in rows]
    named = Counter(block for row in rows for block in row["hash_ids"])
    once = sum(1 for count in named.values() if count == 1)
    seen: set[int] = set()
    extending = 0
    for row in rows:
        blocks = row["hash_ids"]
        reused = 0
        while reused < len(blocks) and blocks[reused] in seen:
            reused += 1
        extending += reused > 1  # more than block 0, the system prompt every request names
        seen.update(blocks)
    return {
        "requests": len(rows),
        "ids a request: mean": round(statistics.mean(ids), 1),
        "ids a request: p50": _quantile(ids, 0.5),
        "ids a request: p90": _quantile(ids, 0.9),
        "ids a request: p99": _quantile(ids, 0.99),
        "prompt tokens: mean": round(statistics.mean(prompts)),
        "prompt tokens: p50": _quantile(prompts, 0.5),
        "prompt tokens: p90": _quantile(prompts, 0.9),
        "answer tokens: p50": _quantile(answers, 0.5),
        "answer tokens: p90": _quantile(answers, 0.9),
        "distinct ids named once": round(once / len(named), 3),
        "uses of ids named again": round(1 - once / sum(ids), 3),
        "requests extending an earlier one": round(extending / len(rows), 3),
    }


def azure_shape(path: Path) -> dict[str, float]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    prompts = [int(row["ContextTokens"]) for row in rows]
    answers = [int(row["GeneratedTokens"]) for row in rows]
    return {
        "requests": len(rows),
        "prompt tokens: p50": _quantile(prompts, 0.5),
        "prompt tokens: p90": _quantile(prompts, 0.9),
        "prompt tokens: max": max(prompts),
        "answer tokens: p50": _quantile(answers, 0.5),
        "answer tokens: p90": _quantile(answers, 0.9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mooncake", type=Path, help="Mooncake's conversation_trace.jsonl")
    parser.add_argument("--azure-conv", type=Path, help="AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--azure-code", type=Path, help="AzureLLMInferenceTrace_code.csv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for label, real, measure in (
            ("mooncake", args.mooncake, mooncake_shape),
            ("azure-conv", args.azure_conv, azure_shape),
            ("azure-code", args.azure_code, azure_shape),
        ):
            if real is None:
                continue
            real_shape = measure(real)
            synthetic = Path(scratch) / f"{label}.src"
            rows = int(real_shape["requests"])
            if label == "mooncake":
                write_mooncake(synthetic, rows)
            else:
                write_azure(synthetic, rows, shape=label)
            drawn = measure(synthetic)
            print(f"| {label} | public trace | big_traces.py |\n|---|---|---|")
            for key, value in real_shape.items():
                print(f"| {key} | {value:,} | {drawn[key]:,} |")
            print()


if __name__ == "__main__":
    main()
