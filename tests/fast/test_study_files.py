"""Every study file in studies/ and every TOML snippet in README.md and docs/*.md is one the code accepts.

A snippet is a whole study (validated as a study file) or a fragment (a `[deploy]`, a fleet's `[[hosts]]`),
which is laid over a small base study of its engine the way `tuner run --set` lays values over a study
file. A snippet shown because it is refused carries `<!-- invalid: TEXT -->` on the line before its
fence, and must be refused with TEXT in the message. Paths resolve as in a file in studies/, where the
examples live, against the repository's own workloads and search spaces. Validation stops where `tuner
run` first needs a local build or a host: nothing here starts a server or reaches a host.
"""

from __future__ import annotations

import datetime
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tuner.config import StudySpec, load_study
from tuner.deployers.systemd import render_drop_in
from tuner.engines.llama_server import LlamaServerEngine
from tuner.errors import ConfigError
from tuner.search import check_simulated_server, fleet_hosts, prepare_study
from tuner.storage import shown_url

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "studies"
STUDY_FILES = sorted(STUDIES.glob("*.toml"))
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# What a study must have (StudySpec's required keys): a snippet with all of them is a whole study.
WHOLE_STUDY_KEYS = frozenset({"engine", "workload", "search", "objectives"})

# The study a fragment is laid over, per engine kind: the fewest keys a valid study of that engine needs.
_BASE_STUDIES = {
    "llama-server": """
        [engine]
        kind = "llama-server"
        [search]
        space = "../search_spaces/llama-server.toml"
        params = ["n_batch", "n_ubatch"]
    """,
    "ollama": """
        [engine]
        kind = "ollama"
        model = "llama3.2:3b"
        [search]
        space = "../search_spaces/ollama.toml"
        params = ["num_parallel"]
    """,
    "vllm": """
        [engine]
        kind = "vllm"
        model = "Qwen/Qwen2.5-0.5B-Instruct"
        [search]
        space = "../search_spaces/vllm.toml"
        params = ["enable_chunked_prefill"]
    """,
}
_BASE_STUDY_TOP = """
    name = "snippet"
    [workload]
    path = "../workloads/stall.jsonl"
    [[objectives]]
    metric = "ttft_p95_s"
    direction = "minimize"
"""

_INVALID_MARK = re.compile(r"^<!--\s*invalid:\s*(?P<expected>.+?)\s*-->$")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>\S*)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, kw_only=True)
class Snippet:
    """One ```toml block of a Markdown file."""

    source: str  # "README.md:338", the fence's line
    text: str
    refused_with: str | None  # the marked error text, for a snippet shown because it is refused


def toml_snippets(markdown: str, *, name: str) -> list[Snippet]:
    """The ```toml blocks of `markdown`, each with the `<!-- invalid: ... -->` mark on the line before it."""
    snippets: list[Snippet] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence_line = index
        body: list[str] = []
        index += 1
        # A fence closes at a line of at least as many of the same character (CommonMark).
        while index < len(lines) and not lines[index].strip().startswith(opening["fence"]):
            body.append(lines[index])
            index += 1
        index += 1
        if opening["info"] != "toml":
            continue
        before = lines[fence_line - 1].strip() if fence_line > 0 else ""
        mark = _INVALID_MARK.match(before)
        snippets.append(
            Snippet(
                source=f"{name}:{fence_line + 1}",
                text="\n".join(body) + "\n",
                refused_with=mark["expected"] if mark else None,
            )
        )
    return snippets


SNIPPETS = [
    snippet
    for document in DOCUMENTS
    for snippet in toml_snippets(document.read_text(encoding="utf-8"), name=str(document.relative_to(REPO)))
]


def toml_value(value: Any) -> str:
    """A value as TOML writes it inline, for a `--set KEY=VALUE` override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's string escapes are all TOML basic-string escapes
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)} = {toml_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"{type(value).__name__} has no TOML form")


def as_overrides(fragment: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A fragment as `tuner run --set` overrides: a table's keys one by one, so that the base study keeps
    what the fragment does not set; any other value (an array of tables too) whole."""
    overrides: list[str] = []
    for key, value in fragment.items():
        assert _BARE_KEY.match(key), f"key {key!r} cannot be written in a --set override"
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            overrides += as_overrides(value, prefix=f"{path}.")
        else:
            overrides.append(f"{path}={toml_value(value)}")
    return overrides


def check_as_tuner_run_does(
    path: Path, overrides: Sequence[str] = (), *, base_dir: Path | None = None
) -> list[StudySpec]:
    """What `tuner run` checks of a study before it needs a local build or a host: the file against the
    study model (`load_study`), a storage URL's form, and for each host of a fleet (the study itself
    without one) `prepare_study`: the host and deploy options, the engine's options and settings, the search
    space against its knobs, objectives and constraints, the workload and its LoRA adapters. A simulated
    server's options too, whose launch needs no build. Not the launch of a real engine: with `auto` it
    looks for this machine's build, which a study of a remote host does not use. Returns each host's study."""
    spec, own_dir = load_study(path, overrides)
    if spec.storage is not None:
        shown_url(spec.storage.url)
    host_specs = [spec.for_host(entry) for entry in fleet_hosts(spec, None)] or [spec]
    for host_spec in host_specs:
        prepared = prepare_study(host_spec, base_dir or own_dir)
        if isinstance(prepared.engine, LlamaServerEngine) and prepared.engine.simulated:
            check_simulated_server(host_spec, prepared.engine.launch_spec({}))
    return host_specs


def export_api_keys(data: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable an `engine.api_key_env` names, set as the operator would before `tuner run`."""
    engines = [data.get("engine") or {}, *((entry.get("engine") or {}) for entry in data.get("hosts") or [])]
    for engine in engines:
        if isinstance(engine.get("api_key_env"), str):
            monkeypatch.setenv(engine["api_key_env"], "stand-in-key-for-validation")


def check_snippet(snippet: Snippet, tmp_path: Path) -> list[StudySpec]:
    """Validates a snippet as a study in studies/ would be: a whole study as it is, a fragment over the
    base study of its engine."""
    data = tomllib.loads(snippet.text)
    path = tmp_path / "snippet.toml"
    if data.keys() >= WHOLE_STUDY_KEYS:
        path.write_text(snippet.text, encoding="utf-8")
        return check_as_tuner_run_does(path, base_dir=STUDIES)
    engine = data.get("engine") or {}
    kind = engine.get("kind", "llama-server") if isinstance(engine, dict) else "llama-server"
    path.write_text(_BASE_STUDY_TOP + _BASE_STUDIES[kind], encoding="utf-8")
    return check_as_tuner_run_does(path, as_overrides(data), base_dir=STUDIES)


def check_as_marked(snippet: Snippet, tmp_path: Path) -> None:
    """A snippet is accepted, or, marked invalid, refused with the marked text in the message."""
    if snippet.refused_with is None:
        check_snippet(snippet, tmp_path)
        return
    try:
        check_snippet(snippet, tmp_path)
    except ConfigError as exc:
        assert snippet.refused_with in str(exc), f"{snippet.source} is refused for another reason: {exc}"
    else:
        pytest.fail(f"{snippet.source} is marked invalid ({snippet.refused_with}) and is accepted")


def parsed(text: str) -> dict[str, Any]:
    """The TOML's tables, or none where it is not TOML (its own test says so)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


@pytest.fixture(autouse=True)
def _keys_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    for text in (*(path.read_text(encoding="utf-8") for path in STUDY_FILES), *(s.text for s in SNIPPETS)):
        export_api_keys(parsed(text), monkeypatch)


@pytest.mark.parametrize("study_file", STUDY_FILES, ids=lambda path: path.name)
def test_every_study_file_is_accepted_as_tuner_run_checks_it(study_file: Path) -> None:
    check_as_tuner_run_does(study_file)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda snippet: snippet.source)
def test_every_toml_snippet_of_the_docs_is_accepted_or_refused_as_marked(snippet: Snippet, tmp_path: Path) -> None:
    check_as_marked(snippet, tmp_path)


def test_every_toml_fence_of_the_docs_is_read() -> None:
    fences = sum(document.read_text(encoding="utf-8").count("```toml") for document in DOCUMENTS)
    assert fences >= 6  # the production host, the fleet, the study line by line, Ollama, vLLM, the simulator
    assert len(SNIPPETS) == fences


def _table(path: Path, name: str) -> dict[str, Any]:
    table = parsed(path.read_text(encoding="utf-8")).get(name)
    return table if isinstance(table, dict) else {}


REMOTE_STUDIES = [
    path
    for path in STUDY_FILES
    if parsed(path.read_text(encoding="utf-8")).get("hosts") or _table(path, "host").get("kind") == "ssh"
]


@pytest.mark.parametrize("study_file", REMOTE_STUDIES, ids=lambda path: path.name)
def test_every_study_of_a_remote_host_opens_with_what_to_edit_and_that_it_restarts_the_server(
    study_file: Path,
) -> None:
    text = study_file.read_text(encoding="utf-8")
    header = text[: text.index("\nname = ")]
    assert all(line.startswith("#") or not line for line in header.splitlines())
    for said in ("Copy this file, then edit:", "tuner trust-host", "restarts", "every round"):
        assert said in header, f"{study_file.name}'s opening comments do not say {said!r}"


@pytest.mark.parametrize(
    "study_file",
    [path for path in STUDY_FILES if _table(path, "deploy").get("exec_start") == "replace"],
    ids=lambda path: path.name,
)
def test_a_study_that_replaces_the_units_command_line_names_every_program_and_file_by_its_host_path(
    study_file: Path,
) -> None:
    """The drop-in's ExecStart= is the engine's whole launch: no `auto` (this machine's build), and a
    program by its absolute path (systemd refuses a bare name)."""
    (spec,) = check_as_tuner_run_does(study_file)
    options = spec.engine.options()
    named = [options.get("binary"), options.get("model"), *(options.get("lora_adapters") or {}).values()]
    assert "auto" not in named
    launch = prepare_study(spec, STUDIES).engine.launch_spec({})
    drop_in = render_drop_in(launch, exec_start="replace", note="validation")
    assert f'\nExecStart="{launch.executable}" ' in drop_in


def test_the_study_file_guides_line_by_line_is_the_demo_study() -> None:
    (line_by_line,) = [s for s in SNIPPETS if s.source.startswith("docs/study-file.md") and '"stall-demo"' in s.text]
    shown, demo = parsed(line_by_line.text), parsed((STUDIES / "stall-demo.toml").read_text(encoding="utf-8"))
    assert {**shown, "description": None} == {**demo, "description": None}  # "..." in the guide


def test_the_reader_takes_toml_fences_only_with_the_invalid_mark_on_the_line_before() -> None:
    markdown = "\n".join(
        [
            "Text.",
            "```toml",
            "rounds = 3",
            "```",
            "<!-- invalid: unknown key 'round' -->",
            "```toml",
            "round = 3",
            "```",
            "````markdown",
            "```toml",
            "inside = 'another fence'",
            "```",
            "````",
            "```sh",
            "tuner run x.toml",
            "```",
        ]
    )
    snippets = toml_snippets(markdown, name="doc.md")
    assert [(s.source, s.text, s.refused_with) for s in snippets] == [
        ("doc.md:2", "rounds = 3\n", None),
        ("doc.md:6", "round = 3\n", "unknown key 'round'"),
    ]


def test_a_fragment_is_laid_over_the_base_study_of_its_engine_keeping_what_it_does_not_set(tmp_path: Path) -> None:
    fragment = Snippet(
        source="doc.md:1",
        text="[deploy]\nstart_timeout_s = 5\n[engine.settings]\nn_parallel = 2\n"
        '[[constraints]]\nmetric = "ttft_p95_s"\nmax = 2.0\n',
        refused_with=None,
    )
    (spec,) = check_snippet(fragment, tmp_path)
    assert spec.deploy.kind == "process" and spec.deploy.options() == {"start_timeout_s": 5}
    assert spec.engine.kind == "llama-server" and spec.engine.options() == {"settings": {"n_parallel": 2}}
    assert [(c.metric, c.max) for c in spec.constraints] == [("ttft_p95_s", 2.0)]
    assert spec.search.params == ["n_batch", "n_ubatch"]
    (ollama,) = check_snippet(
        Snippet(source="doc.md:1", text='[engine]\nkind = "ollama"\n', refused_with=None), tmp_path
    )
    assert ollama.engine.options() == {"model": "llama3.2:3b"}


def test_a_fleet_hosts_own_host_table_is_checked_by_its_transport(tmp_path: Path) -> None:
    """The README's fleet once named the ssh host `address`: the study model takes any [[hosts]] host
    table, and only each host's own check refuses it."""
    fleet = '[[hosts]]\nname = "gpu-a"\nhost = { kind = "ssh", address = "gpu-a.internal" }\n'
    with pytest.raises(ConfigError, match="host: missing required key 'host'"):
        check_snippet(Snippet(source="doc.md:1", text=fleet, refused_with=None), tmp_path)
    marked = Snippet(source="doc.md:1", text=fleet, refused_with="missing required key 'host'")
    check_as_marked(marked, tmp_path)


def test_a_snippet_marked_invalid_fails_when_it_is_accepted_or_refused_for_another_reason(tmp_path: Path) -> None:
    accepted = Snippet(source="doc.md:1", text="rounds = 3\n", refused_with="unknown key")
    with pytest.raises(pytest.fail.Exception, match="is accepted"):
        check_as_marked(accepted, tmp_path)
    other_reason = Snippet(source="doc.md:1", text="rounds = 1\n", refused_with="unknown key")
    with pytest.raises(AssertionError, match="another reason"):
        check_as_marked(other_reason, tmp_path)


def test_a_simulated_servers_options_are_checked_as_tuner_run_checks_them(tmp_path: Path) -> None:
    simulated = '[engine]\nbinary = "simulated"\nextra_args = ["--sim-sped", "20"]\n'
    with pytest.raises(ConfigError, match=r"engine\.extra_args"):
        check_snippet(Snippet(source="doc.md:1", text=simulated, refused_with=None), tmp_path)


def test_the_sudoers_file_in_the_production_guide_allows_exactly_what_the_deployer_runs_as_root() -> None:
    """docs/production-host.md's sudoers file, read back: each command the systemd deployer (and the ssh
    transport's file steps) runs through `sudo -n`, at both paths sudo may find, and nothing else."""
    from tuner.deployers.systemd import SystemdDeployer

    guide = (REPO / "docs" / "production-host.md").read_text()
    block = guide[guide.index("Cmnd_Alias SERVE_TUNER = ") :].split("\ntuner ALL=", 1)[0]
    paths = {word.rstrip(",\\") for word in block.split() if word.startswith("/")}
    wanted = {"sh", "cat", "rm", *SystemdDeployer.privileged_commands}
    assert paths == {f"{prefix}/bin/{name}" for name in wanted for prefix in ("", "/usr")}
