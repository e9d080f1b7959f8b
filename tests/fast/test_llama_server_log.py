"""The llama-server log parser against a real trial log (tests/data/llama-server-trial.log, recorded from
the real server during a tiny study) and against the older and journal line shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engines.llama_server_log import parse_llama_server_log, parse_timestamp

DATA = Path(__file__).resolve().parents[1] / "data"


def test_timestamps_are_minutes_seconds_millis_micros_not_hours() -> None:
    assert parse_timestamp("0.05.345.765 I slot print_timing: ...") == pytest.approx(5.345765)
    assert parse_timestamp("12.03.000.500 I srv ...") == pytest.approx(12 * 60 + 3.0005)
    assert parse_timestamp("no timestamp here") is None


def test_a_real_trial_log_yields_every_task_with_its_timings() -> None:
    tasks = parse_llama_server_log((DATA / "llama-server-trial.log").read_text().splitlines())
    assert [t.task for t in tasks] == [0, 9, 12, 44, 174, 183, 220]
    warm_up, chat, _, long, *_ = tasks
    assert warm_up.prompt_tokens == 16 and warm_up.eval_n == 8
    assert (chat.prompt_n, chat.eval_n, chat.prompt_tokens) == (92, 160, 92)
    assert long.prompt_n == 1532 and long.prompt_ms == pytest.approx(5617.62)
    assert long.launch_s == pytest.approx(1.781609) and long.release_s == pytest.approx(7.632359)
    assert chat.rate_samples[0].n_gen == 100 and chat.rate_samples[0].tg_3s == pytest.approx(13.25)


def test_a_resumed_prompt_counts_its_cached_tokens_in_the_prompt_length() -> None:
    tasks = {t.task: t for t in parse_llama_server_log((DATA / "llama-server-trial.log").read_text().splitlines())}
    # 32 tokens of the shared system prompt came from the slot's cache: only 60 were evaluated.
    assert tasks[174].prompt_n == 60 and tasks[174].prompt_tokens == 92


def test_the_prefill_window_ends_where_decoding_started() -> None:
    tasks = {t.task: t for t in parse_llama_server_log((DATA / "llama-server-trial.log").read_text().splitlines())}
    start, end = tasks[44].prefill_window_s or (0.0, 0.0)
    assert end == pytest.approx(7.632359 - 0.23210)
    assert end - start == pytest.approx(5.61762)
    assert tasks[44].wait_before_prefill_s == pytest.approx(0.0, abs=0.01)


OLDER_BUILD = """\
0.01.000.000 I slot launch_slot_: id  0 | task 5 | processing task
0.01.200.000 I slot update_slots: id  0 | task 5 | prompt processing progress, n_tokens = 512, batch.n_tokens = 512, progress = 0.250000
0.04.000.000 I slot print_timing: id  0 | task 5 |
prompt eval time =    2500.00 ms /  2048 tokens (    1.22 ms per token,   819.20 tokens per second)
       eval time =     400.00 ms /    10 tokens (   40.00 ms per token,    25.00 tokens per second)
      total time =    2900.00 ms /  2058 tokens
0.04.000.100 I slot      release: id  0 | task 5 | stop processing: n_tokens = 2057, truncated = 0
"""


def test_an_older_build_with_unprefixed_timing_lines_is_read() -> None:
    (task,) = parse_llama_server_log(OLDER_BUILD.splitlines())
    assert (task.prompt_n, task.eval_n, task.prompt_tokens) == (2048, 10, 2048)
    assert task.prefill_progress[0].progress == pytest.approx(0.25)
    # launched at 1.0, released at 4.0001, computed for 2.9 s: it waited about 0.1 s.
    assert task.wait_before_prefill_s == pytest.approx(0.1001)


def test_journal_prefixes_are_skipped() -> None:
    lines = [
        f"Nov 29 10:00:0{i} gpu-host llama-server[4242]: {line}" for i, line in enumerate(OLDER_BUILD.splitlines())
    ]
    # journalctl repeats the prefix on every line, also on the unprefixed timing lines of older builds.
    (task,) = parse_llama_server_log(lines)
    assert task.prompt_n == 2048 and task.eval_n == 10


def test_log_tasks_join_the_client_records_they_served() -> None:
    from tuner.metrics import join_server_tasks
    from tuner.models import RequestRecord, RequestStatus

    tasks = parse_llama_server_log((DATA / "llama-server-trial.log").read_text().splitlines())

    def record(request_id: str, send: float, prompt: int, output: int) -> RequestRecord:
        return RequestRecord(
            request_id=request_id,
            session=request_id,
            tag="chat",
            prompt_tokens=prompt,
            output_tokens_requested=output,
            send_s=send,
            token_s=tuple(float(i) for i in range(output)),
            end_s=send + 1,
            status=RequestStatus.OK,
        )

    # The trial's log holds the warm-up and two rounds of (chat 92+160, chat 72+160, long 1532+8).
    records = [
        record("chat-1", 0.0, 92, 160),
        record("chat-2", 0.3, 72, 160),
        record("long", 1.0, 1532, 8),
        record("chat-1b", 9.0, 92, 160),
        record("long-b", 10.0, 1532, 8),
    ]
    joined = {r.request_id: t.task for r, t in join_server_tasks(records, tasks)}
    assert joined == {"chat-1": 9, "chat-2": 12, "long": 44, "chat-1b": 174, "long-b": 220}


def test_slot_choice_and_prompt_cache_lines_are_attached_to_the_task_they_placed() -> None:
    lines = [
        "0.01.000.000 I slot get_availabl: id  1 | task -1 | selected slot by LCP similarity, f_sim_best = 0.9 (> 0.100 thold), f_keep = 0.5",
        "0.01.000.100 I srv          load:  - found better prompt with f_keep = 0.910, f_sim = 0.880",
        "0.01.000.200 W srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 4.721 MiB)",
        "0.01.000.300 I slot launch_slot_: id  1 | task 7 | processing task, is_child = 0",
        "0.02.000.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1",
        "0.02.000.100 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0",
    ]
    reused, fresh = parse_llama_server_log(lines)
    assert (reused.slot_selection, reused.prompt_cache_hit, reused.prompt_cache_evictions) == ("LCP", True, 1)
    assert (fresh.slot_selection, fresh.prompt_cache_hit, fresh.prompt_cache_evictions) == ("LRU", False, 0)


def test_the_real_log_shows_which_tasks_reused_a_slots_prefix() -> None:
    tasks = {t.task: t for t in parse_llama_server_log((DATA / "llama-server-trial.log").read_text().splitlines())}
    assert tasks[174].slot_selection == "LCP" and tasks[9].slot_selection == "LRU"
