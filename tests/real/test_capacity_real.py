"""`tuner capacity` on the real llama-server: users beyond the server's slots wait their turn (seed 004), and
the two rounds of a sweep agree on the capacity.

The requests are short questions with 64-token answers (tests/data/capacity-short.jsonl) on a server of two
slots: at two users each request has a slot at once; at four, half of them wait about one answer's length
for a slot. The SLO's TTFT line sits between the two by a margin of several times either side on any
machine from half the speed of a 2-core one up, because both sides scale with the machine: a lone request's
prefill (tens of tokens) against a whole 64-token answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real.conftest import llama_server_processes
from tests.support import DATA, run_tuner
from tuner.capacity.record import read_sweep

pytestmark = [pytest.mark.real_server, pytest.mark.measures]


def test_users_beyond_the_slots_wait_their_turn_and_both_rounds_agree_on_the_capacity(
    llama_server_binary: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    done = run_tuner(
        "capacity", str(DATA / "tiny-study.toml"), "--runs-dir", str(runs), "--baseline", "--users", "2,4",
        "--warm-up", "2s", "--window", "10s", "--set", 'workload.path="capacity-short.jsonl"',
        "--set", "engine.settings.n_parallel=2", "--set", "metrics.slo.ttft_p95_s=1.5",
        "--set", "metrics.slo.decode_tok_s=1", "--set", "metrics.slo.min_requests=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert llama_server_processes(llama_server_binary, under=runs) == [], "a llama-server was left running"
    (stored,) = (runs / "tiny" / "capacity").glob("*.json")
    (baseline,) = read_sweep(stored).configs
    by_level = {(f.users, f.round): f for f in baseline.levels}
    assert set(by_level) == {(2, 1), (4, 1), (2, 2), (4, 2)}, done.stdout
    for round_ in (1, 2):
        two, four = by_level[(2, round_)], by_level[(4, round_)]
        assert two.ttft_p95_s is not None and four.ttft_p95_s is not None and two.per_user_tok_s is not None
        # Two users beyond two slots wait for one: at least half an answer's time (64 tokens at the speed two
        # users each got) more than the users who had a slot at once, as the server's queue makes them.
        answer_s = 63 / two.per_user_tok_s
        assert four.ttft_p95_s >= two.ttft_p95_s + 0.5 * answer_s, (two, four)
        assert (two.verdict, four.verdict) == ("pass", "fail"), (two, four)
    assert baseline.capacity == 2
    assert "the baseline serves 2 users within your SLO (TTFT p95 at most 1.5 s, 1 tok/s per user) in both rounds" in (
        done.stdout.replace("\n", " ")
    )
