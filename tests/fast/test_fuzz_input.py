"""Property-based fuzzing of what users write (issue 13, deliverable 9): study values, `--set` expressions
and workload lines. Whatever is generated, the CLI ends with exit code 0, 1 or 2; an error is one line and
never a traceback; and nothing is written outside the run directory (or `--out`).

Fast tier, bounded: 100 examples per property (derandomized) and no real server. The CLI runs in-process.
Every study run points engine.binary at /bin/false: a value that passes validation then fails the
baseline in a moment (exit 1) instead of starting llama-server.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
STUDY_FILES = ("tiny-study.toml", "stall-small.jsonl", "batch-space.toml")
QUICK_FAIL = 'engine.binary="/bin/false"'

FUZZ = settings(
    max_examples=100,
    deadline=None,  # one example may run a study whose baseline fails: about a second, not a speed test
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same inputs on every run: a failure here is reproducible, never flaky
)

# Keys a study file has, and some it does not: the fuzzer writes values of every kind into them.
STUDY_KEYS = [
    "name",
    "description",
    "rounds",
    "interleave",
    "extra_rounds_if_noisy",
    "seed",
    "combine",
    "budget.trials",
    "budget.hours",
    "host.kind",
    "deploy.kind",
    "deploy.start_timeout_s",
    "deploy.stop_grace_s",
    "deploy.inherit_env",
    "engine.kind",
    "engine.port",
    "engine.host",
    "engine.extra_args",
    "engine.settings",
    "engine.settings.n_parallel",
    "engine.settings.ctx_size",
    "engine.settings.n_batch",
    "engine.settings.n_ubatch",
    "engine.settings.flash_attn",
    "engine.memory_budget_gib",
    "engine.api_key_env",
    "workload.path",
    "workload.time_scale",
    "workload.request_timeout_s",
    "workload.keep_concurrency",
    "workload.seed",
    "search.space",
    "search.params",
    "search.sampler",
    "search.pruner",
    "confirm.top",
    "confirm.pairs",
    "gate.enabled",
    "gate.tokens",
    "gate.min_agreement",
    "metrics.long_prompt_tokens",
    "metrics.min_overlap_s",
    "metrics.slo.ttft_p95_s",
    "objectives",
    "constraints",
    "unknown_key",
    "budget.unknown",
]

_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, 2, 3, -1, 50, 51, 65535, 65536, 2**31, 2**32]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1e9, 1e12, -0.0, math.inf, -math.inf, math.nan]),
    st.booleans(),
    st.text(max_size=20),
    st.sampled_from(["auto", "tpe", "random", "process", "llama-server", "n_batch", "3", "", "../../etc/passwd"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["metric", "max", "a", "kind"]), inner, max_size=3)
    ),
    max_leaves=6,
)


def toml_value(value: object) -> str:
    """A Python value as a TOML inline value (strings through JSON, whose escapes TOML shares)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() else json.dumps(key)


def toml_document(data: dict[str, object]) -> str:
    """A study as TOML text, every table inline: what the fuzzer changed is written as it is."""
    return "".join(f"{toml_key(key)} = {toml_value(value)}\n" for key, value in data.items())


def set_dotted(data: dict[str, object], key: str, value: object) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


@contextmanager
def sandbox() -> Iterator[Path]:
    """A fresh directory per example, which is also the working directory: a relative path the CLI might
    write to lands in it and is seen."""
    before = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="fuzz-") as name:
        root = Path(name)
        os.chdir(root)
        try:
            yield root
        finally:
            os.chdir(before)


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its content: a new file and a changed input are both seen."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def assert_clean_ending(code: int, out: str, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in out + err, err
    if code != 0:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err
        assert len(errors[0]) < 2000, errors[0]  # one line a person reads, not a dump


def assert_wrote_only(root: Path, before: dict[str, bytes], allowed_prefixes: tuple[str, ...]) -> None:
    after = files_under(root)
    touched = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    stray = sorted(name for name in touched if not name.startswith(allowed_prefixes))
    assert not stray, stray


def study_in(root: Path) -> Path:
    for name in STUDY_FILES:
        shutil.copy(DATA / name, root / name)
    return root / "tiny-study.toml"


@FUZZ
@given(assignments=st.lists(st.tuples(st.sampled_from(STUDY_KEYS), _values), min_size=1, max_size=3))
def test_any_study_value_ends_with_0_1_or_2_in_one_line(
    capsys: pytest.CaptureFixture[str], assignments: list[tuple[str, object]]
) -> None:
    with sandbox() as root:
        study = study_in(root)
        data = tomllib.loads(study.read_text())
        for key, value in assignments:
            set_dotted(data, key, value)
        study.write_text(toml_document(data))
        before = files_under(root)
        code, out, err = run_cli(capsys, "run", str(study), "--runs-dir", "runs", "--set", QUICK_FAIL)
        assert_clean_ending(code, out, err)
        assert_wrote_only(root, before, ("runs/",))
        if code == 2:  # the study was refused: before anything was created (validate before side effects)
            assert not (root / "runs").exists(), err


_keys = st.one_of(
    st.sampled_from(STUDY_KEYS),
    st.lists(st.sampled_from(["budget", "engine", "settings", "deploy", "x", "", " ", "0", "trials"]), max_size=4).map(
        ".".join
    ),
    st.text(max_size=15),
)
_raw_values = st.one_of(_values.map(toml_value), st.text(max_size=25))


@FUZZ
@given(expressions=st.lists(st.tuples(_keys, st.sampled_from(["=", "", "==", "= "]), _raw_values), max_size=3))
def test_any_set_expression_ends_with_0_1_or_2_in_one_line(
    capsys: pytest.CaptureFixture[str], expressions: list[tuple[str, str, str]]
) -> None:
    with sandbox() as root:
        study = study_in(root)
        before = files_under(root)
        argv = ["run", str(study), "--runs-dir", "runs", "--set", QUICK_FAIL]
        for key, sep, raw in expressions:
            argv += ["--set", f"{key}{sep}{raw}"]
        code, out, err = run_cli(capsys, *argv)
        assert_clean_ending(code, out, err)
        assert_wrote_only(root, before, ("runs/",))
        if code == 2:
            assert not (root / "runs").exists(), err


_request_fields: dict[str, st.SearchStrategy[object]] = {
    "id": st.one_of(st.text(max_size=8), st.integers()),
    "offset_s": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(), st.text(max_size=3)),
    "session": st.one_of(st.sampled_from(["s1", "s2"]), st.none()),
    "turn": st.one_of(st.integers(min_value=-2, max_value=5), st.floats(allow_nan=False)),
    "think_s": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.booleans()),
    "prompt": st.one_of(
        st.fixed_dictionaries(
            {"new_tokens": st.one_of(st.integers(min_value=-5, max_value=10**13), st.text(max_size=3))},
            optional={
                "history_tokens": st.integers(min_value=-5, max_value=10**8),
                "shared_prefix": st.lists(
                    st.fixed_dictionaries({"block": st.text(max_size=4), "tokens": st.integers(-3, 10**8)}), max_size=2
                ),
            },
        ),
        st.text(max_size=5),
        st.none(),
    ),
    "output_tokens": st.one_of(st.integers(min_value=-5, max_value=10**13), st.floats(allow_nan=False)),
    "lora": st.one_of(
        st.lists(st.fixed_dictionaries({"adapter": st.text(max_size=4)}), max_size=2), st.text(max_size=3)
    ),
    "tag": st.one_of(st.text(max_size=6), st.integers()),
    "duration_s": st.one_of(st.none(), st.floats(min_value=-1, max_value=1e6, allow_nan=False)),
}
_request_lines = st.fixed_dictionaries(
    {"id": _request_fields["id"], "offset_s": _request_fields["offset_s"], "prompt": _request_fields["prompt"]},
    optional={k: v for k, v in _request_fields.items() if k not in ("id", "offset_s", "prompt")},
).map(json.dumps)
_lines = st.one_of(_request_lines, st.text(max_size=40), st.sampled_from(["", "{}", "[]", "null", '{"id": NaN}']))
_headers = st.one_of(
    st.just(json.dumps({"format": "serve-tuner-trace", "version": 1, "name": "fuzz"})),
    st.fixed_dictionaries(
        {"format": st.sampled_from(["serve-tuner-trace", "other"]), "version": st.one_of(st.integers(), st.text())}
    ).map(json.dumps),
    st.text(max_size=30),
)


@FUZZ
@given(header=_headers, lines=st.lists(_lines, max_size=6), binary=st.binary(max_size=8))
def test_any_workload_file_ends_with_0_or_2_in_one_line(
    capsys: pytest.CaptureFixture[str], header: str, lines: list[str], binary: bytes
) -> None:
    with sandbox() as root:
        trace = root / "trace.jsonl"
        trace.write_bytes(("\n".join([header, *lines]) + "\n").encode("utf-8", "surrogatepass") + binary)
        before = files_under(root)
        code, out, err = run_cli(capsys, "workload", "show", str(trace))
        assert code in (0, 2), err  # reading a file the user gave: done, or the file is theirs to fix
        assert_clean_ending(code, out, err)
        study = study_in(root)
        shutil.copy(trace, root / "stall-small.jsonl")  # the study's workload, now the fuzzed file
        before = files_under(root)
        code, out, err = run_cli(capsys, "run", str(study), "--runs-dir", "runs", "--set", QUICK_FAIL)
        assert_clean_ending(code, out, err)
        assert_wrote_only(root, before, ("runs/",))
        if code == 2:  # refused: before anything was created
            assert not (root / "runs").exists()


@FUZZ
@given(
    kind=st.sampled_from(["chat", "stall", "agent", "summarize", "nope"]),
    users=st.one_of(st.integers(min_value=-3, max_value=40), st.sampled_from(["x", "1e3", "nan"])),
    turns=st.one_of(st.integers(min_value=-1, max_value=6), st.just("")),
    seed=st.one_of(st.integers(), st.just("s")),
)
def test_synth_with_any_flags_writes_only_its_out_or_one_line(
    capsys: pytest.CaptureFixture[str], kind: str, users: object, turns: object, seed: object
) -> None:
    with sandbox() as root:
        argv = ["workload", "synth", kind, "--users", str(users), "--turns", str(turns), "--seed", str(seed)]
        code, out, err = run_cli(capsys, *argv, "--out", "out/trace.jsonl")
        assert_clean_ending(code, out, err)
        assert set(files_under(root)) <= {"out/trace.jsonl"}
