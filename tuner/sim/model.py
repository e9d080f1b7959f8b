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

The loop is here; what it runs on (`inputs.py`), its requests and slots (`slots.py`), the prompt caches
(`prompt_cache.py`) and its log lines (`log_lines.py`) are modules beside it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.sim.inputs import CostModel, NoiseModel, SimSettings, load_cost_model
from tuner.sim.log_lines import (
    format_log_line,
    progress_line,
    rate_line,
    release_line,
    startup_lines,
    task_timings,
    timing_lines,
)
from tuner.sim.prompt_cache import CacheEntry, LogSink, lcp, select_slot, update_ram_cache
from tuner.sim.slots import SimTask, Slot, answer_tokens

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
        self.slots = [Slot(id=i) for i in range(settings.n_parallel)]
        self.queue: list[SimTask] = []
        self.ram_cache: list[CacheEntry] = []
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
            slot = select_slot(idle, task, now, cache_prompt=self.settings.cache_prompt, log=self._log)
            self._launch(slot, task, now)

    def _fits_unified(self, task: SimTask) -> bool:
        held = sum(len(s.task.prompt) + s.task.n_predict for s in self.slots if s.task is not None)
        return held + len(task.prompt) + task.n_predict <= self.settings.ctx_size or held == 0

    def _launch(self, slot: Slot, task: SimTask, now: float) -> None:
        settings = self.settings
        if settings.cache_ram != 0 and settings.cache_prompt:
            kv = self.cost.kv_bytes_per_token
            restored = update_ram_cache(
                self.ram_cache, slot, task, now, settings=settings, kv_bytes_per_token=kv, log=self._log
            )
            if restored:
                self._pending_cost_s += restored * self.cost.restore_s_per_token
        if settings.kv_unified:
            # Under one shared KV buffer the idle slots are cleared when a task starts (saved above).
            for other in self.slots:
                if other.task is None and other is not slot:
                    other.cache, other.cache_lora = (), ()
        cached = lcp(slot.cache, task.prompt) if settings.cache_prompt and slot.cache_lora == task.lora else 0
        cached = min(cached, len(task.prompt) - 1)  # at least one token is evaluated
        self._uses += 1
        slot.task, slot.last_used = task, self._uses
        task.slot, task.launch_s, task.n_cached, task.n_past = slot.id, now, cached, cached
        self._log(now, f"I slot launch_slot_: id {slot.id:2d} | task {task.id} | processing task, is_child = 0")
        self.counters.prompt_tokens_cached += cached

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
            pass_s = cost.forward_s(width, per_context * width) + cost.slot_s * len(self.slots)
            seconds += pass_s * self._lognormal(self._iteration_sigma)
        sampled = len(batch.decoding) + sum(1 for t, take in batch.chunks if t.n_past + take == len(t.prompt))
        return (seconds + cost.sample_s * sampled) * self._restart_factor

    def _log_progress(self, task: SimTask, at: float) -> None:
        line = progress_line(task, at, self.speed)
        if line is not None:
            self._log(at, line)

    def _emit(self, task: SimTask, at: float) -> None:
        token = task.answer[len(task.generated)]
        task.generated.append(token)
        task.token_s.append(at)
        self.counters.tokens_predicted += 1
        n_gen = len(task.generated)
        assert task.slot is not None
        line = rate_line(task, at, self.speed)
        if line is not None:
            self._log(at, line)
            task.rate_mark = (at, n_gen)
        held = task.n_past + n_gen - 1
        if n_gen >= task.n_predict or held + 1 >= self.settings.n_ctx_slot:
            task.truncated = n_gen < task.n_predict
            task.done, task.finished_s = True, at
            self.completed_in_last_step = True
            self._finish(task, at)

    def _finish(self, task: SimTask, at: float) -> None:
        for line in timing_lines(task, self.speed):
            self._log(at, line)
        self._release(task, at)

    def _release(self, task: SimTask, at: float) -> None:
        assert task.slot is not None
        slot = self.slots[task.slot]
        held = task.n_past + max(0, len(task.generated) - 1)
        self._log(at, release_line(slot.id, task, held))
        slot.cache = (task.prompt + tuple(task.generated[:-1]))[:held] if self.settings.cache_prompt else ()
        slot.cache_lora = task.lora
        slot.task = None

    def timings(self, task: SimTask) -> dict[str, float | int]:
        """The final chunk's `timings`, in milliseconds of the wall clock."""
        return task_timings(task, self.speed)

    def startup_lines(self) -> list[str]:
        return startup_lines(self.settings)
