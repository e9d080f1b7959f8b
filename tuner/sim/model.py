"""llama-server's loop as a model: what each iteration computes and how long it takes, on its own clock.

What is modelled (serving-engines.md §1.6), each part switchable through `SimSettings`/`CostModel`:

- one iteration takes at most `n_batch` tokens: first one decode token per generating slot, then prompt
  chunks of the slots still prefilling, in slot order; the batch is computed in `n_ubatch` pieces;
- an iteration's time comes from a calibrated cost model: a fixed cost per forward pass (reading the
  weights), a cost per token that depends on the pass's width, a cost per token of context attended to,
  and a sampling cost per generating slot (`CostModel`, fitted by `scripts/calibrate_sim.py`);
- slots (`n_parallel`), context per slot (`ctx_size / n_parallel`, or all of it with `kv_unified`), the
  slot's own prompt cache (longest common prefix, slot chosen by LCP similarity or least recently used)
  and the host-RAM prompt cache (`cache_ram` MiB) with oldest-first eviction;
- LoRA: slots whose adapter settings differ are not batched together, and a change of the applied
  setting costs a switch;
- noise: a factor drawn once per server start (restart to restart) and one per forward pass (run to
  run), both seeded.

Answers are a function of the prompt and the adapters only, never of the batch settings, as on a real
server with greedy sampling: the correctness gate sees the same answers for every config.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "CostModel",
    "NoiseModel",
    "SimSettings",
    "SimTask",
    "SimulatedLlamaServer",
    "answer_tokens",
    "format_log_line",
    "load_cost_model",
]

_CALIBRATION = "calibration.json"
_SIMILARITY_THRESHOLD = 0.1  # -sps, llama-server's default
_PROGRESS_AFTER_S = 3.0  # prefill progress lines start after 3 s of prefill
_RATE_EVERY_S = 3.0  # the n_gen / tg / tg_3s line: after 100 tokens, at most every 3 s
_RATE_AFTER_TOKENS = 100
_TOKEN_RANGE = (100, 30000)

LogSink = Callable[[float, str], None]  # (wall-clock seconds since start, line without its timestamp)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Seconds of one forward pass of `k` tokens: `pass_s + k * token_s(k) + context_s * context / 1000`.

    `token_s` is measured at a few widths and interpolated on log(k): narrow passes (decode) cost more per
    token than wide ones (prefill), and micro-batches below about 64 tokens lose the wide kernels' speed.
    """

    pass_s: float = 0.008
    token_points: tuple[tuple[int, float], ...] = ((1, 0.0025), (4, 0.002), (32, 0.0085), (64, 0.0052), (512, 0.0052))
    context_s: float = 0.0006  # per computed token, per 1,000 tokens of context it attends to
    sample_s: float = 0.0005  # per generating slot and iteration
    lora_switch_s: float = 0.01  # applying another adapter setting to the context
    restore_s_per_token: float = 2e-6  # copying a prompt from the host-RAM cache into a slot
    kv_bytes_per_token: int = 23040  # SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x f16
    load_s: float = 0.35  # model load at start

    def token_s(self, width: int) -> float:
        points = self.token_points
        if width <= points[0][0]:
            return points[0][1]
        if width >= points[-1][0]:
            return points[-1][1]
        widths = [w for w, _ in points]
        right = bisect.bisect_left(widths, width)
        (w0, c0), (w1, c1) = points[right - 1], points[right]
        share = (math.log(width) - math.log(w0)) / (math.log(w1) - math.log(w0))
        return c0 + share * (c1 - c0)

    def forward_s(self, width: int, context_tokens: float) -> float:
        """One pass of `width` tokens whose contexts add up to `context_tokens`."""
        return self.pass_s + width * self.token_s(width) + self.context_s * context_tokens / 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "pass_s": self.pass_s,
            "token_points": [list(p) for p in self.token_points],
            "context_s": self.context_s,
            "sample_s": self.sample_s,
            "lora_switch_s": self.lora_switch_s,
            "restore_s_per_token": self.restore_s_per_token,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "load_s": self.load_s,
        }

    @classmethod
    def from_json(cls, data: object) -> CostModel:
        """The constants as `to_json` writes them, every one present: a file that leaves one out or adds an
        unknown one (a typo) must not run on the shipped defaults without a word. `ValueError` names it."""
        if not isinstance(data, dict):
            raise ValueError(f"the cost model is a JSON object of constants, not {type(data).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown, missing = sorted(set(data) - fields), sorted(fields - set(data))
        if unknown or missing:
            raise ValueError(f"unknown constant {unknown[0]!r}" if unknown else f"constant {missing[0]!r} is missing")
        constants: dict[str, Any] = {}
        for name in sorted(fields - {"token_points"}):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")
            if name == "kv_bytes_per_token" and not isinstance(value, int):
                raise ValueError(f"kv_bytes_per_token must be a whole number of bytes, got {value!r}")
            constants[name] = value if name == "kv_bytes_per_token" else float(value)
        points = data["token_points"]
        if not isinstance(points, list) or not points or not all(_is_point(p) for p in points):
            raise ValueError("token_points must be a non-empty list of [width >= 1, seconds per token > 0]")
        widths = [int(w) for w, _ in points]
        if widths != sorted(set(widths)):
            raise ValueError("token_points' widths must increase")
        return cls(token_points=tuple((int(w), float(c)) for w, c in points), **constants)


def _is_point(point: object) -> bool:
    if not isinstance(point, list) or len(point) != 2:
        return False
    width, cost = point
    return (
        isinstance(width, int)
        and not isinstance(width, bool)
        and width >= 1
        and isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and cost > 0
    )


def load_cost_model(path: Path | None = None) -> CostModel:
    """The fitted constants: from `path`, or the ones calibrated on a 2-core CPU and shipped with the package.
    `ValueError` with one line for a file that cannot be read or is not such a calibration."""
    where = str(path) if path is not None else "the shipped calibration"
    try:
        text = path.read_text() if path is not None else resources.files("tuner.sim").joinpath(_CALIBRATION).read_text()
        data = json.loads(text)
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
    try:
        return CostModel.from_json(data.get("cost_model", data) if isinstance(data, dict) else data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class NoiseModel:
    """Multiplicative noise, log-normal: `restart` once per server start, `iteration` per forward pass."""

    restart: float = 0.0
    iteration: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    """The server settings the model reads, with llama-server's defaults."""

    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 4
    ctx_size: int = 4096
    kv_unified: bool = True  # llama-server turns it on when -np is left to auto
    cache_ram: int = 8192  # MiB; -1 no limit, 0 off
    cache_prompt: bool = True
    cont_batching: bool = True
    verbosity: int = 3
    lora_adapters: tuple[str, ...] = ()  # paths, in id order
    lora_scales: tuple[float, ...] = ()  # global scales, used by a request without `lora`

    @property
    def micro_batch(self) -> int:
        return max(1, min(self.n_ubatch, self.n_batch))

    @property
    def n_ctx_slot(self) -> int:
        return self.ctx_size if self.kv_unified else max(1, self.ctx_size // self.n_parallel)


def format_log_line(at_s: float, line: str) -> str:
    """`M.SS.mmm.uuu ` + line, llama-server's timestamp: minutes, seconds, ms and µs since start."""
    micros = max(0, round(at_s * 1e6))
    minutes, micros = divmod(micros, 60_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    millis, micros = divmod(micros, 1000)
    return f"{minutes}.{seconds:02d}.{millis:03d}.{micros:03d} {line}"


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n and a[:n] == b[:n]:
        return n
    low, high = 0, n  # binary search on prefix equality: prompts run to thousands of tokens
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _stable_hash(values: Sequence[int], salt: str) -> int:
    return zlib.crc32(array("q", values).tobytes(), zlib.crc32(salt.encode()))


def answer_tokens(prompt: Sequence[int], lora: tuple[tuple[int, float], ...], count: int) -> list[int]:
    """The answer a greedy server gives: a function of the prompt and the adapters only."""
    state = _stable_hash(prompt, repr(lora))
    low, high = _TOKEN_RANGE
    out = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(low + (state >> 33) % (high - low))
    return out


@dataclass(kw_only=True, eq=False)
class SimTask:
    """One request inside the server."""

    id: int
    prompt: tuple[int, ...]
    n_predict: int
    lora: tuple[tuple[int, float], ...]  # (adapter id, scale), sorted, zero scales left out
    arrival_s: float
    slot: int | None = None
    launch_s: float | None = None
    n_cached: int = 0
    n_past: int = 0  # prompt tokens in the slot, cached ones included
    prefill_start_s: float | None = None
    answer: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    token_s: list[float] = field(default_factory=list)  # model time of each generated token
    done: bool = False
    truncated: bool = False
    error: str | None = None
    finished_s: float | None = None
    rate_mark: tuple[float, int] | None = None  # (time, n_gen) of the last tg_3s line
    progress_logged: bool = False

    @property
    def prefilling(self) -> bool:
        return not self.done and self.slot is not None and self.n_past < len(self.prompt)

    @property
    def generating(self) -> bool:
        return not self.done and self.slot is not None and self.n_past >= len(self.prompt)


@dataclass(kw_only=True)
class _Slot:
    id: int
    cache: tuple[int, ...] = ()
    cache_lora: tuple[tuple[int, float], ...] = ()
    task: SimTask | None = None
    last_used: int = -1


@dataclass(kw_only=True)
class _CacheEntry:
    tokens: tuple[int, ...]
    lora: tuple[tuple[int, float], ...]

    def mib(self, kv_bytes_per_token: int) -> float:
        return len(self.tokens) * kv_bytes_per_token / 2**20


@dataclass(kw_only=True)
class _Batch:
    lora: tuple[tuple[int, float], ...] | None = None
    decoding: list[SimTask] = field(default_factory=list)
    chunks: list[tuple[SimTask, int]] = field(default_factory=list)
    count: int = 0
    context: float = 0.0  # context tokens attended to, summed over the batch's tokens


@dataclass
class Counters:
    """What `/metrics` reports."""

    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prompt_seconds: float = 0.0
    tokens_predicted: int = 0
    tokens_predicted_seconds: float = 0.0
    n_decode: int = 0
    n_tokens_max: int = 0
    busy_slots_sum: int = 0


class SimulatedLlamaServer:
    """The loop. `submit` hands it a request; `step(now)` runs one iteration (or, with `horizon_s`, every
    iteration up to the next outside event) and returns when it ended. Times are the model's seconds."""

    def __init__(
        self,
        settings: SimSettings,
        *,
        cost: CostModel,
        noise: NoiseModel,
        seed: int,
        log: LogSink | None = None,
        speed: float = 1.0,
    ) -> None:
        self.settings = settings
        # The log, `timings` and the rates in log lines are on the wall clock, `speed` times faster than
        # the model's, so that the server's figures and the client's agree; the log's thresholds (3 s of
        # prefill, 3 s between rate lines) stay the model's, so a line comes where the real server's would.
        self.speed = speed
        self.cost = cost
        self._random = random.Random(seed)
        self._restart_factor = self._lognormal(noise.restart)
        self._iteration_sigma = noise.iteration
        sink: LogSink = log or (lambda _at, _line: None)
        self._log: LogSink = lambda at, line: sink(at / speed, line)
        self.completed_in_last_step = False
        self.slots = [_Slot(id=i) for i in range(settings.n_parallel)]
        self.queue: list[SimTask] = []
        self.ram_cache: list[_CacheEntry] = []
        self.counters = Counters()
        self._next_task = 0
        self._uses = 0
        self._applied_lora: tuple[tuple[int, float], ...] | None = None
        self._pending_cost_s = 0.0

    # --- requests -------------------------------------------------------------------------------------

    def normalize_lora(self, requested: Sequence[tuple[int, float]] | None) -> tuple[tuple[int, float], ...]:
        """A request's adapter setting: its own list (unlisted adapters at 0) or the global scales."""
        pairs = list(enumerate(self.settings.lora_scales)) if requested is None else list(requested)
        return tuple(sorted((i, float(s)) for i, s in pairs if s != 0.0))

    def submit(
        self, prompt: Sequence[int], n_predict: int, *, now: float, lora: Sequence[tuple[int, float]] | None = None
    ) -> SimTask:
        limit = self.settings.n_ctx_slot
        # -1 (or any negative) generates until the slot's context is full, as on the real server; a larger
        # request stops there too, so no answer is ever longer than the context.
        room = max(1, limit - len(prompt))
        task = SimTask(
            id=self._next_task,
            prompt=tuple(prompt),
            n_predict=room if n_predict < 0 else max(1, min(n_predict, room)),
            lora=self.normalize_lora(lora),
            arrival_s=now,
        )
        # Task ids advance by more than one per request on the real server (it counts internal tasks too).
        self._next_task += 1 + task.n_predict // 50
        if len(task.prompt) >= limit:
            task.error = (
                f"request ({len(task.prompt)} tokens) exceeds the available context size ({limit} tokens), "
                "try increasing it"
            )
            task.done, task.finished_s = True, now
            self._log(now, f"E srv    send_error: task id = {task.id}, error: {task.error}")
            return task
        task.answer = answer_tokens(task.prompt, task.lora, task.n_predict)
        self.queue.append(task)
        return task

    def cancel(self, task: SimTask, *, now: float) -> None:
        """The client went away: the slot is released at the next iteration."""
        if task in self.queue:
            self.queue.remove(task)
        if not task.done:
            task.done, task.finished_s = True, now
            if task.slot is not None:
                self.completed_in_last_step = True
                self._release(task, now)

    @property
    def busy(self) -> bool:
        return bool(self.queue) or any(s.task is not None for s in self.slots)

    # --- the loop -------------------------------------------------------------------------------------

    def step(self, now: float, *, horizon_s: float | None = None) -> float | None:
        """One iteration from `now`; None if there is nothing to do. With `horizon_s`, iterations that
        only decode run on to the horizon in one call (the virtual replay's shortcut: nothing outside can
        change them)."""
        self._assign_slots(now)
        active = [s.task for s in self.slots if s.task is not None]
        if not active:
            return None
        self.completed_in_last_step = False
        end = self._iteration(now)
        if horizon_s is not None:
            while end < horizon_s and not self.completed_in_last_step and not self.queue and self._decode_only():
                end = self._iteration(end)
        return end

    def _decode_only(self) -> bool:
        tasks = [s.task for s in self.slots if s.task is not None]
        return bool(tasks) and all(t.generating for t in tasks)

    def _lognormal(self, sigma: float) -> float:
        return math.exp(self._random.gauss(0.0, sigma)) if sigma > 0 else 1.0

    def _assign_slots(self, now: float) -> None:
        while self.queue:
            idle = [s for s in self.slots if s.task is None]
            if not idle:
                return
            task = self.queue[0]
            if self.settings.kv_unified and not self._fits_unified(task):
                return
            self.queue.pop(0)
            slot = self._select_slot(idle, task, now)
            self._launch(slot, task, now)

    def _fits_unified(self, task: SimTask) -> bool:
        held = sum(len(s.task.prompt) + s.task.n_predict for s in self.slots if s.task is not None)
        return held + len(task.prompt) + task.n_predict <= self.settings.ctx_size or held == 0

    def _select_slot(self, idle: list[_Slot], task: SimTask, now: float) -> _Slot:
        best, best_sim = None, 0.0
        if self.settings.cache_prompt:
            for slot in idle:
                if slot.cache and slot.cache_lora == task.lora:
                    similarity = _lcp(slot.cache, task.prompt) / len(task.prompt)
                    if similarity > best_sim:
                        best, best_sim = slot, similarity
        if best is not None and best_sim > _SIMILARITY_THRESHOLD:
            keep = _lcp(best.cache, task.prompt) / len(best.cache)
            self._log(
                now,
                f"I slot get_availabl: id {best.id:2d} | task -1 | selected slot by LCP similarity, "
                f"f_sim_best = {best_sim:.3f} (> {_SIMILARITY_THRESHOLD:.3f} thold), f_keep = {keep:.3f}",
            )
            return best
        # Least recently used; among slots never used, the highest id (llama-server's `<=` scan): a request
        # that arrives later gets a lower slot, and slots are filled with prompt tokens in id order.
        chosen = min(idle, key=lambda s: (s.last_used, -s.id))
        self._log(
            now, f"I slot get_availabl: id {chosen.id:2d} | task -1 | selected slot by LRU, t_last = {chosen.last_used}"
        )
        return chosen

    def _launch(self, slot: _Slot, task: SimTask, now: float) -> None:
        settings = self.settings
        if settings.cache_ram != 0 and settings.cache_prompt:
            self._update_ram_cache(slot, task, now)
        if settings.kv_unified:
            # Under one shared KV buffer the idle slots are cleared when a task starts (saved above).
            for other in self.slots:
                if other.task is None and other is not slot:
                    other.cache, other.cache_lora = (), ()
        cached = _lcp(slot.cache, task.prompt) if settings.cache_prompt and slot.cache_lora == task.lora else 0
        cached = min(cached, len(task.prompt) - 1)  # at least one token is evaluated
        self._uses += 1
        slot.task, slot.last_used = task, self._uses
        task.slot, task.launch_s, task.n_cached, task.n_past = slot.id, now, cached, cached
        self._log(now, f"I slot launch_slot_: id {slot.id:2d} | task {task.id} | processing task, is_child = 0")
        self.counters.prompt_tokens_cached += cached

    def _update_ram_cache(self, slot: _Slot, task: SimTask, now: float) -> None:
        settings, kv = self.settings, self.cost.kv_bytes_per_token
        verbose = settings.verbosity >= 4
        if verbose:
            self._log(now, "I srv  get_availabl: updating prompt cache")
        if slot.cache and not any(e.tokens == slot.cache and e.lora == slot.cache_lora for e in self.ram_cache):
            entry = _CacheEntry(tokens=slot.cache, lora=slot.cache_lora)
            if verbose:
                self._log(
                    now,
                    f"I srv   prompt_save:  - saving prompt with length {len(slot.cache)}, total state size = "
                    f"{entry.mib(kv):.3f} MiB (draft: 0.000 MiB)",
                )
            self.ram_cache.append(entry)
            limit = settings.cache_ram
            while limit > 0 and len(self.ram_cache) > 1 and sum(e.mib(kv) for e in self.ram_cache) > limit:
                evicted = self.ram_cache.pop(0)
                self._log(
                    now,
                    f"W srv        update:  - cache size limit reached, removing oldest entry (size = "
                    f"{evicted.mib(kv):.3f} MiB)",
                )
            if limit > 0 and self.ram_cache and self.ram_cache[0].mib(kv) > limit:
                self.ram_cache.clear()
        own = _lcp(slot.cache, task.prompt) if slot.cache_lora == task.lora else 0
        best, best_lcp = None, own
        for entry in self.ram_cache:
            if entry.lora == task.lora:
                common = _lcp(entry.tokens, task.prompt)
                if common > best_lcp:
                    best, best_lcp = entry, common
        if best is not None:
            if verbose:
                self._log(
                    now,
                    f"I srv          load:  - found better prompt with f_keep = {best_lcp / len(best.tokens):.3f}, "
                    f"f_sim = {best_lcp / len(task.prompt):.3f}",
                )
            slot.cache, slot.cache_lora = best.tokens, best.lora
            self._pending_cost_s += len(best.tokens) * self.cost.restore_s_per_token
        if verbose:
            total = sum(e.mib(kv) for e in self.ram_cache)
            self._log(now, f"I srv        update:  - cache state: {len(self.ram_cache)} prompts, {total:.3f} MiB")

    def _iteration(self, now: float) -> float:
        batch = self._build_batch()
        if batch.count == 0:
            return now
        seconds = self._batch_seconds(batch)
        end = now + seconds
        counters = self.counters
        counters.n_decode += 1
        counters.n_tokens_max = max(counters.n_tokens_max, batch.count)
        counters.busy_slots_sum += len(batch.decoding) + len(batch.chunks)
        for task, take in batch.chunks:
            if task.prefill_start_s is None:
                task.prefill_start_s = now
            task.n_past += take
            counters.prompt_tokens += take
            counters.prompt_seconds += seconds * take / batch.count
            if task.n_past == len(task.prompt):
                self._emit(task, end)
            else:
                self._log_progress(task, end)
        for task in batch.decoding:
            counters.tokens_predicted_seconds += seconds / batch.count
            self._emit(task, end)
        return end

    def _build_batch(self) -> _Batch:
        """serving-engines.md §1.6: a token per generating slot, then prompt chunks up to n_batch, all of one
        adapter setting (the first slot's, in id order)."""
        batch = _Batch()
        for slot in self.slots:
            task = slot.task
            if task is None or not task.generating:
                continue
            if batch.lora is None:
                batch.lora = task.lora
            elif task.lora != batch.lora:
                continue  # can_batch_with: another adapter setting waits for a later iteration
            batch.decoding.append(task)
            batch.count += 1
            batch.context += task.n_past + len(task.generated)
        if not (self.settings.cont_batching or not batch.decoding):
            return batch
        for slot in self.slots:
            task = slot.task
            if task is None or not task.prefilling:
                continue
            if batch.lora is None:
                batch.lora = task.lora
            elif task.lora != batch.lora:
                continue
            take = min(len(task.prompt) - task.n_past, self.settings.n_batch - batch.count)
            if take <= 0:
                break
            batch.chunks.append((task, take))
            batch.count += take
            batch.context += take * task.n_past + take * (take - 1) / 2
        return batch

    def _batch_seconds(self, batch: _Batch) -> float:
        cost = self.cost
        seconds = self._pending_cost_s
        self._pending_cost_s = 0.0
        if batch.lora != self._applied_lora:
            if self._applied_lora is not None or batch.lora:
                seconds += cost.lora_switch_s
            self._applied_lora = batch.lora
        micro = self.settings.micro_batch
        full, rest = divmod(batch.count, micro)
        per_context = batch.context / batch.count
        for width in [micro] * full + ([rest] if rest else []):
            seconds += cost.forward_s(width, per_context * width) * self._lognormal(self._iteration_sigma)
        sampled = len(batch.decoding) + sum(1 for t, take in batch.chunks if t.n_past + take == len(t.prompt))
        return (seconds + cost.sample_s * sampled) * self._restart_factor

    def _log_progress(self, task: SimTask, at: float) -> None:
        assert task.prefill_start_s is not None
        elapsed = at - task.prefill_start_s
        if elapsed < _PROGRESS_AFTER_S:
            return
        done = task.n_past - task.n_cached
        rate = done / elapsed * self.speed if elapsed > 0 else 0.0
        elapsed /= self.speed
        assert task.slot is not None
        self._log(
            at,
            f"I slot print_timing: id {task.slot:2d} | task {task.id} | prompt processing, "
            f"n_tokens = {task.n_past:6d}, progress = {task.n_past / len(task.prompt):.2f}, "
            f"t = {elapsed:6.2f} s / {rate:.2f} tokens per second",
        )

    def _emit(self, task: SimTask, at: float) -> None:
        token = task.answer[len(task.generated)]
        task.generated.append(token)
        task.token_s.append(at)
        self.counters.tokens_predicted += 1
        n_gen = len(task.generated)
        assert task.slot is not None
        if n_gen >= _RATE_AFTER_TOKENS:
            mark = task.rate_mark or (task.token_s[0], 1)
            if task.rate_mark is None or at - mark[0] >= _RATE_EVERY_S:
                first = task.token_s[0]
                tg = (n_gen - 1) / (at - first) * self.speed if at > first else 0.0
                tg_3s = (n_gen - mark[1]) / (at - mark[0]) * self.speed if at > mark[0] else 0.0
                self._log(
                    at,
                    f"I slot print_timing: id {task.slot:2d} | task {task.id} | n_gen = {n_gen:6d}, "
                    f"tg = {tg:6.2f} t/s, tg_3s = {tg_3s:6.2f} t/s",
                )
                task.rate_mark = (at, n_gen)
        held = task.n_past + n_gen - 1
        if n_gen >= task.n_predict or held + 1 >= self.settings.n_ctx_slot:
            task.truncated = n_gen < task.n_predict
            task.done, task.finished_s = True, at
            self.completed_in_last_step = True
            self._finish(task, at)

    def _finish(self, task: SimTask, at: float) -> None:
        assert task.slot is not None and task.prefill_start_s is not None
        first, last = task.token_s[0], task.token_s[-1]
        prompt_ms = (first - task.prefill_start_s) * 1000 / self.speed
        eval_ms = (last - first) * 1000 / self.speed
        prompt_n = len(task.prompt) - task.n_cached
        n_gen = len(task.generated)
        slot, tid = task.slot, task.id

        def rate(ms: float, n: int) -> tuple[float, float]:
            return (ms / n if n else 0.0), (1000 * n / ms if ms > 0 else 0.0)

        p_per, p_rate = rate(prompt_ms, prompt_n)
        e_per, e_rate = rate(eval_ms, n_gen)
        prefix = f"I slot print_timing: id {slot:2d} | task {tid} |"
        self._log(
            at,
            f"{prefix} prompt eval time = {prompt_ms:10.2f} ms / {prompt_n:5d} tokens ({p_per:8.2f} ms per token, "
            f"{p_rate:8.2f} tokens per second)",
        )
        self._log(
            at,
            f"{prefix}        eval time = {eval_ms:10.2f} ms / {n_gen:5d} tokens ({e_per:8.2f} ms per token, "
            f"{e_rate:8.2f} tokens per second)",
        )
        self._log(at, f"{prefix}       total time = {prompt_ms + eval_ms:10.2f} ms / {prompt_n + n_gen:5d} tokens")
        self._release(task, at)

    def _release(self, task: SimTask, at: float) -> None:
        assert task.slot is not None
        slot = self.slots[task.slot]
        held = task.n_past + max(0, len(task.generated) - 1)
        self._log(
            at,
            f"I slot      release: id {slot.id:2d} | task {task.id} | stop processing: n_tokens = {held}, "
            f"truncated = {int(task.truncated)}",
        )
        slot.cache = (task.prompt + tuple(task.generated[:-1]))[:held] if self.settings.cache_prompt else ()
        slot.cache_lora = task.lora
        slot.task = None

    def timings(self, task: SimTask) -> dict[str, float | int]:
        """The final chunk's `timings`, in milliseconds of the wall clock."""
        speed = self.speed
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

    def startup_lines(self) -> list[str]:
        s = self.settings
        return [
            "I srv    load_model: loading model 'simulated'",
            f"I srv    load_model: initializing, n_slots = {s.n_parallel}, n_ctx_slot = {s.n_ctx_slot}, "
            f"kv_unified = '{str(s.kv_unified).lower()}'",
        ]
