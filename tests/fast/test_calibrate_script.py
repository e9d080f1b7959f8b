"""`scripts/calibrate_sim.py`'s refusals, found before minutes of measuring the real server, and `--check`,
which fits and writes nothing. Only its `--measured` path runs here (no server)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "calibrate_sim.py"
SHIPPED = ROOT / "tuner" / "sim" / "calibration.json"
MEASURED = ROOT / "bench" / "results" / "sim-calibration-check.json"


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )


def test_bad_measurements_and_outputs_are_refused_in_one_line_before_anything_is_measured(tmp_path: Path) -> None:
    (tmp_path / "rows.json").write_text(json.dumps({"measured": [{"n_batch": 32, "n_ubatch": 32, "stall_tok_s": 0}]}))
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "text.json").write_text("not json")
    cases = {
        ("--measured", str(tmp_path / "missing.json")): "No such file or directory",
        ("--measured", str(tmp_path)): "Is a directory",
        ("--measured", str(tmp_path / "text.json")): "not JSON",
        ("--measured", str(tmp_path / "list.json")): "no `measured` list of rows",
        ("--measured", str(tmp_path / "rows.json")): "speeds above zero",
        ("--check", "--out", str(tmp_path)): "is a directory: name a file in it",
        ("--check", "--out", str(tmp_path / "no" / "out.json")): "is not a directory: make it first",
        ("--check", "--out", str(SHIPPED)): "--check writes nothing into calibration.json, the shipped calibration",
    }
    for args, said in cases.items():
        done = _calibrate(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, done.stderr)
        assert said in lines[0], (args, lines[0])
        assert done.stdout == ""  # nothing measured, nothing printed


def test_check_prints_the_measurements_beside_the_shipped_calibration_and_writes_nothing(tmp_path: Path) -> None:
    shipped_before = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    done = _calibrate("--check", "--measured", str(MEASURED))
    assert done.returncode == 0, done.stderr
    assert "| 128 / 128 | 1.85 | 1.89 (+2%) |" in done.stdout  # the real figure beside the shipped model's
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == shipped_before
    out = tmp_path / "check.json"
    done = _calibrate("--check", "--measured", str(MEASURED), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["cost_model"] == json.loads(SHIPPED.read_text())["cost_model"]
