"""The prediction against the real demo study (issue 28, point 4): from the demo baseline's own `server.log`,
what `tuner diagnose LOG --predict` and a study's `search.predicted_from` predict, beside what the real study
measured on every config it ran.

Needs a finished run of the demo on the real llama-server (`./scripts/demo.sh`, or `tuner run
studies/stall-demo.toml`); reads its run directory and changes nothing in it:

    .venv/bin/python bench/predict_demo.py [--run runs/stall-demo] [--out bench/results/predict-demo.json]

- `diagnose --predict`: the command a user runs on the log, timed as a subprocess (the issue's target:
  under 5 minutes on 2 cores), and its predicted best.
- The study's prediction: `search.predicted_from` = that log on the demo's own study, which replays the
  study's workload at its baseline over its space; for each trial the run measured, the predicted stall
  speed and prefill speed beside the measured medians, and whether the predicted best is in the run's
  near-optimal band: the recommended trial, or a trial whose search-round scores reach the recommended
  one's lowest.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provenance import write_result  # noqa: E402

from tuner.config import load_study  # noqa: E402
from tuner.report import build_leaderboard  # noqa: E402
from tuner.runs import RunDirectory  # noqa: E402
from tuner.search import prepare_study  # noqa: E402
from tuner.search.prediction import study_prediction  # noqa: E402
from tuner.study_view import StudyView  # noqa: E402

STUDY = ROOT / "studies" / "stall-demo.toml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / "stall-demo", help="the demo's run directory")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    run = RunDirectory(args.run)
    log = run.server_log_path(0)
    if not log.is_file():
        print(f"error: {log} does not exist; run the demo first (./scripts/demo.sh)", file=sys.stderr)
        return 2
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "tuner"), "diagnose", str(log), "--predict", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        return 1
    diagnosed = json.loads(done.stdout)["prediction"]
    print(f"tuner diagnose {log.name} --predict: {took:.1f} s, predicted best {diagnosed['best']['settings']}")

    board = build_leaderboard(StudyView.open(run))
    spec, base_dir = load_study(STUDY, [f'search.predicted_from="{log.resolve()}"'])
    with tempfile.TemporaryDirectory() as scratch, RunDirectory(Path(scratch), notice=lambda _l: None) as scratch_run:
        record = study_prediction(prepare_study(spec, base_dir), scratch_run)
    assert record is not None and record.best is not None
    chosen = board.recommendation.row
    floor = chosen.score_range[0] if chosen is not None and chosen.score_range else None
    near = [r for r in board.rows if r is chosen or (floor is not None and r.score_range and r.score_range[1] >= floor)]
    in_band = any(record.figures_for(r.settings) == record.best for r in near)
    print(
        f"study prediction: best {record.best.settings}; the run recommended "
        f"{chosen.settings if chosen else 'nothing'}; the predicted best is "
        f"{'in' if in_band else 'not in'} the near-optimal band ({', '.join(str(r.number) for r in near)})"
    )
    rows: list[dict[str, Any]] = []
    print(
        "| trial | settings | stall measured (tok/s) | stall predicted | off by | prefill measured "
        "| prefill predicted |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in sorted(board.rows, key=lambda r: r.number):
        figures = record.figures_for(row.settings)
        if figures is None or "stall_tok_s" not in row.metrics:
            continue
        stall, prefill = row.metrics["stall_tok_s"][0], row.metrics.get("prefill_tok_s", (None,))[0]
        p_stall, p_prefill = figures.median.get("stall_tok_s"), figures.median.get("prefill_tok_s")
        off = f"{p_stall / stall - 1:+.0%}" if p_stall and stall else ""
        shown = "baseline" if row.baseline else " ".join(f"{k}={v}" for k, v in row.changed.items())
        print(
            f"| {row.number} | {shown} | {stall:.2f} | {p_stall or 0:.2f} | {off} | "
            f"{prefill or 0:.0f} | {p_prefill or 0:.0f} |"
        )
        rows.append(
            {"trial": row.number, "settings": row.settings, "measured": row.metrics, "predicted": figures.median}
        )
    if args.out:
        document = {
            "diagnose_seconds": took,
            "diagnose_best": diagnosed["best"]["settings"],
            "study_best": record.best.settings,
            "recommended": None if chosen is None else chosen.settings,
            "best_in_near_optimal_band": in_band,
            "prefill_factor": record.prefill_factor,
            "decode_factor": record.decode_factor,
            "rows": rows,
        }
        write_result(args.out, document, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
