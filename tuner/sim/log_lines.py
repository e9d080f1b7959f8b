"""The simulated server's log lines, in llama-server's shape: the timestamp, the startup lines, a long
prefill's progress, a stream's rates, a finished task's timings and its slot's release; and the final
chunk's `timings`. Times come in the model's seconds; rates and durations are shown on the wall clock,
`speed` times slower, so that the server's figures and the client's agree."""

from __future__ import annotations

from tuner.sim.inputs import SimSettings
from tuner.sim.slots import SimTask

__all__ = [
    "format_log_line",
    "progress_line",
    "rate_line",
    "release_line",
    "startup_lines",
    "task_timings",
    "timing_lines",
]

_PROGRESS_AFTER_S = 3.0  # prefill progress lines start after 3 s of prefill
_RATE_EVERY_S = 3.0  # the n_gen / tg / tg_3s line: after 100 tokens, at most every 3 s
_RATE_AFTER_TOKENS = 100


def format_log_line(at_s: float, line: str) -> str:
    """`M.SS.mmm.uuu ` + line, llama-server's timestamp: minutes, seconds, ms and µs since start."""
    micros = max(0, round(at_s * 1e6))
    minutes, micros = divmod(micros, 60_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    millis, micros = divmod(micros, 1000)
    return f"{minutes}.{seconds:02d}.{millis:03d}.{micros:03d} {line}"


def startup_lines(settings: SimSettings) -> list[str]:
    s = settings
    return [
        "I srv    load_model: loading model 'simulated'",
        f"I srv    load_model: initializing, n_slots = {s.n_parallel}, n_ctx_slot = {s.n_ctx_slot}, "
        f"kv_unified = '{str(s.kv_unified).lower()}'",
    ]


def progress_line(task: SimTask, at: float, speed: float) -> str | None:
    """A prefill's progress at `at`, once it has run for 3 s of the model's time; None before."""
    assert task.prefill_start_s is not None
    elapsed = at - task.prefill_start_s
    if elapsed < _PROGRESS_AFTER_S:
        return None
    done = task.n_past - task.n_cached
    rate = done / elapsed * speed if elapsed > 0 else 0.0
    elapsed /= speed
    assert task.slot is not None
    return (
        f"I slot print_timing: id {task.slot:2d} | task {task.id} | prompt processing, "
        f"n_tokens = {task.n_past:6d}, progress = {task.n_past / len(task.prompt):.2f}, "
        f"t = {elapsed:6.2f} s / {rate:.2f} tokens per second"
    )


def rate_line(task: SimTask, at: float, speed: float) -> str | None:
    """A stream's rates once it has 100 tokens, at most every 3 s since the last (`task.rate_mark`); None
    where none is due."""
    n_gen = len(task.generated)
    if n_gen < _RATE_AFTER_TOKENS:
        return None
    mark = task.rate_mark or (task.token_s[0], 1)
    if task.rate_mark is not None and at - mark[0] < _RATE_EVERY_S:
        return None
    first = task.token_s[0]
    tg = (n_gen - 1) / (at - first) * speed if at > first else 0.0
    tg_3s = (n_gen - mark[1]) / (at - mark[0]) * speed if at > mark[0] else 0.0
    return (
        f"I slot print_timing: id {task.slot:2d} | task {task.id} | n_gen = {n_gen:6d}, "
        f"tg = {tg:6.2f} t/s, tg_3s = {tg_3s:6.2f} t/s"
    )


def timing_lines(task: SimTask, speed: float) -> list[str]:
    """A finished task's prompt eval, eval and total times."""
    assert task.slot is not None and task.prefill_start_s is not None
    first, last = task.token_s[0], task.token_s[-1]
    prompt_ms = (first - task.prefill_start_s) * 1000 / speed
    eval_ms = (last - first) * 1000 / speed
    prompt_n = len(task.prompt) - task.n_cached
    n_gen = len(task.generated)
    slot, tid = task.slot, task.id

    def rate(ms: float, n: int) -> tuple[float, float]:
        return (ms / n if n else 0.0), (1000 * n / ms if ms > 0 else 0.0)

    p_per, p_rate = rate(prompt_ms, prompt_n)
    e_per, e_rate = rate(eval_ms, n_gen)
    prefix = f"I slot print_timing: id {slot:2d} | task {tid} |"
    return [
        f"{prefix} prompt eval time = {prompt_ms:10.2f} ms / {prompt_n:5d} tokens ({p_per:8.2f} ms per token, "
        f"{p_rate:8.2f} tokens per second)",
        f"{prefix}        eval time = {eval_ms:10.2f} ms / {n_gen:5d} tokens ({e_per:8.2f} ms per token, "
        f"{e_rate:8.2f} tokens per second)",
        f"{prefix}       total time = {prompt_ms + eval_ms:10.2f} ms / {prompt_n + n_gen:5d} tokens",
    ]


def release_line(slot: int, task: SimTask, held: int) -> str:
    return (
        f"I slot      release: id {slot:2d} | task {task.id} | stop processing: n_tokens = {held}, "
        f"truncated = {int(task.truncated)}"
    )


def task_timings(task: SimTask, speed: float) -> dict[str, float | int]:
    """The final chunk's `timings`, in milliseconds of the wall clock."""
    if not task.token_s or task.prefill_start_s is None:
        return {"cache_n": task.n_cached, "prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 0, "predicted_ms": 0.0}
    prompt_ms = (task.token_s[0] - task.prefill_start_s) * 1000 / speed
    predicted_ms = (task.token_s[-1] - task.token_s[0]) * 1000 / speed
    prompt_n = len(task.prompt) - task.n_cached
    n = len(task.generated)
    return {
        "cache_n": task.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (n - 1) if n > 1 else 0.0,
        "predicted_per_second": 1000 * (n - 1) / predicted_ms if predicted_ms > 0 else 0.0,
    }
