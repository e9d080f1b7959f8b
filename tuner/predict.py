"""`tuner diagnose LOG --predict`: which settings would win on the log's own traffic, predicted before any
restart (issue 28). The simulated llama-server (`tuner.sim`) replays the requests the log shows (the
llama-server-log importer's workload) on its virtual clock, for every valid config of a small search space,
at a calibration fitted from the same log: the prefill speed by chunk size from its progress lines and the
decode speed by batch width from its rate lines. Every constant the log cannot determine keeps the shipped
calibration's value, and the prediction names each."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tuner.catalog import SIMULATED_KNOBS
from tuner.config import MetricConstraint, ObjectiveSpec, ParamValue, PluginSpec, SearchSpace, load_search_space
from tuner.diagnose import diagnose_log
from tuner.diagnose.report import Diagnosis, counted
from tuner.engines import create_engine
from tuner.engines.base import Engine
from tuner.engines.llama_server_log import parse_llama_server_log
from tuner.errors import ConfigError, MeasurementError
from tuner.importers.base import read_lines
from tuner.importers.llama_server_log import LlamaServerLogImporter, LlamaServerLogOptions
from tuner.metrics import compute_metrics
from tuner.models import TaskTimeline
from tuner.prediction_record import PredictedFigures, PredictionRecord
from tuner.scoring import min_effect, score_round
from tuner.sim.inputs import CostModel, NoiseModel, SimSettings, load_cost_model
from tuner.sim.model import SimulatedLlamaServer
from tuner.sim.virtual import replay_virtual
from tuner.workloads.synthesis import synthesize_sessions
from tuner.workloads.trace import Trace

__all__ = [
    "Calibration",
    "PredictedConfig",
    "Prediction",
    "StudyTraffic",
    "calibrate_from_log",
    "check_prediction_log",
    "check_prediction_space",
    "predict",
    "prediction_json",
    "prediction_record",
]

# llama-server's default micro-batch: the log shows the chunk an iteration prefilled (n_batch), not the
# passes it took, so a chunk's cost is laid on passes of this width.
ASSUMED_N_UBATCH = 512
# Run-to-run noise like a shared 2-core machine's (the simulated demo's): 5% per start, 10% per forward pass.
_NOISE = NoiseModel(restart=0.05, iteration=0.1)
# The diagnose study's constraint: a config that prefills long prompts under 80% of the baseline's speed
# is not a winner, whatever its streams gain.
_MIN_PREFILL_VS_BASELINE = 0.8
# A prompt this long times the server's prefill (a shorter one, mostly its fixed costs).
_TIMED_PROMPT_TOKENS = 256
# Configs replayed at most: a larger space is for the study's sampler, not a grid.
_GRID_LIMIT = 200
_METRICS = ("stall_tok_s", "ttft_p95_s", "prefill_tok_s")
_MODELLED = SIMULATED_KNOBS
# More requests than this in a log take minutes a config: cut the log to its busy hour first.
MAX_REQUESTS = 1000
_DEFAULT_SPACE = {"n_batch": (32, 64, 128, 256, 512, 1024, 2048), "n_ubatch": (32, 64, 128, 256, 512, 1024, 2048)}


@dataclass(frozen=True)
class Calibration:
    cost: CostModel
    prefill_factor: float  # the log's server's prefill costs over the shipped calibration's
    decode_factor: float  # and its decode costs
    fitted: list[str]  # the figures of the log that gave it, one line each
    kept: list[str]  # the constants it cannot determine, at the shipped calibration's values


@dataclass(frozen=True)
class PredictedConfig:
    settings: dict[str, ParamValue]
    median: dict[str, float | None]  # over the simulator's seeds
    spread: dict[str, tuple[float, float] | None]  # min and max over them
    baseline: bool
    eligible: bool  # keeps the study's constraints; without a study, prefill at or above 80% of the baseline's
    score: float | None = None  # a study's: its score against the baseline's predicted figures


@dataclass(frozen=True)
class Prediction:
    calibration: Calibration
    requests: int
    seeds: int
    configs: list[PredictedConfig]  # best first, the baseline where it ranks
    best: PredictedConfig | None  # None: none beats the baseline (its stall speed; by a study's score, see why_none)
    ranked_by: Literal["stall", "score"] = "stall"  # "score": by a study's objectives and constraints
    why_none: str | None = None  # ranked by the score: why no config is the predicted best


def calibrate_from_log(
    diagnosis: Diagnosis, tasks: Sequence[TaskTimeline] = (), shipped: CostModel | None = None
) -> Calibration:
    """The shipped calibration's costs scaled by two factors: how much slower (or faster) this log's server
    prefilled, and decoded, than the shipped costs give for the same work (`CostModel.scaled`). Prefill is
    timed by each prompt of at least _TIMED_PROMPT_TOKENS new tokens (its `prompt eval time`, in chunks of
    n_batch and passes of ASSUMED_N_UBATCH) and the prefill speed by chunk size; decode by the fastest decode
    of at least 8 tokens (its `eval time`, taken as one stream alone) and the decode speed by batch width.
    Each factor is the median of its figures (the other's, where the log times none); the prefill's comes
    from whole prompts where the log times any, since a prompt's time holds its attention to the tokens
    before each chunk and a chunk's speed alone does not say how deep it ran. How cost changes with a pass's
    width within each, and attention's share of it, the shipped calibration's. One factor for both would be
    wrong by the ratio of the two: a GPU prefills 16 times faster than it decodes, the shipped CPU calibration 2
    times (bench/predict_case_study.py)."""
    cost = shipped or load_cost_model()
    n_batch = diagnosis.server.n_batch or 2048
    prefill: list[float] = []
    chunks: list[float] = []  # a chunk's speed depends on how deep in its prompt it ran: used without prompts
    decode: list[float] = []
    fitted: list[str] = []
    prompts = [t for t in tasks if t.prompt_n and t.prompt_ms and t.prompt_n >= _TIMED_PROMPT_TOKENS]
    for task in prompts:
        assert task.prompt_n is not None and task.prompt_ms is not None
        prefill.append(task.prompt_ms / 1000.0 / _prefill_s(cost, task.prompt_n, n_batch))
    if prompts:
        low, high = min(prefill), max(prefill)
        span = f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"
        fitted.append(
            f"prefill: {counted(len(prompts), 'prompt')} of {_TIMED_PROMPT_TOKENS}+ new tokens (prompt eval time): "
            f"{span} the shipped costs"
        )
    decodes = [t.eval_n * 1000.0 / t.eval_ms for t in tasks if t.eval_n and t.eval_ms and t.eval_n >= 8]
    if decodes:
        fastest = max(decodes)
        decode.append((1.0 / fastest) / (cost.forward_s(1, 0.0) + cost.sample_s))
        fitted.append(f"decode: the fastest, {fastest:.1f} tok/s (eval time), as one stream: {decode[-1]:.2f}x")
    for figure in diagnosis.profile:
        if figure.value is None or figure.value <= 0:
            continue
        if figure.name.startswith("prefill_tok_s_chunk_"):
            size = int(figure.name.rsplit("_", 1)[1])
            width = min(size, ASSUMED_N_UBATCH)
            measured, shipped_s = size / figure.value, math.ceil(size / width) * cost.forward_s(width, 0.0)
            what, factors = f"prefill: {figure.value:.1f} tok/s in chunks of up to {size}", chunks
        elif figure.name.startswith("decode_tok_s_width_"):
            width = int(figure.name.rsplit("_", 1)[1])
            measured, shipped_s = 1.0 / figure.value, cost.forward_s(width, 0.0) + cost.sample_s * width
            what, factors = f"decode: {figure.value:.1f} tok/s a stream with {width} decoding", decode
        else:
            continue
        factors.append(measured / shipped_s)
        fitted.append(f"{what} ({figure.label.rsplit('(', 1)[-1]}: {measured / shipped_s:.2f}x the shipped costs")
    kept = [
        "how a pass's cost changes with its width, within prefill and within decode, attention's share of it, a "
        "prompt cache's copy and a model's load: the shipped calibration's (SmolLM2-135M on a 2-core CPU), scaled",
        f"n_ubatch {ASSUMED_N_UBATCH} for the log's server (llama-server's default: the log shows chunks, not passes)",
    ]
    if prompts and chunks:
        fitted.append("prefill: the prompts set its level; a chunk's speed depends on its depth in the prompt")
    prefill = prefill or chunks
    if not prefill and not decode:
        kept.insert(0, "the costs' level: the log times no prompt, decode or pass, so the shipped one")
        return Calibration(cost=cost, prefill_factor=1.0, decode_factor=1.0, fitted=fitted, kept=kept)
    prefill_factor = statistics.median(prefill or decode)
    decode_factor = statistics.median(decode or prefill)
    if not prefill:
        kept.insert(0, "prefill costs: the log times no prefill, so scaled as its decode")
    if not decode:
        kept.insert(0, "decode costs: the log times no decode, so scaled as its prefill")
    return Calibration(
        cost=cost.scaled(prefill_factor, decode=decode_factor),
        prefill_factor=prefill_factor,
        decode_factor=decode_factor,
        fitted=fitted,
        kept=kept,
    )


def _not_llama_server(diagnosis: Diagnosis) -> str | None:
    """The server that wrote the log where it is not llama-server (Ollama's runner writes llama-server's
    lines), else None."""
    if diagnosis.log_kind != "llama-server" or diagnosis.server.engine != "llama-server":
        return diagnosis.server.engine if diagnosis.log_kind == "llama-server" else diagnosis.log_kind
    return None


def check_prediction_log(log: Path) -> None:
    """A study's `search.predicted_from`, read before its run directory exists: a llama-server log whose
    lines time a prompt or a decode, of which a calibration can be made. `ConfigError` names what it is not."""
    said = "search.predicted_from (--predicted-from)"
    try:
        diagnosis = diagnose_log(log)
    except ConfigError as exc:
        raise ConfigError(f"{said}: {exc}") from None
    if (written_by := _not_llama_server(diagnosis)) is not None:
        raise ConfigError(
            f"{said}: {log} is a {written_by} log, and the simulated server models llama-server alone; name a log "
            "of the llama-server this study tunes, or leave it out"
        )
    tasks = parse_llama_server_log(read_lines(log))
    if not any(t.prompt_ms or t.eval_ms for t in tasks):
        raise ConfigError(
            f"{said}: {log} times no prompt and no decode (no print_timing line), so no calibration can be made "
            "of it; name a log of the server while it served requests"
        )


def check_prediction_space(space: SearchSpace, *, said: str) -> None:
    """A study's space, for `search.predicted_from`: what `predict` would refuse in it, named as the study's
    (`search.params`), before its run directory exists."""
    if not any(name in _MODELLED for name in space.params):
        raise ConfigError(
            f"{said}: the study tunes {', '.join(space.params)}, none of which the simulated server models "
            f"({', '.join(_MODELLED)}); tune one of them, or leave predicted_from out"
        )
    try:
        _space_axes(space)
    except ConfigError as exc:
        raise ConfigError(f"{said}: {exc}") from None


def _prefill_s(cost: CostModel, tokens: int, n_batch: int) -> float:
    """What the shipped costs give for prefilling `tokens` new tokens alone: chunks of n_batch, each in
    passes of ASSUMED_N_UBATCH, every pass attending to the tokens before it."""
    seconds, done = 0.0, 0
    while done < tokens:
        chunk = min(n_batch, tokens - done)
        for start in range(0, chunk, ASSUMED_N_UBATCH):
            width = min(ASSUMED_N_UBATCH, chunk - start)
            position = done + start
            seconds += cost.forward_s(width, width * position + width * (width + 1) / 2)
        done += chunk
    return seconds


def _grid(
    space: Mapping[str, Sequence[ParamValue]], constraints: SearchSpace | None
) -> tuple[list[dict[str, ParamValue]], int]:
    """The configs to replay, and how many valid ones the axes have: every one, or of a larger space
    _GRID_LIMIT of them chosen at random (seed 0)."""
    names = list(space)
    configs = [dict(zip(names, values, strict=True)) for values in itertools.product(*space.values())]
    if constraints is not None:
        # A constraint on a knob the simulator does not model (left out of the grid) says nothing here.
        rules = [rule for rule in constraints.constraints if set(rule.names()) <= set(names)]
        configs = [c for c in configs if all(rule.holds(c) for rule in rules)]
    else:
        configs = [c for c in configs if int(str(c.get("n_ubatch", 0))) <= int(str(c.get("n_batch", 1 << 30)))]
    valid = len(configs)
    if valid > _GRID_LIMIT:  # a seeded choice, in the grid's order: the same every time
        chosen = set(random.Random(0).sample(range(valid), _GRID_LIMIT))
        configs = [config for index, config in enumerate(configs) if index in chosen]
    return configs, valid


def _space_axes(space: SearchSpace) -> tuple[dict[str, tuple[ParamValue, ...]], list[str]]:
    """The grid's axes (the knobs the simulated server models) and the knobs left out."""
    axes: dict[str, tuple[ParamValue, ...]] = {}
    left_out: list[str] = []
    for name, param in space.params.items():
        if name not in _MODELLED:
            left_out.append(name)
        elif param.choices is not None:
            axes[name] = tuple(param.choices)
        elif isinstance(param.low, int) and isinstance(param.high, int) and not param.log:
            axes[name] = tuple(range(param.low, param.high + 1, int(param.step or 1)))
        else:
            raise ConfigError(f"search space knob {name}: a prediction needs listed or stepped integer values")
    if not axes:
        raise ConfigError(
            f"the search space names no knob the simulated llama-server models ({', '.join(_MODELLED)}); "
            "give a space with n_batch and n_ubatch, or leave out --space"
        )
    return axes, left_out


@dataclass(frozen=True, kw_only=True)
class StudyTraffic:
    """What a study replays, for a prediction of its own trials (`search.predicted_from`): its workload, its
    baseline's settings (every knob a config leaves alone) and its context size; and how it ranks its trials,
    its objectives and constraints, by which the prediction ranks its configs (none: by stall speed)."""

    trace: Trace
    baseline: Mapping[str, ParamValue]
    ctx_size: int | None
    workload_seed: int
    time_scale: float
    objectives: Sequence[ObjectiveSpec] = ()
    constraints: Sequence[MetricConstraint] = ()
    engine: Engine | None = None  # its engine, which writes its requests (its LoRA adapters' ids among them)


def predict(
    diagnosis: Diagnosis,
    log: Path,
    *,
    space_path: Path | None = None,
    space: SearchSpace | None = None,
    study: StudyTraffic | None = None,
    seeds: int = 3,
    long_prompt_tokens: int = 1000,
    min_overlap_s: float = 0.5,
) -> Prediction:
    """Every config of the space (by default n_batch x n_ubatch on llama-server's ladder), replayed on the
    simulated server `seeds` times with the log's traffic (or a study's workload, at its baseline), ranked by
    the streams' speed during long prefills among those that keep 80% of the baseline's prefill speed; a
    study's, by its own score among those that keep its constraints (`_ranked_by_score`)."""
    if (written_by := _not_llama_server(diagnosis)) is not None:
        raise ConfigError(
            f"--predict reads llama-server logs (this is a {written_by} log): the simulated server models llama-server "
            "alone; run without --predict, or tune it with --study"
        )
    if space is None and space_path is not None:
        space = load_search_space(space_path)
    axes, left_out = _space_axes(space) if space is not None else (dict(_DEFAULT_SPACE), [])
    grid, valid = _grid(axes, space)
    trace = _traffic(log, study)
    calibration = calibrate_from_log(diagnosis, parse_llama_server_log(read_lines(log)))
    if left_out:
        calibration.kept.append(f"{', '.join(left_out)}: not modelled by the simulated server, left at the log's")
    if valid > len(grid):
        calibration.kept.append(
            f"{len(grid)} of the space's {valid:,} configs, chosen at random (seed 0), and the baseline: more than "
            f"{_GRID_LIMIT} take minutes; narrow search.params or --space for every one"
        )
    engine = (study.engine if study is not None else None) or create_engine(
        PluginSpec.model_validate({"kind": "llama-server", "binary": "simulated"})
    )
    slots = diagnosis.server.n_slots or 4
    ctx = (diagnosis.server.n_ctx_slot or 4096) * slots
    # The log's server, for every knob a config leaves alone: n_batch as its chunks show it, else
    # llama-server's default, as n_ubatch always is.
    n_batch = diagnosis.server.n_batch or 2048
    if diagnosis.server.n_batch is None:
        calibration.kept.append(
            "n_batch 2048 for the log's server (llama-server's default: no chunk in the log shows it)"
        )
    base: dict[str, ParamValue] = {"n_batch": n_batch, "n_ubatch": min(ASSUMED_N_UBATCH, n_batch), "n_parallel": slots}
    if study is not None:  # a study's trials run on its own baseline, whatever the log's server ran
        base.update({k: v for k, v in study.baseline.items() if k in _MODELLED})
        slots = int(str(base["n_parallel"]))
        ctx = study.ctx_size or ctx
    baseline = {k: base[k] for k in axes if k in base}
    configs = [{**baseline, **config} for config in grid]
    if baseline not in configs:
        configs.append(baseline)
    token_range = engine.prompt_token_range()
    workload_seed, time_scale = (study.workload_seed, study.time_scale) if study is not None else (0, 1.0)
    rounds = [
        [
            request
            for session in synthesize_sessions(
                trace, token_range=token_range, seed=workload_seed, round_index=i, time_scale=time_scale
            )
            for request in session
        ]
        for i in range(seeds)
    ]
    objectives = list(study.objectives) if study is not None else []
    constraints = list(study.constraints) if study is not None else []
    names = list(dict.fromkeys([*_METRICS, *(o.metric for o in objectives), *(c.metric for c in constraints)]))
    results = []
    for config in configs:
        settings = _sim_settings({**base, **config}, slots=slots, ctx=ctx)
        samples: dict[str, list[float]] = {m: [] for m in names}
        for seed, requests in enumerate(rounds):
            server = SimulatedLlamaServer(settings, cost=calibration.cost, noise=_NOISE, seed=seed)
            done = replay_virtual(requests, server, engine=engine, start_s=0.0, request_timeout_s=1e9)
            metrics = compute_metrics(done.records, long_prompt_tokens=long_prompt_tokens, min_overlap_s=min_overlap_s)
            for name in names:
                value = metrics.get(name)
                if value is not None:
                    samples[name].append(value)
        results.append((config, samples))
    per_round = sum(len(r) for r in rounds) // seeds
    if objectives:
        return _ranked_by_score(
            calibration, per_round, seeds, results, baseline, objectives=objectives, constraints=constraints
        )
    return _ranked(calibration, per_round, seeds, results, baseline)


def _traffic(log: Path, study: StudyTraffic | None) -> Trace:
    """What the prediction replays: the study's workload, else the log's own requests."""
    if study is not None:
        trace = study.trace
    else:
        trace = LlamaServerLogImporter().read(log, LlamaServerLogOptions(), name=log.stem)
        if not len(trace):
            raise ConfigError(f"{log}: no finished request to replay; --predict needs a log of served traffic")
    if len(trace) > MAX_REQUESTS:
        what = "the study's workload has" if study is not None else f"{log}:"
        cut = (
            "leave out search.predicted_from, or predict on a shorter workload"
            if study is not None
            else "cut the log to its busiest stretch first (journalctl -u UNIT --since ... --until ...)"
        )
        replays = "a prediction replays" if study is not None else "--predict replays"
        raise ConfigError(f"{what} {len(trace):,} requests, more than the {MAX_REQUESTS:,} {replays}; {cut}")
    return trace


def _sim_settings(config: Mapping[str, ParamValue], *, slots: int, ctx: int) -> SimSettings:
    """The simulated server's settings for a config, the log's own slots and context otherwise."""
    default = SimSettings()

    def number(name: str, otherwise: int) -> int:
        return int(str(config[name])) if name in config else otherwise

    return SimSettings(
        n_batch=number("n_batch", default.n_batch),
        n_ubatch=number("n_ubatch", default.n_ubatch),
        n_parallel=number("n_parallel", slots),
        ctx_size=ctx,
        kv_unified=bool(config.get("kv_unified", False)),
        cache_ram=number("cache_ram", default.cache_ram),
    )


def _summary(samples: dict[str, list[float]]) -> tuple[dict[str, float | None], dict[str, tuple[float, float] | None]]:
    """Each metric's median over the simulator's seeds, and its lowest and highest."""
    median = {m: statistics.median(v) if v else None for m, v in samples.items()}
    spread = {m: (min(v), max(v)) if v else None for m, v in samples.items()}
    return median, spread


def _ranked_by_score(
    calibration: Calibration,
    requests: int,
    seeds: int,
    results: list[tuple[dict[str, ParamValue], dict[str, list[float]]]],
    baseline: dict[str, ParamValue],
    *,
    objectives: Sequence[ObjectiveSpec],
    constraints: Sequence[MetricConstraint],
) -> Prediction:
    """A study's configs ranked as its trials are: the score of their predicted medians against the
    baseline's (`tuner.scoring`), among those that keep its constraints; the best must gain at least the
    study's minimum effect (5% on every objective), as a measured win must. A stall figure alone names the
    config that frees the streams most, where the study weighs that against prefill and TTFT: from 8 slots on
    the five-knob space (bench/search_efficiency.py) it named 64/64 with 4 slots, 128/128 with 4 slots being
    the study's optimum's batch sizes. A config a metric of the score has no figure for (a LoRA wait, where
    the workload runs no adapters) is not ranked."""
    base_median = _summary(next(samples for config, samples in results if config == baseline))[0]
    configs = []
    for config, samples in results:
        median, spread = _summary(samples)
        try:
            score: float | None = score_round(median, base_median, objectives)
        except MeasurementError:  # a metric the simulated round had no data for: not rankable
            score = None
        eligible = score is not None and not any(
            c.violations(median.get(c.metric), base_median.get(c.metric)) for c in constraints
        )
        configs.append(
            PredictedConfig(dict(config), median, spread, baseline=config == baseline, eligible=eligible, score=score)
        )
    configs.sort(key=lambda c: (not (c.eligible or c.baseline), -(c.score if c.score is not None else -math.inf)))
    others = [c for c in configs if not c.baseline]
    best = next((c for c in others if c.eligible), None)
    smallest_win = min_effect(objectives)
    why_none = None
    if not others:
        why_none = "the space holds no config but the baseline's"
    elif not any(c.score is not None for c in others):
        unmeasured = sorted({o.metric for o in objectives if all(c.median.get(o.metric) is None for c in others)})
        what = ", ".join(unmeasured) or "figure of the score"
        why_none = f"the simulated rounds of the study's workload give no {what}, so no config has a score"
    elif best is None:
        why_none = "no config keeps the study's constraints"
    elif (best.score or 0.0) < smallest_win:
        which = "no config that keeps the study's constraints" if constraints else "no config"
        why_none = (
            f"{which} gains the study's minimum effect over the baseline "
            f"(a score of {smallest_win:+.2f}; the best, {best.score:+.2f})"
        )
    return Prediction(
        calibration=calibration,
        requests=requests,
        seeds=seeds,
        configs=configs,
        best=None if why_none else best,
        ranked_by="score",
        why_none=why_none,
    )


def _ranked(
    calibration: Calibration,
    requests: int,
    seeds: int,
    results: list[tuple[dict[str, ParamValue], dict[str, list[float]]]],
    baseline: dict[str, ParamValue],
) -> Prediction:
    base_samples = next(samples for config, samples in results if config == baseline)
    base_prefill = _summary(base_samples)[0]["prefill_tok_s"]
    configs = []
    for config, samples in results:
        median, spread = _summary(samples)
        prefill = median["prefill_tok_s"]
        eligible = base_prefill is None or (prefill is not None and prefill >= _MIN_PREFILL_VS_BASELINE * base_prefill)
        configs.append(PredictedConfig(dict(config), median, spread, baseline=config == baseline, eligible=eligible))
    configs.sort(key=lambda c: (not c.eligible, -(c.median["stall_tok_s"] or 0.0), c.median["ttft_p95_s"] or 0.0))
    base = next(c for c in configs if c.baseline)
    best = next((c for c in configs if c.eligible and not c.baseline), None)
    if best is not None and (best.median["stall_tok_s"] or 0.0) <= (base.median["stall_tok_s"] or 0.0):
        best = None
    return Prediction(calibration=calibration, requests=requests, seeds=seeds, configs=configs, best=best)


def prediction_json(prediction: Prediction) -> dict[str, object]:
    """The prediction as `--predict --json` prints it."""

    def row(config: PredictedConfig) -> dict[str, object]:
        return {
            "settings": config.settings,
            "baseline": config.baseline,
            "eligible": config.eligible,
            "score": config.score,
            "median": config.median,
            "spread": {m: list(v) if v else None for m, v in config.spread.items()},
        }

    return {
        "version": 2,
        "requests": prediction.requests,
        "seeds": prediction.seeds,
        "ranked_by": prediction.ranked_by,
        "why_none": prediction.why_none,
        "calibration": {
            "prefill_factor": prediction.calibration.prefill_factor,
            "decode_factor": prediction.calibration.decode_factor,
            "fitted": prediction.calibration.fitted,
            "kept": prediction.calibration.kept,
        },
        "best": row(prediction.best) if prediction.best is not None else None,
        "configs": [row(c) for c in prediction.configs],
    }


def prediction_record(prediction: Prediction, *, log: str) -> PredictionRecord:
    """The prediction as a run directory stores it (`search.predicted_from`)."""

    def figures(config: PredictedConfig) -> PredictedFigures:
        return PredictedFigures(
            settings=config.settings,
            baseline=config.baseline,
            eligible=config.eligible,
            score=config.score,
            median=config.median,
            spread=config.spread,
        )

    return PredictionRecord(
        log=log,
        prefill_factor=prediction.calibration.prefill_factor,
        decode_factor=prediction.calibration.decode_factor,
        fitted=prediction.calibration.fitted,
        kept=prediction.calibration.kept,
        requests=prediction.requests,
        seeds=prediction.seeds,
        axes=list(prediction.configs[0].settings) if prediction.configs else [],
        ranked_by=prediction.ranked_by,
        why_none=prediction.why_none,
        configs=[figures(c) for c in prediction.configs],
        best=None if prediction.best is None else figures(prediction.best),
    )
