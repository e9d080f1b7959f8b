"""The preparation of a study: the study file resolved against its engine, search space and workload, and
every check that can fail before the host is touched or a run directory is made."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tuner.config import ParamValue, PluginSpec, SearchSpace, StudySpec, load_search_space, validate_options
from tuner.deployers.base import DEPLOYERS, server_command, uses_image_paths
from tuner.engines.api_key import is_pasted_key
from tuner.engines.base import Engine, create_engine
from tuner.engines.llama_server import SIMULATED
from tuner.errors import ConfigError
from tuner.metrics import engine_metrics
from tuner.models import LaunchSpec
from tuner.search.samplers import check_sampler
from tuner.sim.command_line import CommandLineError, parse_command_line
from tuner.transports.base import TRANSPORTS, Transport, create_transport
from tuner.trial_runner import PreparedStudy
from tuner.workloads import load_trace, thin_sessions

__all__ = ["check_host_files", "check_simulated_server", "host_has_file", "prepare_study"]


def _check_plugin_options(spec: StudySpec) -> None:
    """The `[host]` and `[deploy]` tables are validated by their plugins' own models here, with the rest
    of the study, not when the host is reached: a mistake in them must not leave a run directory."""
    validate_options(TRANSPORTS.get(spec.host.kind).options_model, spec.host.options(), where="host")
    validate_options(DEPLOYERS.get(spec.deploy.kind).options_model, spec.deploy.options(), where="deploy")


def _check_space_against_knobs(space: SearchSpace, engine: Engine, space_path: Path) -> None:
    """Every value a search space can propose is one its knob takes: found here, not at the first trial."""
    for name, param in space.params.items():
        if name not in engine.knobs:
            raise ConfigError(
                f"search space knob {name!r} is not a {engine.kind} knob; valid: {', '.join(sorted(engine.knobs))}"
            )
        bounds = [("choices", c) for c in param.choices or []] + [("low", param.low), ("high", param.high)]
        for key, value in bounds:
            if value is None:
                continue
            try:
                engine.knobs[name].check(value)
            except ConfigError as exc:
                raise ConfigError(
                    f"{space_path}: params.{name}.{key}: {exc}; fix the range in the search space"
                ) from None
        try:  # what the engine's own options allow of the knob (Ollama's num_batch only on its native API)
            engine.check_settings({name: next(v for _, v in bounds if v is not None)})
        except StopIteration:
            pass
        except ConfigError as exc:
            raise ConfigError(f"{space_path}: params.{name}: {exc}") from None


def _check_settings_consistency(full_space: SearchSpace, base_settings: Mapping[str, ParamValue]) -> None:
    """engine.settings must satisfy the space's constraints (n_ubatch <= n_batch) where it sets a knob;
    the knobs it leaves out count at the space's defaults."""
    values = {n: p.default for n, p in full_space.params.items() if p.default is not None} | dict(base_settings)
    for constraint in full_space.constraints:
        names = constraint.names()
        if not any(n in base_settings for n in names) or not all(n in values for n in names):
            continue
        if not constraint.holds(values):
            shown = ", ".join(f"{n} = {values[n]!r}" + ("" if n in base_settings else " (the default)") for n in names)
            raise ConfigError(
                f"engine.settings breaks the search space's constraint {constraint.text!r} ({shown}); "
                "change engine.settings so that it holds"
            )


def _key_file_beside_the_study(engine: PluginSpec, base_dir: Path) -> PluginSpec:
    """A relative `engine.api_key_file` is the study file's neighbour, as every other path of a study is."""
    key_file = engine.options().get("api_key_file")
    if not isinstance(key_file, str) or not key_file or key_file.startswith(("/", "~")) or is_pasted_key(key_file):
        return engine  # (a pasted key is left as it is, for the engine's options to refuse unseen)
    return PluginSpec.model_validate({**engine.model_dump(), "api_key_file": str(base_dir / key_file)})


def prepare_study(spec: StudySpec, base_dir: Path) -> PreparedStudy:
    check_sampler(spec.search.sampler)
    _check_plugin_options(spec)
    engine = create_engine(
        _key_file_beside_the_study(spec.engine, base_dir),
        command=server_command(spec.deploy, local_host=spec.host.kind == "local"),
    )
    full_space = load_search_space(base_dir / spec.search.space)
    space = full_space.restricted_to(spec.search.params)
    if space.engine != engine.kind:
        raise ConfigError(
            f"search space {spec.search.space} is for {space.engine!r}, the study's engine is {engine.kind!r}"
        )
    _check_space_against_knobs(space, engine, base_dir / spec.search.space)
    _check_settings_consistency(full_space, engine.base_settings)
    known = engine_metrics(engine.metrics)
    for objective in spec.objectives:
        if objective.metric not in known:
            valid = ", ".join(sorted(known))
            raise ConfigError(f"objective metric {objective.metric!r} is unknown for {engine.kind}; valid: {valid}")
    for constraint in spec.constraints:
        if constraint.metric not in known:
            valid = ", ".join(sorted(known))
            raise ConfigError(f"constraint metric {constraint.metric!r} is unknown for {engine.kind}; valid: {valid}")
    base_settings = engine.base_settings
    baseline: dict[str, ParamValue] = {}
    for name, param in space.params.items():
        value = base_settings.get(name, param.default)
        if value is None:
            raise ConfigError(
                f"knob {name!r} has no default in the search space; set engine.settings.{name} so the baseline is known"
            )
        if not param.allows(value):
            raise ConfigError(
                f"the baseline value {value!r} of {name!r} is outside its search space; add it to choices"
            )
        baseline[name] = value
    trace = load_trace(base_dir / spec.workload.path)
    if spec.workload.keep_concurrency:
        trace = thin_sessions(trace, keep=spec.workload.time_scale, seed=spec.workload.seed)
    adapters = {adapter for uses in trace.lora_mix() for adapter, _ in uses}
    if adapters:
        engine.check_lora_adapters(adapters)
    return PreparedStudy(
        spec=spec,
        engine=engine,
        space=space,
        baseline_settings=baseline,
        trace=trace,
        predicted_from=_predicted_from(spec, engine, space, base_dir),
    )


def _predicted_from(spec: StudySpec, engine: Engine, space: SearchSpace, base_dir: Path) -> Path | None:
    """The log `search.predicted_from` names, checked before a run directory exists."""
    if spec.search.predicted_from is None:
        return None
    said = "search.predicted_from (--predicted-from)"
    if engine.kind != "llama-server":
        raise ConfigError(
            f"{said}: the simulated server models llama-server alone, and this study tunes {engine.kind}; leave it out"
        )
    log = (base_dir / spec.search.predicted_from).resolve()
    if not log.is_file():
        what = "is a directory" if log.is_dir() else "does not exist"
        raise ConfigError(
            f"{said}: {log} {what}; name the llama-server log of the server this study tunes (in the study file, "
            "relative to it), or leave it out"
        )
    from tuner.predict import check_prediction_log, check_prediction_space  # for such a study alone

    check_prediction_space(space, said=said)
    check_prediction_log(log)
    return log


def check_simulated_server(spec: StudySpec, launch: LaunchSpec) -> None:
    """The simulated llama-server runs as this machine's child process, and reads its --sim- options when
    it starts; a mistake in them is refused here, before a run directory exists, not by a failed baseline."""
    if spec.engine.kind != "llama-server" or spec.engine.options().get("binary") != SIMULATED:
        return
    if spec.host.kind != "local" or spec.deploy.kind != "process":
        raise ConfigError(
            f'engine.binary = "simulated" runs on this machine only: set host.kind = "local" and deploy.kind = '
            f'"process" (the study has {spec.host.kind!r} and {spec.deploy.kind!r})'
        )
    try:
        parse_command_line(launch.args, launch.env)
    except CommandLineError as exc:
        raise ConfigError(f"engine.extra_args: {exc}; tuner-sim-llama-server --help lists its options") from None


async def host_has_file(transport: Transport, path: str) -> bool:
    """Whether `path` is a file on the host: as the login, else as root (sudo's `sh`), since the server's
    user may read what the login cannot (a model under /srv)."""
    for privileged in (False, True):
        found = await transport.run(
            ["sh", "-c", 'test -f "$1"', "test", path], timeout_s=30, check=False, privileged=privileged
        )
        if found.exit_status == 0:
            return True
    return False


async def check_host_files(spec: StudySpec, engine: Engine) -> None:
    """The files the engine's options name exist on the host, looked at before anything is changed."""
    files = engine.host_files()
    if not files or uses_image_paths(spec.deploy):
        return  # a container's paths are its image's and its mounts': its trial's start reads them
    async with create_transport(spec.host) as transport:
        for key, path in files.items():
            if not await host_has_file(transport, path):
                raise ConfigError(f"{path} does not exist on the host; fix {key} in the study file")
