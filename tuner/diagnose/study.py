"""`tuner diagnose --study OUT.toml`: a study of the knobs the findings name, for the engine that wrote the
log, on that log's traffic.

Three files belong together, each written atomically beside the others so that the study runs from
wherever it is put: the study; its workload (`OUT.workload.jsonl`), imported from the log by the
llama-server-log importer (Ollama's runner writes the same lines); and the search space of those knobs
(`OUT.space.toml`). vLLM's stats lines hold no request, so its study names `OUT.workload.jsonl` for
`tuner record` to write. Nothing replaces the input log or the `--like` study, and no existing file is
replaced unless `force`.

The knobs are the engine's own: llama-server's, Ollama's (the settings it takes from its environment),
vLLM's. Without `like` the study is local: it starts its own server on this machine, and its first lines
say so and how to point it at the server whose log it read (`is_local_diagnose_study` reads that). With
`like`, a study of that server, the written study takes its `[host]`, `[deploy]` and `[engine]` tables (a
fleet's `[[hosts]]` and `[storage]` too) as written; only the workload, the knobs, the objectives and the
constraints come from the log.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tuner.catalog import SIMULATED_KNOBS
from tuner.config import ParamValue, StudySpec, load_study, validate_options
from tuner.diagnose.report import Diagnosis, Fix, ServerFacts, StudyConstraint, StudyObjective
from tuner.errors import AssetError, ConfigError
from tuner.files import check_output, write_atomic
from tuner.importers import import_trace
from tuner.workloads import trace_lines

__all__ = [
    "ENGINE_STUDY_KNOBS",
    "LOCAL_STUDY_MARKER",
    "STUDY_KNOBS",
    "LikeStudy",
    "StudyKnob",
    "WrittenStudy",
    "is_local_diagnose_study",
    "read_like_study",
    "study_files",
    "write_study",
]


@dataclass(frozen=True)
class StudyKnob:
    """A knob as its engine's search space (search_spaces/ENGINE.toml) defines it."""

    description: str
    choices: tuple[ParamValue, ...]
    default: ParamValue | None = None


# The knobs a study may tune, per engine, as search_spaces/ENGINE.toml defines them (a test keeps them equal).
ENGINE_STUDY_KNOBS: dict[str, dict[str, StudyKnob]] = {
    "llama-server": {
        "n_batch": StudyKnob("Logical batch (LLAMA_ARG_BATCH).", (32, 64, 128, 256, 512, 1024, 2048), 2048),
        "n_ubatch": StudyKnob("Physical micro-batch (LLAMA_ARG_UBATCH).", (32, 64, 128, 256, 512, 1024, 2048), 512),
        "n_parallel": StudyKnob("Slots (LLAMA_ARG_N_PARALLEL).", (1, 2, 4, 8, 16)),
        "kv_unified": StudyKnob("One KV buffer shared by all slots (LLAMA_ARG_KV_UNIFIED).", (False, True), False),
        "cache_ram": StudyKnob("Host-RAM prompt cache in MiB (LLAMA_ARG_CACHE_RAM).", (0, 256, 1024, 8192), 8192),
    },
    "ollama": {
        "num_parallel": StudyKnob("Requests served at once per model (OLLAMA_NUM_PARALLEL).", (1, 2, 4, 8), 1),
        "context_length": StudyKnob(
            "Default num_ctx, each slot's context (OLLAMA_CONTEXT_LENGTH).", (2048, 4096, 8192, 16384, 32768)
        ),
    },
    "vllm": {
        "max_num_seqs": StudyKnob("--max-num-seqs: running sequences per step.", (16, 32, 64, 128, 256, 512)),
        "max_num_batched_tokens": StudyKnob(
            "--max-num-batched-tokens: tokens per step, decodes plus prefill chunks.",
            (512, 1024, 2048, 4096, 8192, 16384),
        ),
        "gpu_memory_utilization": StudyKnob(
            "--gpu-memory-utilization: share of device memory for weights, activations and KV cache.",
            (0.8, 0.85, 0.9, 0.92, 0.95),
            0.92,
        ),
    },
}
STUDY_KNOBS = ENGINE_STUDY_KNOBS["llama-server"]

# Ollama's runner is llama-server, but Ollama takes only some of its settings from its own environment: the
# slots (OLLAMA_NUM_PARALLEL) and each slot's context (OLLAMA_CONTEXT_LENGTH). So a fix is mapped by the knob
# it names: more slots, or more context for cut prompts. n_batch is a per-model option (a study tunes it as
# `num_batch`, carried by every request of a trial: search_spaces/ollama.toml), which a study written from a
# log does not search yet; Ollama has no RAM prompt cache or unified-KV setting.
_OLLAMA_KNOBS_FOR_FIX: dict[str, tuple[str, ...]] = {
    "n_parallel": ("num_parallel",),
    "kv_unified": ("context_length",),
}

_ENGINE_NAMES = {"llama-server": "llama-server", "ollama": "Ollama", "vllm": "vLLM"}

# The first line of a study written without --like: `is_local_diagnose_study` looks for it.
LOCAL_STUDY_MARKER = "# Local study, written by tuner diagnose: it starts its own server on this machine."

# The tables a study written with --like takes from that study, in the order they are written.
_COPIED_TABLES = ("host", "deploy", "engine", "storage", "hosts")


@dataclass(frozen=True)
class LikeStudy:
    """A study of the server whose log is read: its engine, and the tables the written study takes from it,
    as its file has them (before any default is filled in)."""

    path: Path
    engine: str
    tables: dict[str, Any]


@dataclass(frozen=True)
class WrittenStudy:
    paths: list[Path]
    notes: list[str]  # for the user, after the paths: what the study still needs, and what was not written


def study_files(out: Path) -> tuple[Path, Path, Path]:
    stem = out.name.removesuffix(".toml")
    return out, out.with_name(f"{stem}.workload.jsonl"), out.with_name(f"{stem}.space.toml")


def is_local_diagnose_study(text: str) -> bool:
    """Whether a study file's text is a local study written by `tuner diagnose --study` (no `--like`) that
    nobody has pointed at a host since: its leading comment lines hold `LOCAL_STUDY_MARKER`, and it has no
    `[host]`, `[deploy]` or `[[hosts]]` table. Such a study starts its own server on this machine, not the
    server whose log was read; a check before a run (`tuner run --check`) can call this to say so. A text
    that is not TOML is judged by the marker alone."""
    leading = itertools.takewhile(lambda line: line.startswith("#") or not line.strip(), text.splitlines())
    if LOCAL_STUDY_MARKER not in (line.rstrip() for line in leading):
        return False
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return True
    return not any(table in data for table in ("host", "deploy", "hosts"))


def read_like_study(path: Path) -> LikeStudy:
    """The `--like` study, refused in one line (`ConfigError`) unless `tuner run` would accept its file and its
    `[host]`, `[deploy]` and `[engine]` tables (each fleet host's too) by their plugins' own checks."""
    try:
        spec, _ = load_study(path)
    except ConfigError as exc:
        raise ConfigError(f"--like: {exc}") from None
    try:
        _check_plugin_tables(spec)
    except ConfigError as exc:
        raise ConfigError(f"--like: {path}: {exc}") from None
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return LikeStudy(
        path=path, engine=spec.engine.kind, tables={name: data[name] for name in _COPIED_TABLES if name in data}
    )


def _check_plugin_tables(spec: StudySpec) -> None:
    """The tables `--like` copies, checked as `tuner run` checks them before it reaches a host: each by its
    plugin's own model, the engine made for whose command line starts the server, and its launch against
    the deploy (a fleet: each host's)."""
    from tuner.deployers import DEPLOYERS
    from tuner.deployers.base import check_launch, server_command
    from tuner.engines import create_engine
    from tuner.transports import TRANSPORTS

    each_host = [("", spec), *((f"hosts.{entry.name}.", spec.for_host(entry)) for entry in spec.hosts)]
    for prefix, host_spec in each_host:
        transport = TRANSPORTS.get(host_spec.host.kind)
        validate_options(transport.options_model, host_spec.host.options(), where=f"{prefix}host")
        deployer = DEPLOYERS.get(host_spec.deploy.kind)
        validate_options(deployer.options_model, host_spec.deploy.options(), where=f"{prefix}deploy")
        command = server_command(host_spec.deploy, local_host=host_spec.host.kind == "local")
        engine = create_engine(host_spec.engine, command=command)
        try:
            launch = engine.launch_spec({})
        except AssetError:  # a server started here without a build yet: `tuner run` says `tuner setup`
            continue
        check_launch(host_spec.deploy, launch)


def _engine_knobs(engine: str, fix: Fix) -> list[str]:
    """The knobs of `engine` that carry out `fix`."""
    if engine == "ollama":
        return list(_OLLAMA_KNOBS_FOR_FIX.get(fix.knob or "", ()))
    return [knob for knob in fix.study_params if knob in ENGINE_STUDY_KNOBS[engine]]


def _log_settings(server: ServerFacts) -> dict[str, ParamValue]:
    """What the log says the server ran with, as its engine's settings."""
    settings: dict[str, ParamValue] = {}
    if server.n_slots is None:
        return settings
    if server.engine == "llama-server":
        settings["n_parallel"] = server.n_slots
        if server.n_ctx_slot is not None:
            settings["ctx_size"] = server.n_slots * server.n_ctx_slot
    elif server.engine == "ollama":
        # Ollama gives its runner num_ctx x num_parallel tokens, so each slot's context is num_ctx.
        settings["num_parallel"] = server.n_slots
        if server.n_ctx_slot is not None:
            settings["context_length"] = server.n_ctx_slot
    return settings


@dataclass(frozen=True)
class _Plan:
    """What the study tunes and the settings its baseline runs with."""

    engine: str
    params: list[str]
    objectives: list[StudyObjective]
    constraints: list[StudyConstraint]
    settings: dict[str, ParamValue]  # engine.settings as written
    from_log: dict[str, ParamValue]  # of those, what the log gave that the --like study does not set
    unknown_baselines: list[str]  # tuned knobs whose value now neither the space nor the settings give
    not_tuned: list[str]  # knobs the findings name that this engine does not take as a server setting


def write_study(
    diagnosis: Diagnosis, log: Path, out: Path, *, like: LikeStudy | None = None, force: bool = False
) -> WrittenStudy:
    """Writes the study, its search space and (but for vLLM) its workload. `ConfigError`, before anything is
    written, when `like` is a study of another engine, when the log names no knob of its engine to tune, when a
    path is the input log or the `like` study, or an existing file without `force`."""
    engine = diagnosis.server.engine
    if like is not None and like.engine != engine:
        raise ConfigError(
            f"--like {like.path} is a study of {like.engine}, but {diagnosis.source} is {_ENGINE_NAMES[engine]}'s "
            f"log; pass a study of the server that wrote the log (engine.kind = {engine!r})"
        )
    replays_log = engine != "vllm"  # vLLM's stats lines hold no request to replay
    if replays_log and str(log) == "-":
        raise ConfigError("--study imports the workload from the log file: pass the log as a file, not standard input")
    plan = _plan(diagnosis, like)
    study, workload, space = study_files(out)
    inputs = [log] if like is None else [log, like.path]
    written = [study, workload, space] if replays_log else [study, space]
    for path in written:
        check_output(path, inputs=inputs)
        if path.exists() and not force:
            raise ConfigError(f"{path} exists; pass --force to replace it, or another --study path")
    if replays_log:
        trace = import_trace("llama-server-log", log, {}, name=study.name.removesuffix(".toml"))
        write_atomic(workload, trace_lines(trace), inputs=inputs)
    write_atomic(space, _space_text(plan).encode(), inputs=inputs)
    text = _study_text(diagnosis, plan, log=log, out=out, like=like, workload=workload, space=space)
    # A storage URL copied from --like may hold a password: the copy is as private as a secret's file.
    write_atomic(study, text.encode(), inputs=inputs, private=_holds_password(like))
    return WrittenStudy(paths=written, notes=_notes(plan, out=out, like=like, workload=workload))


def _plan(diagnosis: Diagnosis, like: LikeStudy | None) -> _Plan:
    engine = diagnosis.server.engine
    knobs = ENGINE_STUDY_KNOBS[engine]
    params: list[str] = []
    objectives: dict[str, StudyObjective] = {}
    constraints: dict[str, StudyConstraint] = {}
    not_tuned: list[str] = []  # the knobs of fixes this engine cannot carry out
    for fix in (fix for finding in diagnosis.findings for fix in finding.fixes):
        tuned = _engine_knobs(engine, fix)
        params += [knob for knob in tuned if knob not in params]
        not_tuned += [knob for knob in fix.study_params if not tuned and knob not in not_tuned]
        if tuned:
            for objective in fix.objectives:
                objectives.setdefault(objective.metric, objective)
            for constraint in fix.constraints:
                constraints.setdefault(constraint.metric, constraint)
    not_tuned = [knob for knob in not_tuned if knob not in params]
    if not params:
        why = ""
        if not_tuned and engine == "ollama":
            why = f" (it names {', '.join(not_tuned)}, which Ollama does not take as a server setting)"
        elif not_tuned:
            why = f" (it names {', '.join(not_tuned)}, which the study cannot replay from this log)"
        raise ConfigError(
            f"--study: no finding of {diagnosis.source} names a server knob to tune{why}; leave --study out"
        )
    logged = _log_settings(diagnosis.server)
    from_log: dict[str, ParamValue] = {}
    if like is None:
        settings = logged
    else:
        like_settings = dict(like.tables["engine"].get("settings") or {})
        # The baseline must be what runs now: a tuned knob the --like study leaves unset takes the log's value.
        from_log = {k: v for k, v in logged.items() if k in params and k not in like_settings}
        settings = {**like_settings, **from_log}
    unknown = [knob for knob in params if settings.get(knob, knobs[knob].default) is None]
    return _Plan(
        engine=engine,
        params=params,
        objectives=list(objectives.values()) or [StudyObjective(metric="ttft_p95_s", direction="minimize")],
        constraints=list(constraints.values()),
        settings=settings,
        from_log=from_log,
        unknown_baselines=unknown,
        not_tuned=not_tuned,
    )


def _holds_password(like: LikeStudy | None) -> bool:
    storage = like.tables.get("storage") if like is not None else None
    url = storage.get("url") if isinstance(storage, dict) else None
    if not isinstance(url, str):
        return False
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return True  # unreadable as a URL: assume the worst


def _notes(plan: _Plan, *, out: Path, like: LikeStudy | None, workload: Path) -> list[str]:
    notes = []
    if plan.engine == "vllm":
        if workload.exists():
            notes.append(f"{workload}: the study replays it (vLLM's stats lines hold no request)")
        else:
            notes.append(
                f"{workload} is not written: vLLM's stats lines hold no request; record the server's traffic into it "
                f"before tuner run: tuner record --upstream http://SERVER:8000 --out {shlex.quote(str(workload))}"
            )
    if like is None:
        notes.append(
            f"{out} is a local study: it starts its own server on this machine; to tune the server that wrote the "
            "log, write it again with --like STUDY.toml, a study of that server (its first lines say how)"
        )
    return notes


def _choices_with(knob: StudyKnob, baseline: ParamValue | None) -> list[ParamValue]:
    """The knob's choices with the baseline's value among them, which the study requires of a baseline."""
    choices = list(knob.choices)
    if baseline is None or any(type(baseline) is type(c) and baseline == c for c in choices):
        return choices
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in [*choices, baseline]):
        return sorted([*choices, baseline], key=float)
    return [*choices, baseline]


def _space_text(plan: _Plan) -> str:
    engine = plan.engine
    lines = [
        f"# The {engine} knobs `tuner diagnose` found worth tuning, as search_spaces/{engine}.toml has them",
        "# (with the baseline's value among the choices).",
        f"engine = {_toml(engine)}",
        'description = "Knobs named by tuner diagnose."',
    ]
    if "n_batch" in plan.params and "n_ubatch" in plan.params:
        lines += ['constraints = ["n_ubatch <= n_batch"]', 'line = ["n_batch", "n_ubatch"]']
    for name in plan.params:
        knob = ENGINE_STUDY_KNOBS[engine][name]
        baseline = plan.settings.get(name, knob.default)
        lines += [
            "",
            f"[params.{name}]",
            f"description = {_toml(knob.description)}",
            f"choices = {_toml(_choices_with(knob, baseline))}",
        ]
        if knob.default is not None:
            lines.append(f"default = {_toml(knob.default)}")
    return "\n".join(lines) + "\n"


def _predicted_from(plan: _Plan, *, log: Path, out: Path) -> list[str]:
    """A llama-server study of a knob the simulated server models starts from the prediction of this log."""
    if plan.engine != "llama-server" or not any(knob in SIMULATED_KNOBS for knob in plan.params):
        return []
    relative = os.path.relpath(log.resolve(), out.resolve().parent)
    return [
        "# The config the simulated server, calibrated from the log, predicts to win is measured first after",
        "# the baseline; the leaderboard sets its predicted figures beside the measured ones (docs/diagnose.md).",
        f"predicted_from = {_toml(relative)}",
    ]


def _study_text(
    diagnosis: Diagnosis,
    plan: _Plan,
    *,
    log: Path,
    out: Path,
    like: LikeStudy | None,
    workload: Path,
    space: Path,
) -> str:
    name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in workload.name.removesuffix(".workload.jsonl"))
    name = name.lstrip("_.-") or "diagnosed"
    reasons = "; ".join(f.title for f in diagnosis.findings)
    lines = _header(diagnosis, plan, log=log, out=out, like=like, workload=workload, reasons=reasons)
    lines += [
        f"name = {_toml(name)}",
        f"description = {_toml('From the log ' + diagnosis.source + ': ' + reasons)}",
        "rounds = 2",
        "",
        "[budget]",
        "trials = 6",
        "",
    ]
    if like is None:
        lines += _local_engine(diagnosis, plan)
    else:
        for table in ("host", "deploy", "engine"):
            if table in like.tables:
                value = like.tables[table]
                if table == "engine":
                    value = {**value, "settings": plan.settings}
                lines += [*_table_lines(table, value), ""]
    lines += [
        "[workload]",
        f"path = {_toml(workload.name)}",
        "request_timeout_s = 300",
        "",
        "[search]",
        f"space = {_toml(space.name)}",
        f"params = {_toml(list(plan.params))}",
        'sampler = "tpe"',
        *_predicted_from(plan, log=log, out=out),
        "",
        "[metrics]",
        f"long_prompt_tokens = {diagnosis.long_prompt_tokens}",
    ]
    for objective in plan.objectives:
        lines += [
            "",
            "[[objectives]]",
            f"metric = {_toml(objective.metric)}",
            f"direction = {_toml(objective.direction)}",
            f"weight = {_toml(objective.weight)}",
        ]
    for constraint in plan.constraints:
        lines += ["", "[[constraints]]", f"metric = {_toml(constraint.metric)}"]
        if constraint.min_vs_baseline is not None:
            lines.append(f"min_vs_baseline = {_toml(constraint.min_vs_baseline)}")
        if constraint.max is not None:
            lines.append(f"max = {_toml(constraint.max)}")
    if like is not None and "storage" in like.tables:
        lines += ["", *_table_lines("storage", like.tables["storage"])]
    for entry in like.tables.get("hosts", []) if like is not None else []:
        lines += ["", *_table_lines("hosts", entry, array=True)]
    return "\n".join(lines) + "\n"


def _header(
    diagnosis: Diagnosis,
    plan: _Plan,
    *,
    log: Path,
    out: Path,
    like: LikeStudy | None,
    workload: Path,
    reasons: str,
) -> list[str]:
    """The study's first lines, as TOML comments: where it came from, what it tunes, what it still needs."""
    engine = _ENGINE_NAMES[plan.engine]
    if like is None:
        lines = [
            LOCAL_STUDY_MARKER,
            f"# From {diagnosis.source} ({engine}): {reasons}.",
            "# It tunes that new server, not the one whose log it read. To tune that one, write this study again",
            "# from a study of that server, whose [host], [deploy] and [engine] it then takes:",
            f"#   tuner diagnose {shlex.quote(str(log))} --study {shlex.quote(str(out))} --like PROD.toml --force",
            '# or add those tables here (docs/production-host.md): [host] kind = "ssh" with its address,',
            '# [deploy] kind = "systemd" with its unit, and [engine] as the server runs (its model, paths, port).',
        ]
    else:
        tables = [f"[[{t}]]" if t == "hosts" else f"[{t}]" for t in _COPIED_TABLES if t in like.tables]
        copied = " and ".join([", ".join(tables[:-1]), tables[-1]] if len(tables) > 1 else tables)
        lines = [
            f"# Written by `tuner diagnose --study` from {diagnosis.source} ({engine}): {reasons}.",
            f"# {copied} are {like.path}'s, copied as written: it tunes the server that study names.",
            "# Their paths are the host's or relative to where `tuner run` starts, never to a study file, so",
            "# they mean here what they meant there. The workload, knobs, objectives and constraints come from",
            "# the log.",
        ]
        if plan.from_log:
            logged = ", ".join(f"{knob} = {_toml(value)}" for knob, value in plan.from_log.items())
            lines += [
                f"# engine.settings {logged}: the log's, since {like.path} leaves them unset and the",
                "# baseline must be what runs now.",
            ]
    if plan.engine == "vllm":
        lines += [
            f"# The workload: vLLM's stats lines hold no request, so record the server's traffic into {workload.name}",
            f"# first (tuner record --upstream http://SERVER:8000 --out {workload.name}); tuner run stops without it.",
        ]
    elif plan.engine == "ollama":
        lines += [
            "# The workload is the log's own traffic, read from the runner's llama-server lines; the knobs are",
            "# the Ollama settings the findings name.",
        ]
    else:
        lines.append("# The workload is the log's own traffic; the knobs are those the findings name.")
    if plan.not_tuned:
        lines.append(
            f"# Not tuned: {', '.join(plan.not_tuned)}, which the findings name but "
            + ("Ollama does not take as a server setting." if plan.engine == "ollama" else "this log cannot replay.")
        )
    needed = _still_needed(diagnosis, plan, like)
    if needed:
        lines.append("# Before `tuner run`, which refuses until then, set:")
        lines += [f"#   {item}" for item in needed]
    return [_comment(line) for line in lines] + [""]


def _still_needed(diagnosis: Diagnosis, plan: _Plan, like: LikeStudy | None) -> list[str]:
    needed = []
    models = diagnosis.server.models
    if like is None and plan.engine != "llama-server" and len(models) != 1:
        which = f"the log names several: {', '.join(models)}" if models else "the log does not name it"
        served = "Ollama model (`ollama ps`)" if plan.engine == "ollama" else "model, as `vllm serve` takes it"
        needed.append(f"engine.model: the server's {served}; {which}")
    needed += [
        f"engine.settings.{knob}: the value the server runs with now; the log does not say it"
        for knob in plan.unknown_baselines
    ]
    return needed


def _local_engine(diagnosis: Diagnosis, plan: _Plan) -> list[str]:
    lines = ["[engine]", f"kind = {_toml(plan.engine)}"]
    models = diagnosis.server.models
    if plan.engine == "llama-server":
        lines += [
            'binary = "auto"                          # the llama-server `tuner setup` built; or your own binary',
            'model = "auto"                           # SmolLM2-135M; or your own GGUF file',
        ]
    elif len(models) == 1:
        lines.append(f"model = {_toml(models[0])}")
    else:
        example = "llama3.2:3b" if plan.engine == "ollama" else "Qwen/Qwen2.5-7B-Instruct"
        lines.append(_comment(f"# model = {_toml(example)}      # required: see the first lines"))
    lines.append("[engine.settings]")
    lines += [f"{_key(knob)} = {_toml(value)}" for knob, value in plan.settings.items()]
    lines += [f"# {knob} =      # required: see the first lines" for knob in plan.unknown_baselines]
    return [*lines, ""]


# --- TOML text ----------------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _comment(text: str) -> str:
    """A comment line: TOML allows no control character but tab in one (a file name may hold any)."""
    return "".join("?" if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F else c for c in text)


def _string(text: str) -> str:
    escaped = (_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in text)
    return '"' + "".join(escaped) + '"'


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else _string(name)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _table_lines(header: str, table: Mapping[str, Any], *, array: bool = False) -> list[str]:
    """A table as TOML text: its values, then each table inside it under its own header (a header after an
    array's `[[header]]` belongs to that entry)."""
    lines = [f"[[{header}]]" if array else f"[{header}]"]
    nested = [(key, value) for key, value in table.items() if isinstance(value, Mapping)]
    lines += [f"{_key(key)} = {_toml(value)}" for key, value in table.items() if not isinstance(value, Mapping)]
    for key, value in nested:
        lines += _table_lines(f"{header}.{_key(key)}", value)
    return lines
