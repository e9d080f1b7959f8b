"""The leaderboard as a user gets it: a table that fits the terminal, `--wide`, `--json`, `--csv`, `--parquet`.

The board is a real one: the demo study run against the simulated server (tests/support/sim_study.py), with a
violated constraint and a pruned trial of its own. The tables are read back as text, as a user reads them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from tests.support import run_cli
from tests.support.sim_study import prepare_simulated, run_simulated
from tuner.console import render_leaderboard
from tuner.report import Leaderboard, build_leaderboard, leaderboard_frame
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly

# Each metric column of the demo's table: its full header and its short one, which the legend explains.
HEADERS = {
    "stall_tok_s": ("stall (tok/s)", "stall t/s"),
    "unstalled_tok_s": ("unstalled (tok/s)", "unstalled t/s"),
    "prefill_tok_s": ("prefill (tok/s)", "prefill t/s"),
    "ttft_p95_s": ("ttft p95 (s)", "TTFT p95 s"),
    "itl_max_s": ("itl max (s)", "ITL max s"),
    "output_tok_s": ("output (tok/s)", "out t/s"),
    "failures": ("failures", "fail"),
}
FIXED_HEADERS = ("trial", "settings (changed from baseline)", "score")
# What the default objectives trade: kept while anything is.
KEY_METRICS = ("stall_tok_s", "prefill_tok_s", "ttft_p95_s")


@dataclass(frozen=True, kw_only=True)
class Demo:
    run_dir: Path  # its journal on disk, for `tuner leaderboard`
    board: Leaderboard


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    run_dir = tmp_path_factory.mktemp("runs") / "stall-demo"
    study = run_simulated(prepare_simulated(), run_dir, seed=1, in_memory=False)
    return Demo(run_dir=run_dir, board=study.board)


def rendered(board: Leaderboard, width: int, *, wide: bool = False) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    render_leaderboard(board, console, wide=wide)
    return console.export_text()


def table_lines(text: str) -> tuple[list[str], list[str]]:
    """The table's header lines and body lines (between the box's rules)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    rule = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[top + 1 : rule], lines[rule + 1 : bottom]


def columns(lines: list[str], separator: str) -> list[str]:
    """Each column's text over `lines`, the pieces of a wrapped cell joined by spaces."""
    pieces = [line.split(separator)[1:-1] for line in lines]
    return [" ".join(" ".join(row[i].split()) for row in pieces if row[i].strip()) for i in range(len(pieces[0]))]


def headers(text: str) -> list[str]:
    header_lines, _ = table_lines(text)
    return columns(header_lines, "┃")


def settings_column(text: str) -> str:
    """The settings column of every row, one string (a wrapped reason reads whole)."""
    _, body = table_lines(text)
    return columns(body, "│")[1]


def notes(text: str) -> str:
    """What follows the table, with its wrapped lines joined."""
    after = text.splitlines()
    after = after[next(i for i, line in enumerate(after) if line.startswith("└")) + 1 :]
    return " ".join(" ".join(line.split()) for line in after)


def metrics_in(board: Leaderboard) -> list[str]:
    return [name for name in HEADERS if any(name in row.metrics for row in board.rows)]


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_fits_the_terminal_with_nothing_cut(demo: Demo, width: int) -> None:
    text = rendered(demo.board, width)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text
    shown = headers(text)
    known = set(FIXED_HEADERS) | {header for pair in HEADERS.values() for header in pair}
    assert set(shown) <= known, f"a header was cut or made up: {set(shown) - known}"
    assert shown[:3] == list(FIXED_HEADERS)
    after = notes(text)
    for name in metrics_in(demo.board):
        full, short = HEADERS[name]
        if short in shown:
            assert f"{short} {name}" in after, f"the legend does not explain {short!r}"
        elif full not in shown:
            left_out = after[after.index("left out") :]
            assert name in left_out.split("--wide")[0], f"{name} is neither shown nor named as left out"
    for name in KEY_METRICS:
        assert any(header in shown for header in HEADERS[name]), f"{name} left out at {width} columns"
    _, body = table_lines(text)
    trials = [cell for cell in (line.split("│")[1].strip() for line in body) if cell]
    assert trials == [f"{row.number} *" if row.pareto else str(row.number) for row in demo.board.rows]


def test_a_narrow_terminal_says_what_was_left_out_and_how_to_see_it(demo: Demo) -> None:
    text = rendered(demo.board, 80)
    after = notes(text)
    assert "left out to fit a width of 80:" in after
    assert after.split("left out to fit a width of 80:")[1].split(";")[1].strip().startswith("--wide shows all")
    assert "[min-max] ranges" in after
    # Nothing of what the table shows is claimed to be left out.
    left_out = after.split("left out to fit a width of 80:")[1].split(";")[0]
    for name in metrics_in(demo.board):
        assert (name in left_out) != any(header in headers(text) for header in HEADERS[name])


def test_wide_shows_every_column_with_its_full_header_and_ranges(demo: Demo) -> None:
    text = rendered(demo.board, 80, wide=True)
    assert "…" not in text
    assert headers(text) == [*FIXED_HEADERS[:3], *(HEADERS[name][0] for name in metrics_in(demo.board))]
    assert "left out" not in text
    pruned = next(row for row in demo.board.rows if row.state == "PRUNED")
    assert any(f"{pruned.state}: {pruned.reason}" in line for line in text.splitlines()), "a wide row was wrapped"
    _, body = table_lines(text)
    best = columns(body[:1], "│")
    low, high = demo.board.rows[0].score_range or (0.0, 0.0)
    assert best[2] == f"{demo.board.rows[0].score:+.2f} [{low:+.2f}..{high:+.2f}]"
    assert all("[" in cell for cell in best[3:] if cell not in ("0.00", "-")), best


def test_every_flag_stays_visible_on_a_narrow_terminal(demo: Demo) -> None:
    rows = demo.board.rows
    failed = dataclasses.replace(
        rows[-1],
        number=99,
        state="FAIL",
        score=None,
        reason="the server exited with code 1 before it was healthy: error: unknown argument --flash-atn",
    )
    flagged = [
        dataclasses.replace(rows[0], pareto=True, noisy=["stall_tok_s", "output_tok_s"]),
        dataclasses.replace(rows[1], answers_changed=0.25),
        *rows[2:],
        failed,
    ]
    board = dataclasses.replace(demo.board, rows=flagged)
    text = rendered(board, 80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    settings = settings_column(text)
    assert f"FAIL: {failed.reason}" in settings
    assert "PRUNED: pruned after round 1" in settings
    assert "violates prefill_tok_s" in settings
    assert "changes ~25% of answers" in settings
    # output_tok_s has no column at 80: its `!` moves beside the settings, named.
    assert "output (tok/s)" not in headers(text) and "out t/s" not in headers(text)
    assert "! on output_tok_s" in settings
    _, body = table_lines(text)
    first = columns(body[:1], "│")
    assert first[0] == f"{rows[0].number} *"
    stall = headers(text).index("stall t/s")
    assert first[stall].endswith(" !")
    assert "* = on the Pareto front" in notes(text)


def test_a_study_without_trials_yet_shows_an_empty_table(demo: Demo) -> None:
    text = rendered(dataclasses.replace(demo.board, rows=[]), 80)
    assert headers(text) == list(FIXED_HEADERS) and "…" not in text
    assert demo.board.recommendation.message.split()[0] in notes(text)


def refuse_constants(name: str) -> float:
    raise AssertionError(f"{name} is not JSON")


def test_json_is_the_whole_stdout_and_its_numbers_are_the_leaderboards(
    demo: Demo, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--json", "--csv", str(tmp_path / "b.csv"))
    assert code == 0, err
    document = json.loads(out, parse_constant=refuse_constants)
    assert f"wrote {tmp_path / 'b.csv'}" in err
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(demo.run_dir)))
    assert document["version"] == 1
    assert document["study_name"] == "stall-demo"
    assert document["recommendation"] == board.recommendation.message
    recommended = board.recommendation.row
    assert document["recommended_trial"] == (None if recommended is None else recommended.number)
    # The confirmation's pairs for scripts, not only inside the recommendation's sentence.
    assert board.confirmations, "the demo's study confirms its best trial"
    confirmations = document["confirmations"]
    told = [(c["trial"], c["pairs_run"], c["pairs_planned"], c["stopped"], c["told"]) for c in confirmations]
    assert told == [
        (number, len(c.differences), c.planned_pairs, c.stopped, c.pairs_told()) for number, _, c in board.confirmations
    ]
    if recommended is not None:
        (mine,) = [c for c in confirmations if c["trial"] == recommended.number]
        assert mine["told"] in document["recommendation"]
    assert [row["number"] for row in document["rows"]] == [row.number for row in board.rows]
    for got, row in zip(document["rows"], board.rows, strict=True):
        assert got["baseline"] == row.baseline and got["state"] == row.state and got["pareto"] == row.pareto
        assert got["settings"] == row.settings and got["changed"] == row.changed
        assert got["score"] == row.score
        assert got["score_range"] == (None if row.score_range is None else list(row.score_range))
        assert got["metrics"] == {
            name: {"median": median, "min": low, "max": high} for name, (median, low, high) in row.metrics.items()
        }
        assert got["cv"] == row.cv
        assert got["noisy"] == row.noisy and got["violates"] == row.violates and got["reason"] == row.reason
        assert got["answers_changed"] == row.answers_changed


def test_a_value_that_is_not_finite_is_null_in_the_json(demo: Demo) -> None:
    from tuner.report import leaderboard_document

    row = dataclasses.replace(demo.board.rows[0], cv={"stall_tok_s": math.inf}, score=math.nan)
    text = leaderboard_document(dataclasses.replace(demo.board, rows=[row])).model_dump_json()
    document = json.loads(text, parse_constant=refuse_constants)
    assert document["rows"][0]["cv"] == {"stall_tok_s": None} and document["rows"][0]["score"] is None


def test_wide_and_json_together_are_refused_in_one_line(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--wide", "--json")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "not allowed with argument" in err


def test_the_cli_table_fits_its_console_and_wide_keeps_the_ranges(
    demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir))
    assert code == 0, err
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 200  # a log file's width
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--wide")
    assert code == 0, err
    assert "…" not in out and "unstalled (tok/s)" in out and "median [min-max] over rounds" in out


def test_parquet_holds_the_same_table_as_the_csv(
    demo: Demo, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    csv, parquet = tmp_path / "board.csv", tmp_path / "board.parquet"
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--csv", str(csv), "--parquet", str(parquet))
    assert code == 0, err
    assert f"wrote {parquet}" in out
    from_parquet = pd.read_parquet(parquet)
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(demo.run_dir)))
    pd.testing.assert_frame_equal(from_parquet, leaderboard_frame(board))  # every value, and its type
    assert from_parquet.to_csv(index=False) == csv.read_text(), "the Parquet table is not the CSV's"
    assert len(from_parquet) == len(board.rows) and "stall_tok_s_min" in from_parquet.columns


def test_a_knob_of_mixed_types_is_written_to_parquet_as_text(demo: Demo, tmp_path: Path) -> None:
    from tuner.report import leaderboard_parquet

    rows = [
        dataclasses.replace(row, settings={**row.settings, "n_gpu_layers": "auto" if i else 99})
        for i, row in enumerate(demo.board.rows)
    ]
    (tmp_path / "b.parquet").write_bytes(leaderboard_parquet(dataclasses.replace(demo.board, rows=rows)))
    assert pd.read_parquet(tmp_path / "b.parquet")["param_n_gpu_layers"].tolist()[:2] == ["99", "auto"]


def test_a_bad_parquet_path_is_one_line_and_nothing_is_written(
    demo: Demo, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "b.parquet"
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--parquet", str(missing))
    assert code == 2
    assert out == "", "refused only after the leaderboard was shown"
    assert err.strip() == (
        f"error: --parquet {missing}: directory {missing.parent} does not exist; create it or pick another path"
    )
    assert not missing.parent.exists()

    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--parquet", str(tmp_path))
    assert code == 2 and out == ""
    assert (
        err.strip()
        == f"error: --parquet {tmp_path} is a directory; name a file in it, e.g. {tmp_path}/leaderboard.parquet"
    )

    journal = (demo.run_dir / "optuna.journal").read_bytes()
    code, out, err = run_cli(
        capsys, "leaderboard", str(demo.run_dir), "--parquet", str(demo.run_dir / "optuna.journal")
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "is the input" in err
    assert (demo.run_dir / "optuna.journal").read_bytes() == journal

    same = tmp_path / "b.out"
    code, out, err = run_cli(capsys, "leaderboard", str(demo.run_dir), "--csv", str(same), "--parquet", str(same))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "both name" in err
    assert not same.exists()
