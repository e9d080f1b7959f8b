"""`tuner run STUDY --check`: whether the study can run, found before the night instead of at its first
failure hours in (Ansible's `--check` is the model).

It reads the study as `tuner run` does (a bad file is still refused in one line, exit 2), then connects to
each host and looks, changing nothing and taking no lock: the pinned host key, `sudo -n` for every command
the deployer runs as root, the unit and what its server runs, the files the study names on the host, the
server's address, whatever on the host would decide a tuned knob instead of the trial, the memory
pre-check, the workload, and how long the study will take. Each finding is one `CheckLine`.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuner.capacity.command import SweepLength, after_study_length, budget_left_for_trials
from tuner.config import ParamValue, SearchSpace, StudySpec
from tuner.deployers.base import check_launch, create_deployer, uses_image_paths
from tuner.diagnose.study import is_local_diagnose_study
from tuner.engines.base import Engine
from tuner.errors import AssetError, ConfigError, TunerError
from tuner.http import tls_context
from tuner.models import CheckLine
from tuner.redact import redact
from tuner.runs import lock_holder
from tuner.search import PreparedStudy, fleet_hosts, host_has_file, prepare_study
from tuner.text import duration_text
from tuner.transports.base import Transport, create_transport
from tuner.trial_runner import warm_up_request

__all__ = [
    "ASSUMED_DECODE_TOK_S",
    "DEFAULT_LOCAL_RESTART_S",
    "DEFAULT_RESTART_S",
    "DurationEstimate",
    "assumed_start_s",
    "check_study",
    "estimate_duration",
]

LOCAL_STUDY_FIX = (
    "tuner diagnose wrote this as a local study: it tunes a server it starts on this machine, not the one whose "
    "log it read; write it again with `tuner diagnose LOG --study OUT.toml --like PRODUCTION.toml`, or add the "
    "production host's [host] and [deploy] tables"
)
# A server started on this machine (the simulated one, or a small model): seconds, not a GPU's tens.
DEFAULT_LOCAL_RESTART_S = 5.0
# The simulated llama-server's start: a Python process's, its model's load on its own fast clock.
DEFAULT_SIMULATED_RESTART_S = 1.0
# A server restart when no round was measured on the host yet: a small model loads in seconds, a 14B one on
# a GPU in tens of seconds; a run's own measured round time replaces this.
DEFAULT_RESTART_S = 30.0
# A stream's decode speed where the trace recorded no durations: slower than one stream on a GPU or on
# SmolLM2 on 2 cores, so that the estimate errs long.
ASSUMED_DECODE_TOK_S = 20.0
# A round's own work beside the restart, the warm-up and the replay: scoring it, storing it, the sampler's
# next proposal (0.2 s a round on 2 cores, the check test's run of 2026-12-04).
_BETWEEN_ROUNDS_S = 0.3
# The controller's own start, the host's snapshot and the dead-man timer, beside the rounds and the restore's
# restart (1.3 s between the progress file's first and last writes, and a second to import, in that run).
_STUDY_OVERHEAD_S = 3.0
_GRID_LIMIT = 10_000
# Of a model on the host, the start read for its GGUF header: metadata and the tokenizer's vocabulary of
# models up to 256K tokens fit (the tensors' data, the rest of the file, is never read).
_HEADER_BYTES = 16 * 2**20


async def check_study(
    spec: StudySpec,
    base_dir: Path,
    run_path: Path,
    *,
    hosts: Sequence[str] | None = None,
    study_text: str | None = None,
) -> list[CheckLine]:
    """Every finding for the study's host (a fleet: each host named, all by default). `ConfigError` for a
    study file `tuner run` would refuse, before any host is reached. `study_text`, the file as written,
    tells a local study `tuner diagnose` wrote from a production log."""
    targets: list[tuple[str | None, StudySpec]] = [(None, spec)]
    if spec.hosts or hosts:
        targets = [(entry.name, spec.for_host(entry)) for entry in fleet_hosts(spec, hosts)]
    prepared = {name: prepare_study(host_spec, base_dir) for name, host_spec in targets}
    lines: list[CheckLine] = []
    if study_text is not None and is_local_diagnose_study(study_text):
        lines.append(CheckLine("study", False, LOCAL_STUDY_FIX))
    for name, host_spec in targets:
        host_lines = _run_directory_lines(run_path, host=name) + await _check_host(
            host_spec, prepared[name], run_path, hosts=len(spec.hosts) or 1, fleet=name is not None
        )
        lines += (
            [CheckLine(f"{name}: {line.subject}", line.ok, line.detail) for line in host_lines] if name else host_lines
        )
    return lines


def _run_directory_lines(run_path: Path, *, host: str | None) -> list[CheckLine]:
    """A tuner that holds the study's run directory now (its run, a capacity sweep; a fleet host: that host's
    controller, or a run of the study from before it had hosts, which holds the directory alone; a study
    without hosts: also any fleet host's controller of it, as a fleet shares the directory's lock): the run
    would be refused, and the host is on that tuner's settings, not the baseline's. Said only where one does,
    or where the lock cannot be read at all."""
    if host is None:  # a study without hosts beside a fleet of it: its controllers share `.lock`, hold their hosts'
        others = sorted(path.name for path in run_path.glob(".lock-*")) if run_path.is_dir() else []
        locks = [(".lock", "the study")] + [(name, f"host {name[len('.lock-') :]} of the study") for name in others]
    else:
        locks = [(".lock", "the study"), (f".lock-{host}", f"host {host} of the study")]
    for lock, what in locks:
        try:
            owner = lock_holder(run_path, lock)
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            return [
                CheckLine(
                    "run directory",
                    False,
                    f"cannot read {run_path / lock}: {reason}; a run could not take it either: remove it, or pass "
                    "--runs-dir a directory",
                )
            ]
        if owner is not None:
            return [
                CheckLine(
                    "run directory",
                    False,
                    f"another tuner (pid {owner}) holds {what} in {run_path} now (a run or a capacity sweep), so it "
                    "would be refused and the host is on that tuner's settings: wait for it or stop it, then check "
                    "again",
                )
            ]
    return []


async def _check_host(
    spec: StudySpec, prepared: PreparedStudy, run_path: Path, *, hosts: int, fleet: bool
) -> list[CheckLine]:
    engine = prepared.engine
    try:
        launch = engine.launch_spec({})
    except AssetError as exc:  # a server started here, and no build of it here yet
        return [_workload_line(prepared), CheckLine("build", False, str(exc))]
    check_launch(spec.deploy, launch)
    lines = [_workload_line(prepared)]
    startup_s = None
    with tempfile.TemporaryDirectory(prefix="serve-tuner-check-") as scratch:
        sized = engine  # the engine whose memory pre-check knows the model's size and shape
        try:
            async with create_transport(spec.host) as transport:
                lines.append(CheckLine("host", True, f"reached over {spec.host.kind}"))
                deployer = create_deployer(spec.deploy, transport=transport)
                lines += await _privilege_lines(spec, deployer, transport)
                lines += await _file_lines(engine, spec, transport)
                check_deployment = getattr(deployer, "check", None)
                read_running_log = getattr(deployer, "running_log", None)
                if callable(check_deployment):
                    lines += await check_deployment(launch, tuned=prepared.tuned_knobs())
                running_url = getattr(deployer, "running_url", None)
                url = await running_url(launch) if callable(running_url) else None
                if not any(line.subject == "server" and not line.ok for line in lines):  # said once, above
                    timeout_s = min(60.0, spec.workload.request_timeout_s)
                    lines.append(await _request_line(engine, url, timeout_s=timeout_s))
                read_running = getattr(deployer, "running_values", None)
                found = await read_running(prepared.tuned_knobs()) if callable(read_running) else None
                try:
                    said = prepared.with_running_values(found)[1] if found is not None else []
                except ConfigError as exc:
                    lines.append(CheckLine("baseline", False, str(exc)))
                else:
                    if said:  # the baseline is the operator's own server: its values are the study's reference
                        lines.append(CheckLine("baseline", True, "the server runs " + "; ".join(said)))
                if callable(read_running_log):
                    startup_s = engine.startup_s(await read_running_log())
                sized = await _with_model_from_host(engine, deployer, transport, Path(scratch))
        except TunerError as exc:
            lines.append(CheckLine("host", False, str(exc)))
        lines += _memory_lines(prepared, sized)
    start_s = assumed_start_s(spec, prepared.engine) if startup_s is None else startup_s
    sweep = None if fleet else after_study_length(spec, prepared, run_path, start_s=start_s)
    try:
        budget_s = budget_left_for_trials(spec, sweep)
    except ConfigError as exc:
        lines.append(CheckLine("duration", False, str(exc)))
    else:
        lines.append(_duration_line(spec, prepared, run_path, startup_s=startup_s, hosts=hosts, budget_s=budget_s))
    if sweep is not None:
        lines.append(_capacity_line(spec, sweep, start_s=start_s))
    return lines


def assumed_start_s(spec: StudySpec, engine: Engine) -> float:
    """A server start when none was measured: the simulated server's, a local one's, or a host's."""
    if getattr(engine, "simulated", False):
        return DEFAULT_SIMULATED_RESTART_S
    return DEFAULT_LOCAL_RESTART_S if spec.host.kind == "local" else DEFAULT_RESTART_S


def _capacity_line(spec: StudySpec, sweep: SweepLength, *, start_s: float) -> CheckLine:
    """`[capacity] after_study`: the sweep's length, after the study's (within `budget.hours`)."""
    within = "; budget.hours holds it: trials stop starting that much earlier" if spec.budget.hours else ""
    return CheckLine(
        "capacity",
        True,
        f"then the capacity sweep of the baseline and the recommendation{within}: "
        f"{sweep.text(spec.capacity, start_s=start_s)}",
    )


async def _with_model_from_host(engine: Engine, deployer: object, transport: Transport, scratch: Path) -> Engine:
    """The engine with its model's GGUF header read from the host into `scratch`, where a memory budget is
    set and the model is on the host, not here (the unit's own, or a path the study names): the memory
    pre-check then runs as for a local model."""
    with_model_from_host = getattr(engine, "with_model_from_host", None)
    if (
        not callable(with_model_from_host)
        or getattr(engine, "memory_budget_gib", None) is None
        or engine.memory_need({}) is not None
    ):
        return engine
    served = getattr(deployer, "operator", None)
    path = getattr(engine, "model_path_on_host", lambda: None)() or (served.model if served is not None else None)
    if not path:
        return engine
    script = 'stat -L -c %s -- "$1" && head -c "$2" -- "$1" | base64 -w 0'
    done = await transport.run(
        ["sh", "-c", script, "check", path, str(_HEADER_BYTES)], timeout_s=300, check=False, privileged=True
    )
    size, _, encoded = done.stdout.partition("\n")
    if done.exit_status != 0 or not size.strip().isdigit():
        return engine
    header = scratch / "model-header.gguf"
    header.write_bytes(base64.b64decode(encoded))
    sized = with_model_from_host(header, int(size))
    assert isinstance(sized, type(engine))
    return sized


# A model the server does not have, as each says it: Ollama's `model "x" not found, try pulling it first`,
# vLLM's `The model `x` does not exist.` (an nginx 404 page or a context-length 400 is no such answer).
_NO_SUCH_MODEL = re.compile(r"(?i)model\b.{0,200}?\b(not found|does not exist)")


async def _request_line(engine: Engine, base_url: str | None, *, timeout_s: float) -> CheckLine:
    """One small request as the study sends them (its model name, its key) to the server that runs now:
    a key the server refuses or a model it does not have would otherwise end the night at the warm-up."""
    if base_url is None:
        return CheckLine("request", True, "not sent: no server runs until the study starts one (its warm-up asks)")
    call = engine.check_request()
    try:
        async with httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, headers=engine.request_headers(), verify=tls_context()
        ) as client:
            response = await client.request(call.method, call.path, json=call.json)
    except httpx.TimeoutException:
        return CheckLine("request", False, f"no answer to a request within {timeout_s:g} s; read its log")
    except httpx.HTTPError as exc:
        return CheckLine("request", False, f"a request failed: {type(exc).__name__}: {redact(str(exc))}")
    said = " ".join(redact(response.text)[:300].split())[:200]  # one line; a refusal may quote the key it refused
    code = response.status_code
    if code in (401, 403):
        has_key = bool(engine.request_headers())
        fix = (
            "set engine.api_key_env (or api_key_file) to the key the server expects"
            if not has_key
            else "the key engine.api_key_env (or api_key_file) gives is not the server's; give the right one"
        )
        return CheckLine("request", False, f"the server refused the request (HTTP {code}: {said}); {fix}")
    if code in (400, 404) and _NO_SUCH_MODEL.search(said):
        return CheckLine(
            "request", False,
            f"the server has no model by the name the study sends (HTTP {code}: {said}); set engine.model (vLLM: "
            "engine.served_model_name) to a model it serves: `ollama list`, or GET /v1/models",
        )  # fmt: skip
    if code in (301, 302, 303, 307, 308):
        where = response.headers.get("location", "")
        return CheckLine(
            "request", False,
            f"a request was redirected (HTTP {code} to {redact(where)[:120]}): an authenticating proxy "
            "sending it to a login page? set engine.api_key_env (or api_key_file) to a key the proxy takes",
        )  # fmt: skip
    if code == 503:  # busy (a full queue) or loading: the server is there, the request could not be judged
        return CheckLine("request", True, f"not judged: the server answered HTTP 503 ({said}); check again later")
    if code != 200:
        return CheckLine("request", False, f"a request got HTTP {code}: {said}")
    try:
        response.json()
    except ValueError:
        return CheckLine("request", False, f"a request got an answer that is no JSON, not the server's: {said}")
    return CheckLine("request", True, f"answered {call.method} {call.path} with the study's model name and key")


def _workload_line(prepared: PreparedStudy) -> CheckLine:
    trace, spec = prepared.trace, prepared.spec
    sessions = len(set(trace.session_codes.tolist()))
    return CheckLine(
        "workload",
        True,
        f"{spec.workload.path}: {len(trace)} requests in {sessions} sessions, "
        f"{_replay_s(prepared):.0f} s a round at time_scale {spec.workload.time_scale:g}",
    )


def _replay_s(prepared: PreparedStudy) -> float:
    """A round's replay: the last arrival (scaled), plus the longest recorded request, or where the trace
    recorded none, the longest answer decoded at ASSUMED_DECODE_TOK_S, on the server's clock (a simulated
    server's runs faster)."""
    trace = prepared.trace
    if not len(trace):
        return 0.0
    last_arrival = float(trace.offset_s.max()) * prepared.spec.workload.time_scale
    recorded = [float(d) for d in trace.duration_s.tolist() if not math.isnan(d)]
    tail = max(recorded) if recorded else float(trace.output_tokens.max()) / ASSUMED_DECODE_TOK_S
    return last_arrival + min(tail / prepared.engine.clock_speed(), prepared.spec.workload.request_timeout_s)


@dataclass(frozen=True)
class DurationEstimate:
    """A study's length on one host, as two readings: `rounds` when no trial is re-measured, and
    `rounds_if_noisy` when every one takes its `extra_rounds_if_noisy` (short, noisy rounds do). Pruned
    trials and a confirmation that stops early make a study shorter than either."""

    rounds: int
    rounds_if_noisy: int
    round_s: float
    seconds: float
    seconds_if_noisy: float


def estimate_duration(
    spec: StudySpec,
    *,
    round_s: float,
    probes_s: float = 0.0,
    fixed_s: float = 0.0,
    hosts: int = 1,
    budget_s: float | None = None,
) -> DurationEstimate:
    """The rounds one host measures and how long they take: its baseline's rounds and its share of the
    trials' (a fleet's hosts split them), cut at `budget_s` (`budget.hours` less what it holds beside the
    trials; `budget.hours` itself by default) but for the batch then in flight, and the
    confirmation's pairs of two rounds for each candidate. `probes_s`, the correctness probes, is paid once
    per trial of the search; `fixed_s` once per study."""

    def reading(per_trial: int) -> tuple[int, float]:
        search = (1 + math.ceil(spec.budget.trials / hosts)) * per_trial
        budget = budget_s if budget_s is not None else None if spec.budget.hours is None else spec.budget.hours * 3600
        if budget is not None:
            search = min(search, math.ceil(budget / round_s) + per_trial * spec.interleave)
        probing = math.ceil(search / per_trial) if spec.gate.enabled else 0
        rounds = search + spec.confirm.top * spec.confirm.pairs * 2
        return rounds, rounds * round_s + probing * probes_s + fixed_s

    rounds, seconds = reading(spec.rounds)
    rounds_if_noisy, seconds_if_noisy = reading(spec.rounds + spec.extra_rounds_if_noisy)
    return DurationEstimate(rounds, rounds_if_noisy, round_s, seconds, seconds_if_noisy)


def _measured_round_s(run_path: Path) -> float | None:
    """The mean round time (server restart and probes included) a run of this study measured on the host."""
    try:
        measured = json.loads((run_path / "progress.json").read_text()).get("round_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(measured) if isinstance(measured, int | float) and measured > 0 else None


def _duration_line(
    spec: StudySpec,
    prepared: PreparedStudy,
    run_path: Path,
    *,
    startup_s: float | None,
    hosts: int,
    budget_s: float | None,
) -> CheckLine:
    """The study's length on one host: from the round time its own run measured there, else from the
    replay, the start of the server running there now (its own log's clock) or a default, the warm-up and
    the round's own work, with the probes once a trial; then the controller's own start and the restore's
    restart."""
    speed = prepared.engine.clock_speed()
    default_s = assumed_start_s(spec, prepared.engine)
    restart_s = default_s if startup_s is None else startup_s
    measured = _measured_round_s(run_path)
    probes_s = 0.0
    if measured is not None:
        round_s, source = measured, f"{measured:.1f} s a round, as measured by this study's run so far"
    else:
        decode_tok_s = ASSUMED_DECODE_TOK_S * speed
        warm_up_s = warm_up_request(prepared.engine).output_tokens / decode_tok_s
        round_s = _replay_s(prepared) + restart_s + warm_up_s + _BETWEEN_ROUNDS_S
        # The probes are asked together: one batch, decoded at about one stream's speed.
        probes_s = spec.gate.tokens / decode_tok_s if spec.gate.enabled else 0.0
        restart = (
            f"a server start of {startup_s:.1f} s (the running server's own log)"
            if startup_s is not None
            else f"a server start taken as {default_s:g} s (none measured yet)"
        )
        clock = f" (the simulated server runs {speed:g} times faster than real time)" if speed != 1.0 else ""
        source = f"{round_s:.1f} s a round{clock}: the replay, {restart}, the warm-up and scoring"
        if probes_s:
            source += f"; the correctness probes, {probes_s:.1f} s a trial"
    estimate = estimate_duration(
        spec, round_s=round_s, probes_s=probes_s, fixed_s=_STUDY_OVERHEAD_S + restart_s, hosts=hosts, budget_s=budget_s
    )
    took = duration_text(estimate.seconds, style="estimate")
    if estimate.rounds_if_noisy == estimate.rounds:
        length = f"about {took}: {estimate.rounds} rounds"
    else:
        noisy = duration_text(estimate.seconds_if_noisy, style="estimate")
        length = (
            f"about {took} to {noisy}: {estimate.rounds} rounds, or {estimate.rounds_if_noisy} if every trial is "
            "measured again as noisy"
        )
    return CheckLine("duration", True, f"{length} (each a server restart), at {source}")


def _grid(space: SearchSpace) -> list[dict[str, ParamValue]] | None:
    """Every configuration of a space whose knobs take listed or stepped integer values; None if larger."""
    axes: list[list[ParamValue]] = []
    for param in space.params.values():
        if param.choices is not None:
            axes.append(list(param.choices))
        elif isinstance(param.low, int) and isinstance(param.high, int) and not param.log:
            step = int(param.step or 1)
            axes.append(list(range(param.low, param.high + 1, step)))
        else:
            return None
    if math.prod(len(axis) for axis in axes) > _GRID_LIMIT:
        return None
    names = list(space.params)
    configs = [dict(zip(names, values, strict=True)) for values in itertools.product(*axes)]
    return [c for c in configs if all(constraint.holds(c) for constraint in space.constraints)]


def _memory_lines(prepared: PreparedStudy, engine: Engine) -> list[CheckLine]:
    baseline = prepared.baseline_settings
    try:
        over = engine.memory_check(baseline)
    except ConfigError as exc:  # a header longer than what was read from the host, or no GGUF at all
        return [CheckLine("memory", True, f"not checked: {exc}")]
    if over is not None:
        return [
            CheckLine(
                "memory", False, f"the baseline's configuration {over}; raise the budget or lower the engine settings"
            )
        ]
    if engine.memory_need(baseline) is None:
        return [CheckLine("memory", True, "not checked from here (no budget set, or the model is on the host)")]
    grid = _grid(prepared.space)
    if grid is None:
        return [CheckLine("memory", True, "the baseline fits; each proposal is checked before its restart")]
    skipped = sum(1 for config in grid if engine.memory_check(config) is not None)
    return [
        CheckLine(
            "memory", True, f"the baseline fits; {skipped} of {len(grid)} configurations would not and are skipped"
        )
    ]


async def _privilege_lines(spec: StudySpec, deployer: object, transport: Transport) -> list[CheckLine]:
    """The deployer's root commands: through `sudo -n` (each allowed without a password), or as root."""
    commands: Sequence[str] = getattr(deployer, "privileged_commands", ())
    if not commands or spec.host.kind != "ssh":
        return []
    options: Mapping[str, object] = spec.host.options()
    if not options.get("sudo"):
        user = (await transport.run(["id", "-u"], timeout_s=30, check=False)).stdout.strip()
        if user == "0":
            return [CheckLine("privileges", True, "the login is root")]
        if getattr(deployer, "runs_as_login", False):  # a docker group member, rootless podman
            return [CheckLine("privileges", True, "its commands run as the login (host.sudo is false)")]
        fix = f"set host.sudo = true and allow it {', '.join(commands)} without a password (docs/production-host.md)"
        return [CheckLine("privileges", False, f"the login is not root and host.sudo is false; {fix}")]
    refused = []
    for command in commands:
        allowed = await transport.run(["sudo", "-n", "-l", "--", command], timeout_s=30, check=False)
        if allowed.exit_status != 0:
            refused.append(command)
    if refused:
        fix = "add them to the login's sudoers entry with NOPASSWD (docs/production-host.md)"
        return [CheckLine("privileges", False, f"`sudo -n` refuses {', '.join(refused)}; {fix}")]
    return [CheckLine("privileges", True, f"`sudo -n` allows {', '.join(commands)}")]


async def _file_lines(engine: Engine, spec: StudySpec, transport: Transport) -> list[CheckLine]:
    if uses_image_paths(spec.deploy):  # the image's and its mounts', not the host's
        return [CheckLine("files", True, "the engine's paths are the container's: a trial's start reads them")]
    lines = []
    for key, path in engine.host_files().items():
        if await host_has_file(transport, path):
            lines.append(CheckLine(key, True, f"{path} is on the host"))
        else:
            lines.append(CheckLine(key, False, f"{path} does not exist on the host; fix {key} in the study file"))
    return lines
