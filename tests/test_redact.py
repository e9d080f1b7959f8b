"""The scrubber every text from the server passes through before it is printed, logged or stored
(tuner/redact.py), and the places that call it, each fed server text that quotes a key."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tuner.engines.llama_server import LlamaServerEngine, LlamaServerOptions
from tuner.models import ReplayRequest, RequestRecord, RequestStatus
from tuner.redact import REDACTED, RedactingFilter, forget_secrets, looks_like_secret, redact, remember_secret

CANARY = f"sk-canary-{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def no_remembered_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    "text",
    [
        f"invalid api key Bearer {CANARY}",
        f'{{"error": {{"message": "Authorization: Bearer {CANARY}"}}}}',
        f"request refused: authorization={CANARY}",
        f"401 {CANARY}",
        "token hf_" + "Ab3" * 8 + " refused",
        "ghp_" + "x1" * 18 + " expired",
    ],
)
def test_bearer_tokens_authorization_values_and_key_shapes_are_removed_whatever_key_they_hold(text: str) -> None:
    scrubbed = redact(text)
    assert REDACTED in scrubbed
    assert CANARY not in scrubbed and "Ab3Ab3" not in scrubbed and "x1x1" not in scrubbed


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
    from tuner.errors import DeployError

    def leaky(args: object, console: object) -> int:
        logging.getLogger("asyncssh").warning("channel data: Authorization: Bearer %s", CANARY)
        raise DeployError(f"the unit failed; journal ends: invalid api key Bearer {CANARY}")

    monkeypatch.setattr(tuner.cli, "_run", leaky)
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


def test_the_process_deployers_failed_start_quotes_the_servers_log_without_the_key(tmp_path: Path) -> None:
    from tuner.deployers import ProcessDeployer
    from tuner.deployers.process import ProcessOptions
    from tuner.errors import ServerNotReady
    from tuner.models import LaunchSpec
    from tuner.transports import LocalTransport

    remember_secret("opaque-key-without-a-known-shape-7f3a")
    launch = LaunchSpec(
        executable="sh",
        args=("-c", "echo 'error: key opaque-key-without-a-known-shape-7f3a refused' >&2; exit 1"),
        port=1,
    )

    async def scenario() -> None:
        async with LocalTransport() as transport, ProcessDeployer(ProcessOptions(), transport=transport) as deployer:
            await deployer.apply(launch, log_path=str(tmp_path / "server.log"))

    with pytest.raises(ServerNotReady) as caught:
        asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert "server log: error: key <redacted> refused" in str(caught.value)
    assert "7f3a" not in str(caught.value)
    assert (tmp_path / "server.log").read_text() == "error: key <redacted> refused\n"  # the evidence kept


def leaky_engine(monkeypatch: pytest.MonkeyPatch) -> LlamaServerEngine:
    monkeypatch.setenv("SERVE_TUNER_TEST_KEY", "opaque-key-without-a-known-shape-7f3a")
    return LlamaServerEngine(LlamaServerOptions(api_key_env="SERVE_TUNER_TEST_KEY", binary="/x", model="/y", port=1))


def test_a_refused_request_is_recorded_without_the_key_the_server_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's error is what the round's records file stores and what a failed trial's reason quotes;
    the key sits past the 300 characters a record keeps, so the scrub must come before the cut."""
    from tuner.loadgen import _send

    engine = leaky_engine(monkeypatch)
    padding = "x" * 260  # the key then starts at character 287 of the record's error

    def refusing(request: httpx.Request) -> httpx.Response:
        key = request.headers["Authorization"].removeprefix("Bearer ")
        return httpx.Response(401, text=f"{padding} invalid api key {key}")

    async def scenario() -> RequestRecord:
        transport = httpx.MockTransport(refusing)
        async with httpx.AsyncClient(base_url="http://server", transport=transport) as client:
            client.headers.update(engine.request_headers())
            request = ReplayRequest(request_id="a", session="s", offset_s=0, prompt_token_ids=(1, 2), output_tokens=4)
            record, _ = await _send(client, engine, request, 0.0, 5.0)
            return record

    record = asyncio.run(scenario())
    assert record.status is RequestStatus.HTTP_ERROR
    assert record.error == f"HTTP 401: {padding} invalid api key <redacted>"
    assert "opaque" not in record.model_dump_json()
