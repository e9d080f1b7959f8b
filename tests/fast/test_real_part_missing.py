"""A real part that is missing (here chromium, off PATH): its tests fail under CI naming it and skip
elsewhere, and the summary counts them against that part (tests/support/real_parts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_missing_chromium_fails_under_ci_naming_it_and_skips_elsewhere(tmp_path: Path) -> None:
    """No chromium on PATH: the browser tests stop at the part, and the summary counts them against it."""
    root = Path(__file__).resolve().parents[2]
    test = "tests/real/test_browser_harness.py::test_a_clean_page_reports_nothing"
    outcomes = {}
    for ci in ("true", ""):
        env = {**os.environ, "PATH": str(tmp_path), "CI": ci, "PYTHONPATH": str(root)}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", test],
            check=False,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        outcomes[ci] = (run.returncode, run.stdout)
    code, out = outcomes["true"]
    assert code == 1, out
    assert "CI requires the real chromium (Debian's chromium, installed by scripts/test.sh)" in out
    assert "chromium: 0 passed, 0 failed, 0 skipped; 1 stopped because it is missing (failures)" in out
    code, out = outcomes[""]
    assert code == 0, out
    assert "the real chromium is missing (Debian's chromium, installed by scripts/test.sh)" in out
    assert "1 skipped" in out
