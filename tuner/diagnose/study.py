"""`tuner diagnose --study OUT.toml`: a study of the knobs the findings name, on the traffic of the same log.

Three files are written, each atomically: the study, the workload imported from the log by the
llama-server-log importer (`OUT.workload.jsonl`), and the search space restricted to those knobs
(`OUT.space.toml`), so the study runs from wherever it is put. None replaces the input log, and none
replaces an existing file unless `force`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tuner.diagnose.report import Diagnosis, StudyConstraint, StudyObjective
from tuner.errors import ConfigError
from tuner.files import check_output, write_atomic
from tuner.importers import import_trace
from tuner.workloads import trace_lines

__all__ = ["STUDY_KNOBS", "study_files", "write_study"]

# The llama-server knobs a study may tune, as search_spaces/llama-server.toml defines them.
STUDY_KNOBS: dict[str, tuple[str, list[object], object | None]] = {
    "n_batch": ("Logical batch (LLAMA_ARG_BATCH).", [32, 64, 128, 256, 512, 1024, 2048], 2048),
    "n_ubatch": ("Physical micro-batch (LLAMA_ARG_UBATCH).", [32, 64, 128, 256, 512, 1024, 2048], 512),
    "n_parallel": ("Slots (LLAMA_ARG_N_PARALLEL).", [1, 2, 4, 8, 16], None),
    "kv_unified": ("One KV buffer shared by all slots (LLAMA_ARG_KV_UNIFIED).", [False, True], False),
    "cache_ram": ("Host-RAM prompt cache in MiB (LLAMA_ARG_CACHE_RAM).", [0, 256, 1024, 8192], 8192),
}


def study_files(out: Path) -> tuple[Path, Path, Path]:
    stem = out.name.removesuffix(".toml")
    return out, out.with_name(f"{stem}.workload.jsonl"), out.with_name(f"{stem}.space.toml")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def write_study(diagnosis: Diagnosis, log: Path, out: Path, *, force: bool = False) -> list[Path]:
    """Writes the study, its workload and its search space; returns their paths. `ConfigError` when the
    log names no server knob to tune, when a path is the input log, or an existing file without `force`."""
    if diagnosis.log_kind != "llama-server":
        raise ConfigError("--study writes a llama-server study; this is a vLLM log: leave --study out")
    if str(log) == "-":
        raise ConfigError("--study imports the workload from the log file: pass the log as a file, not standard input")
    params: list[str] = []
    objectives: dict[str, StudyObjective] = {}
    constraints: dict[str, StudyConstraint] = {}
    for finding in diagnosis.findings:
        for fix in finding.fixes:
            for knob in fix.study_params:
                if knob in STUDY_KNOBS and knob not in params:
                    params.append(knob)
            if any(knob in STUDY_KNOBS for knob in fix.study_params):
                for objective in fix.objectives:
                    objectives.setdefault(objective.metric, objective)
                for constraint in fix.constraints:
                    constraints.setdefault(constraint.metric, constraint)
    if not params:
        named = sorted({k for f in diagnosis.findings for x in f.fixes for k in x.study_params})
        why = f" (it names {', '.join(named)}, which the study cannot replay from this log)" if named else ""
        raise ConfigError(
            f"--study: no finding of {diagnosis.source} names a server knob to tune{why}; leave --study out"
        )
    paths = study_files(out)
    for path in paths:
        check_output(path, inputs=[log])
        if path.exists() and not force:
            raise ConfigError(f"{path} exists; pass --force to replace it, or another --study path")
    study, workload, space = paths
    trace = import_trace("llama-server-log", log, {}, name=study.name.removesuffix(".toml"))
    write_atomic(workload, trace_lines(trace), inputs=[log])
    write_atomic(space, _space_text(params).encode(), inputs=[log])
    write_atomic(
        study,
        _study_text(
            diagnosis, params=params, objectives=objectives, constraints=constraints, workload=workload, space=space
        ).encode(),
        inputs=[log],
    )
    return list(paths)


def _space_text(params: list[str]) -> str:
    lines = [
        "# The llama-server knobs `tuner diagnose` found worth tuning, as search_spaces/llama-server.toml has them.",
        'engine = "llama-server"',
        'description = "Knobs named by tuner diagnose."',
    ]
    if "n_batch" in params and "n_ubatch" in params:
        lines += ['constraints = ["n_ubatch <= n_batch"]', 'line = ["n_batch", "n_ubatch"]']
    for knob in params:
        description, choices, default = STUDY_KNOBS[knob]
        lines += ["", f"[params.{knob}]", f"description = {_toml(description)}", f"choices = {_toml(choices)}"]
        if default is not None:
            lines.append(f"default = {_toml(default)}")
    return "\n".join(lines) + "\n"


def _study_text(
    diagnosis: Diagnosis,
    *,
    params: list[str],
    objectives: dict[str, StudyObjective],
    constraints: dict[str, StudyConstraint],
    workload: Path,
    space: Path,
) -> str:
    name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in workload.name.removesuffix(".workload.jsonl"))
    name = name.lstrip("_.-") or "diagnosed"
    reasons = "; ".join(f.title for f in diagnosis.findings)
    lines = [
        f"# Written by `tuner diagnose --study` from {diagnosis.source}: {reasons}.",
        "# The workload is the log's own traffic; the knobs are those the findings name. Put your model and",
        "# binary below (`auto`: the SmolLM2 model and the llama-server `tuner setup` built).",
        f"name = {_toml(name)}",
        f"description = {_toml('From the log ' + diagnosis.source + ': ' + reasons)}",
        "rounds = 2",
        "",
        "[budget]",
        "trials = 6",
        "",
        "[engine]",
        'kind = "llama-server"',
        'binary = "auto"',
        'model = "auto"',
        "[engine.settings]",
    ]
    server = diagnosis.server
    if server.n_slots is not None:
        lines.append(f"n_parallel = {server.n_slots}")
        if server.n_ctx_slot is not None:
            lines.append(f"ctx_size = {server.n_slots * server.n_ctx_slot}")
    lines += [
        "",
        "[workload]",
        f"path = {_toml(workload.name)}",
        "request_timeout_s = 300",
        "",
        "[search]",
        f"space = {_toml(space.name)}",
        f"params = {_toml([p for p in params if p != 'n_parallel' or server.n_slots is not None])}",
        'sampler = "tpe"',
        "",
        "[metrics]",
        f"long_prompt_tokens = {diagnosis.long_prompt_tokens}",
    ]
    for objective in objectives.values() or [StudyObjective(metric="ttft_p95_s", direction="minimize")]:
        lines += [
            "",
            "[[objectives]]",
            f"metric = {_toml(objective.metric)}",
            f"direction = {_toml(objective.direction)}",
            f"weight = {_toml(objective.weight)}",
        ]
    for constraint in constraints.values():
        lines += ["", "[[constraints]]", f"metric = {_toml(constraint.metric)}"]
        if constraint.min_vs_baseline is not None:
            lines.append(f"min_vs_baseline = {_toml(constraint.min_vs_baseline)}")
        if constraint.max is not None:
            lines.append(f"max = {_toml(constraint.max)}")
    return "\n".join(lines) + "\n"
