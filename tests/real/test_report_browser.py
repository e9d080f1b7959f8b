"""The morning report of a real run (the tiny study against the real llama-server), opened in Debian's
headless chromium: no console error, no request to anything, the leaderboard's numbers on the page,
sorting works, and a screenshot to look at (kept under the run directory as `report.png`)."""

from __future__ import annotations

import pytest

from tests.real.conftest import TinyRun
from tests.support.browser import Browser
from tuner.morning_report import REPORT_NAME
from tuner.report import build_leaderboard
from tuner.runs import RunDirectory
from tuner.storage import open_optuna_study_readonly


@pytest.mark.real_server
def test_a_real_runs_report_opens_offline_without_errors_and_shows_the_leaderboards_numbers(
    tiny_run: TinyRun, browser: Browser
) -> None:
    assert tiny_run.result.returncode == 0, tiny_run.result.stderr
    report = tiny_run.run_path / REPORT_NAME
    assert f"the report in {report}" in " ".join(tiny_run.result.stdout.split())
    board = build_leaderboard(open_optuna_study_readonly(RunDirectory(tiny_run.run_path)))
    chosen = board.recommendation.row
    assert chosen is not None, board.recommendation.message

    with browser.open_page(report) as page:
        page.screenshot(tiny_run.run_path / "report.png")
        assert page.errors == []
        assert page.requests == []
        # The first screen (1280x800) says what to change and what it buys.
        first_screen = page.evaluate(
            "Array.from(document.querySelectorAll('.verdict, #verdict h3, #verdict table'))"
            ".filter(e => e.getBoundingClientRect().bottom <= window.innerHeight).length"
        )
        assert first_screen == 3, "the verdict, 'What it buys' and its table are not all on the first screen"
        change = ", ".join(f"{k} = {v}" for k, v in sorted(chosen.changed.items()))
        assert page.text(".verdict") == f"Change {change}."
        assert page.text("#recommendation") == board.recommendation.message

        page.evaluate("document.querySelector('#every-metric').open = true")
        cells = page.evaluate(
            "Array.from(document.querySelectorAll('#every-metric tbody tr')).map(r => ({trial: r.dataset.trial, "
            "values: Object.fromEntries(Array.from(r.querySelectorAll('td[data-metric]'))"
            ".map(c => [c.dataset.metric, parseFloat(c.dataset.value)])), "
            "shown: Object.fromEntries(Array.from(r.querySelectorAll('td[data-metric]'))"
            ".map(c => [c.dataset.metric, c.innerText.split('\\n')[0]]))}))"
        )
        assert [int(c["trial"]) for c in cells] == [r.number for r in board.rows]
        for row, cell in zip(board.rows, cells, strict=True):
            assert set(cell["values"]) == set(row.metrics), row.number
            for metric, (median, _, _) in row.metrics.items():
                assert cell["values"][metric] == pytest.approx(median, rel=1e-5), (row.number, metric)
                shown = float(cell["shown"][metric].replace(",", "").split()[0])  # "1,234", "0.42 !", "8.28e-05"
                assert shown == pytest.approx(median, rel=0.01, abs=0.006), (row.number, metric, cell["shown"])

        # The stall picture of both the baseline and the recommended settings, with the prefill shaded.
        assert page.evaluate("document.querySelectorAll('figure.timeline svg rect.band').length") == 2

        # Sorting by trial number (a click on its header) puts the rows in that order, and back.
        page.evaluate("document.querySelector('#leaderboard th').click()")
        numbers = [r.number for r in board.rows]
        order = "Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(r => Number(r.dataset.trial))"
        assert page.evaluate(order) == sorted(numbers, reverse=True)
        page.evaluate("document.querySelector('#leaderboard th').click()")
        assert page.evaluate(order) == sorted(numbers)
        # Each table sorts its own rows: the every-metric table by its trial column, and by its last column.
        every = "Array.from(document.querySelectorAll('#every-metric tbody tr')).map(r => Number(r.dataset.trial))"
        page.evaluate("document.querySelector('#every-metric th').click()")
        assert page.evaluate(every) == sorted(numbers, reverse=True)
        page.evaluate("Array.from(document.querySelectorAll('#every-metric th')).pop().click()")
        assert sorted(page.evaluate(every)) == sorted(numbers)
        assert page.errors == [] and page.requests == []
