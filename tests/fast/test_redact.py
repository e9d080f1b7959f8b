"""The scrubber every text from the server passes through before it is printed, logged or stored
(tuner/redact.py), and the places that call it, each fed server text that quotes a key."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fast.test_container_deployer import Host, docker, vllm_launch  # noqa: F401 (docker: the fake docker fixture)
from tuner.config import StrictModel
from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions
from tuner.models import LaunchSpec, ReplayRequest, RequestRecord, RequestStatus
from tuner.redact import REDACTED, RedactingFilter, forget_secrets, looks_like_secret, redact, remember_secret

# Fixed, so that the parametrized test ids are the same in every process (pytest-xdist compares them).
CANARY = "sk-canary-6f1d3c0b9e8a47d2a5c4b3e2f1a09876"


@pytest.fixture(autouse=True)
def no_remembered_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


OPAQUE_TOKEN = "tok.9a8b7c6d5e4f40312a1b2c3d4e5f6a7b"  # no known key shape: only its place after Bearer gives it away


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"invalid api key Bearer {OPAQUE_TOKEN}", OPAQUE_TOKEN),
        (f'{{"error": {{"message": "Authorization: Basic {OPAQUE_TOKEN}"}}}}', OPAQUE_TOKEN),
        (f"request refused: authorization={OPAQUE_TOKEN}", OPAQUE_TOKEN),
        (f"invalid api key Bearer {CANARY}", CANARY),
        (f"401 {CANARY}", CANARY),
        ("token hf_" + "Ab3" * 8 + " refused", "Ab3" * 8),
        ("ghp_" + "x1" * 18 + " expired", "x1" * 18),
    ],
)
def test_bearer_tokens_authorization_values_and_key_shapes_are_removed_whatever_key_they_hold(
    text: str, secret: str
) -> None:
    scrubbed = redact(text)
    assert REDACTED in scrubbed and secret not in scrubbed


def test_a_remembered_key_is_removed_in_any_shape_and_where_json_escaped_it() -> None:
    key = 'plain"key/with-no-prefix-0042'
    remember_secret(key)
    body = json.dumps({"message": f"the key {key} is unknown"})
    assert key not in redact(f"refused {key}.") and "no-prefix-0042" not in redact(body)
    assert redact(f"refused {key}.") == f"refused {REDACTED}."


def test_ordinary_server_text_is_left_alone() -> None:
    text = "slot launch_slot_: id 0 | task 12 | processing task, n_tokens = 2048, error: context full (ask=4096)"
    assert redact(text) == text


@pytest.mark.parametrize(
    "value",
    [CANARY, "hf_" + "Ab3" * 8, "sk_live_" + "4f" * 8, "0123456789abcdef0123456789abcdef", "my key"],
)
def test_a_value_that_is_a_key_rather_than_a_variable_name_is_recognized(value: str) -> None:
    assert looks_like_secret(value)


@pytest.mark.parametrize("value", ["LLAMA_API_KEY", "SERVE_TUNER_TEST_KEY", "HF_TOKEN", "OPENAI_API_KEY_2024"])
def test_a_variable_name_is_not_taken_for_a_key(value: str) -> None:
    assert not looks_like_secret(value)


def test_log_records_are_scrubbed_by_the_filter_the_cli_installs() -> None:
    record = logging.LogRecord(
        "httpx", logging.DEBUG, __file__, 1, "sent %s", (f"Authorization: Bearer {CANARY}",), None
    )
    assert RedactingFilter().filter(record)
    assert CANARY not in record.getMessage() and REDACTED in record.getMessage()


def test_the_cli_scrubs_an_error_line_and_its_log_lines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever raised it (a deployer that quoted a journal line unscrubbed, say), the error line printed
    and the library log lines are the last way out."""
    import tuner.cli
    import tuner.cli.running
    from tuner.errors import DeployError

    def leaky(args: object, console: object) -> int:
        logging.getLogger("asyncssh").warning("channel data: Authorization: Bearer %s", CANARY)
        raise DeployError(f"the unit failed; journal ends: invalid api key Bearer {CANARY}")

    monkeypatch.setattr(tuner.cli.running, "run", leaky)  # the function the table names for `run`
    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers = []  # so that the CLI's basicConfig installs its own handler, as in a real run
    try:
        assert tuner.cli.main(["--log-level", "debug", "run", "study.toml"]) == 1
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers = handlers
    printed = capsys.readouterr()
    assert "journal ends: invalid api key Bearer <redacted>" in printed.err
    assert "channel data: Authorization: <redacted>" in printed.err
    assert CANARY not in printed.out + printed.err


def refusing_server(request: httpx.Request) -> httpx.Response:
    key = request.headers.get("Authorization", "").removeprefix("Bearer ")
    return httpx.Response(401, json={"error": {"code": 401, "message": f"invalid api key Bearer {key}"}})


def test_a_refused_probe_quotes_the_server_without_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.errors import MeasurementError
    from tuner.gate import ask_probes

    engine = leaky_engine(monkeypatch)
    real_client = httpx.AsyncClient

    def client(**kwargs: object) -> httpx.AsyncClient:
        return real_client(**kwargs, transport=httpx.MockTransport(refusing_server))  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "AsyncClient", client)
    with pytest.raises(MeasurementError) as caught:
        asyncio.run(ask_probes(engine, "http://server", tokens=4, timeout_s=5))
    assert "probe got HTTP 401" in str(caught.value) and "invalid api key Bearer <redacted>" in str(caught.value)
    assert "7f3a" not in str(caught.value)


@pytest.mark.parametrize(
    ("logged", "quoted"),
    [
        ("error: key opaque-key-without-a-known-shape-7f3a refused", "server log: error: key <redacted> refused"),
        ("loaded key opaque-key-without-a-known-shape-7f3a", "server log ends: loaded key <redacted>"),
    ],
)
def test_the_process_deployers_failed_start_quotes_the_servers_log_without_the_key(
    tmp_path: Path, logged: str, quoted: str
) -> None:
    from tuner.deployers import ProcessDeployer
    from tuner.deployers.process import ProcessOptions
    from tuner.errors import ServerNotReady
    from tuner.transports import LocalTransport

    remember_secret("opaque-key-without-a-known-shape-7f3a")
    launch = LaunchSpec(executable="sh", args=("-c", f"echo '{logged}' >&2; exit 1"), port=1)

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            await deployer.apply(launch, log_path=str(tmp_path / "server.log"))

    with pytest.raises(ServerNotReady) as caught:
        asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert quoted in str(caught.value) and "7f3a" not in str(caught.value)
    kept = (tmp_path / "server.log").read_text()  # the evidence the run directory keeps
    assert "7f3a" not in kept and "<redacted>" in kept


def leaky_engine(monkeypatch: pytest.MonkeyPatch) -> LlamaServerEngine:
    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", "opaque-key-without-a-known-shape-7f3a")
    return LlamaServerEngine(LlamaServerOptions(api_key_env="SERVE_TUNER_TEST_KEY", binary="/x", model="/y", port=1))


def test_a_refused_request_is_recorded_without_the_key_the_server_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's error is what the round's records file stores and what a failed trial's reason quotes;
    the key sits past the 300 characters a record keeps, so the scrub must come before the cut."""
    from tuner.loadgen import send_request

    engine = leaky_engine(monkeypatch)
    padding = "x" * 260  # the key then starts at character 287 of the record's error

    async def refusing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        await reader.readexactly(int(fields["Content-Length"]))
        key = fields["Authorization"].removeprefix("Bearer ")
        body = f"{padding} invalid api key {key}".encode()
        writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    async def scenario() -> RequestRecord:
        from tuner.streaming_http import StreamingClient

        server = await asyncio.start_server(refusing, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with (
            server,
            StreamingClient(
                f"http://127.0.0.1:{port}", headers=engine.request_headers(), connect_timeout_s=5
            ) as client,
        ):
            request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(1, 2), output_tokens=4)
            record, _ = await send_request(client, engine, request, 0.0, 5.0, due_s=0.0)
            return record

    record = asyncio.run(scenario())
    assert record.status is RequestStatus.HTTP_ERROR
    assert record.error == f"HTTP 401: {padding} invalid api key <redacted>"
    assert "opaque" not in record.model_dump_json()


OPAQUE = "opaque-key-without-a-known-shape-7f3a"  # no pattern knows it: only the remembered value does


class _NoOptions(StrictModel):
    pass


class JournalQuotingDeployer:
    """A deployer that quotes, unscrubbed, a journal line holding the key (as the systemd deployer's
    last-error-line does): the study's fail_reason is the guard left."""

    options_model = _NoOptions
    message = f"the unit failed; journal ends: license check refused key {OPAQUE}"

    def __init__(self, options: _NoOptions, *, transport: object) -> None:
        pass

    async def __aenter__(self) -> JournalQuotingDeployer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass

    async def apply(self, launch: object, *, log_path: str) -> object:
        from tuner.errors import ServerNotReady

        raise ServerNotReady(self.message)

    async def check_alive(self) -> str | None:
        return None

    async def read_log(self, since: int) -> tuple[str, int]:
        return "", since

    async def restore(self) -> None:
        pass


def run_with_journal_quoting_deployer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    from tuner.cli import main
    from tuner.deployers.base import DEPLOYERS

    monkeypatch.setitem(DEPLOYERS._entries, "journal-quoting", JournalQuotingDeployer)  # this test only
    for name in ("server", "model.gguf"):
        (tmp_path / name).write_text("")
    study = Path(__file__).resolve().parents[1] / "data" / "tiny-study.toml"
    overrides = ['deploy.kind="journal-quoting"', f'engine.binary="{tmp_path / "server"}"']
    overrides += [f'engine.model="{tmp_path / "model.gguf"}"', "budget.trials=0", "confirm.top=0"]
    argv = ["run", str(study), "--runs-dir", str(tmp_path / "runs")]
    return main([*argv, *(arg for o in overrides for arg in ("--set", o))])


def test_a_failed_trials_reason_is_stored_and_shown_without_the_key_whoever_quoted_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    remember_secret(OPAQUE)
    assert run_with_journal_quoting_deployer(tmp_path, monkeypatch) == 1
    printed = capsys.readouterr()
    assert "trial 0 FAIL the unit failed; journal ends: license check refused key <redacted>" in printed.out
    journal = (tmp_path / "runs" / "tiny" / "optuna.journal").read_text()
    assert "license check refused key <redacted>" in journal and OPAQUE not in journal
    assert OPAQUE not in printed.out + printed.err


def test_server_text_with_brackets_is_printed_as_text_not_taken_for_console_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rich reads `[...]` as markup: `[/x]` in a server's words stopped the run with a MarkupError
    traceback, and `[bold]` would vanish from the line."""
    monkeypatch.setattr(JournalQuotingDeployer, "message", "journal ends: bad [bold]header[/bold] in [/x] line")
    assert run_with_journal_quoting_deployer(tmp_path, monkeypatch) == 1
    printed = capsys.readouterr()
    assert "trial 0 FAIL journal ends: bad [bold]header[/bold] in [/x] line" in printed.out
    assert printed.err.strip().endswith("journal ends: bad [bold]header[/bold] in [/x] line")


def test_a_containers_log_line_quoted_by_a_failed_start_is_scrubbed(
    docker: Host,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    """fake_docker's failing container logs `error: unrecognized arguments: --fail-to-start`; with that
    argument remembered as a secret, the quoted log line must not show it."""
    from tuner.deployers.container import ContainerDeployer, ContainerOptions
    from tuner.errors import ServerNotReady
    from tuner.transports import LocalTransport

    _, port, name = docker
    launch = vllm_launch(port)
    broken = launch.model_copy(update={"args": (*launch.args, "--fail-to-start")})
    remember_secret("--fail-to-start")

    async def scenario() -> None:
        options = ContainerOptions(container=name, start_timeout_s=10)
        async with LocalTransport() as transport, ContainerDeployer(options, transport=transport) as deployer:
            await deployer.apply(broken, log_path=str(tmp_path / "t.log"))

    with pytest.raises(ServerNotReady) as caught:
        asyncio.run(scenario())
    assert "container log ends: error: unrecognized arguments: <redacted>" in str(caught.value)
