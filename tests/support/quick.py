"""Quick rounds for the real-server tests that measure nothing: recovery from a kill at each step, signals,
secrets, a full disk. They run the tiny study (tests/data/tiny-study.toml) as the others do, but its stall
workload takes 14 to 17 s a round on a 2-core CPU with one server thread; these replay two short chats
(tests/data/quick.jsonl, a second or two) and score TTFT, which any round has (the stall metric needs a
long prompt beside a stream)."""

from __future__ import annotations

import json
from pathlib import Path

QUICK_ROUNDS = [
    "--set",
    f"workload.path={json.dumps(str(Path(__file__).resolve().parents[1] / 'data' / 'quick.jsonl'))}",
    "--set",
    'objectives=[{metric = "ttft_p95_s", direction = "minimize"}]',
]
