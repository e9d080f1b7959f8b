"""`tuner record`: the proxy in front of an OpenAI-compatible upstream or Ollama's native API.

A stand-in upstream behind it answers with the OpenAI chat stream as llama-server sends it
(transcript-based: the chunk shapes of the serving-engines reference), or with Ollama's NDJSON
(transcript-based too: its documented objects, and tests/data/transcripts/ollama-*). The recording in
front of the real llama-server is in tests/real/test_record_real_server.py.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import busy_port, free_port
from tuner.errors import OutputError
from tuner.record import Recorder, RecorderOptions
from tuner.workloads import load_trace

SYSTEM = "You are the canary-system-prompt assistant."
API_KEY = "sk-canary-4242"


def chat_chunks(answer: list[str], prompt_tokens: int, include_usage: bool) -> list[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": piece}}]} for piece in answer]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    if include_usage:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(answer), "total_tokens": 0}
        events.append({**base, "choices": [], "usage": usage, "timings": {"cache_n": 0}})
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


class Upstream:
    """A stand-in OpenAI-compatible server: counts a prompt as 10 tokens per message, plus /tokenize."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            content = json.loads(request.content)["content"]
            return httpx.Response(200, json={"tokens": list(range(len(content.split())))})
        body = json.loads(request.content)
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization"))
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = chat_chunks(["Hel", "lo", " there"], 10 * len(body["messages"]), include)

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())


def run_recorder(
    tmp_path: Path,
    upstream: Upstream | OllamaUpstream,
    client_side: Callable[[httpx.AsyncClient], Awaitable[None]],
    *,
    keep_content: bool = False,
) -> Recorder:
    options = RecorderOptions(
        upstream="http://upstream", out=tmp_path / "rec.jsonl", name="rec", listen_port=0, keep_content=keep_content
    )
    recorder = Recorder(options, transport=httpx.MockTransport(upstream.handler))

    async def scenario() -> None:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(recorder.run(ready=ready.set_result))
        port = await ready
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await client_side(client)
        task.cancel()  # what Ctrl-C does: the trace is written on the way out
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    return recorder


async def chat(client: httpx.AsyncClient, messages: list[dict[str, str]], *, tag: str | None = None) -> bytes:
    headers = {"authorization": f"Bearer {API_KEY}", **({"x-tuner-tag": tag} if tag else {})}
    body = {"model": "m", "messages": messages, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


def test_the_client_gets_the_stream_it_would_get_directly_without_the_usage_chunk_the_proxy_added(
    tmp_path: Path,
) -> None:
    upstream = Upstream()
    received: list[bytes] = []

    async def client_side(client: httpx.AsyncClient) -> None:
        received.append(await chat(client, [{"role": "user", "content": "hi"}]))

    run_recorder(tmp_path, upstream, client_side)
    assert received[0] == b"".join(chat_chunks(["Hel", "lo", " there"], 10, include_usage=False))
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True}
    assert upstream.auth == [f"Bearer {API_KEY}"]


def test_sessions_history_think_time_and_a_shared_system_prompt_are_rebuilt_without_any_text(tmp_path: Path) -> None:
    upstream = Upstream()

    async def client_side(client: httpx.AsyncClient) -> None:
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "canary question one"}]
        other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a different user"}]
        await chat(client, first, tag="support")
        await chat(client, other)
        await asyncio.sleep(0.3)
        second = [*first, {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "and?"}]
        await chat(client, second, tag="support")

    recorder = run_recorder(tmp_path, upstream, client_side)
    assert recorder.recorded == 3
    trace = load_trace(tmp_path / "rec.jsonl")
    one, two, three = trace.requests
    assert one.session == three.session != two.session
    assert (three.turn, one.tag, two.tag) == (1, "support", "chat")
    assert one.prompt.shared_prefix == two.prompt.shared_prefix == three.prompt.shared_prefix
    assert one.prompt.shared_prefix[0].tokens == len(SYSTEM.split())
    # Turn 1 repeats turn 0's prompt (20 tokens) and answer (3): its history, after the shared prefix.
    assert three.prompt.history_tokens == 20 + 3 - len(SYSTEM.split()) and three.prompt.total_tokens == 40
    assert three.think_s >= 0.25 and one.output_tokens == 3
    text = (tmp_path / "rec.jsonl").read_text()
    for secret in ("canary", API_KEY, "Hello there", "question", "Bearer"):
        assert secret not in text


async def one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data  # a real upstream's body is a stream; httpx.MockTransport's json= body is not


def test_nothing_recorded_writes_no_file(tmp_path: Path) -> None:
    async def client_side(client: httpx.AsyncClient) -> None:
        assert (await client.get("/health")).json() == {"status": "ok"}

    upstream = Upstream()
    upstream_handler = upstream.handler

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, content=one_chunk(b'{"status": "ok"}'))
        return upstream_handler(request)

    upstream.handler = handler  # type: ignore[method-assign]
    recorder = run_recorder(tmp_path, upstream, client_side)
    assert recorder.recorded == 0 and not (tmp_path / "rec.jsonl").exists()


def test_an_unreachable_upstream_answers_502_in_the_openai_error_shape(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    upstream = Upstream()
    upstream.handler = handler  # type: ignore[method-assign]

    async def client_side(client: httpx.AsyncClient) -> None:
        response = await client.post("/v1/chat/completions", json={"messages": []})
        assert response.status_code == 502
        assert "unreachable" in response.json()["error"]["message"]

    run_recorder(tmp_path, upstream, client_side)


def test_a_recording_killed_mid_way_leaves_the_last_checkpoint_whole(tmp_path: Path) -> None:
    upstream = Upstream()
    options = RecorderOptions(
        upstream="http://upstream", out=tmp_path / "rec.jsonl", name="rec", listen_port=0, checkpoint_s=0.1
    )
    recorder = Recorder(options, transport=httpx.MockTransport(upstream.handler))
    seen_mid_way: list[int] = []

    async def scenario() -> None:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(recorder.run(ready=ready.set_result))
        port = await ready
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for n in range(2):
                await chat(client, [{"role": "user", "content": f"question {n}"}])
        # Wait for the checkpoint that holds both (a generous deadline, never a speed check), reading the
        # file as a SIGKILL would leave it each time: it must always be a whole trace.
        deadline = time.monotonic() + 30
        while True:
            trace = tmp_path / "rec.jsonl"
            held = len(load_trace(trace).requests) if trace.exists() else 0
            if held == 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        seen_mid_way.append(held)
        assert [p.name for p in tmp_path.iterdir()] == ["rec.jsonl"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert seen_mid_way == [2]


def test_content_is_written_only_when_the_user_asks_to_keep_it(tmp_path: Path) -> None:
    async def client_side(client: httpx.AsyncClient) -> None:
        await chat(client, [{"role": "user", "content": "canary question"}])

    run_recorder(tmp_path, Upstream(), client_side, keep_content=True)
    (request,) = load_trace(tmp_path / "rec.jsonl").requests
    assert request.content == {"messages": [{"role": "user", "content": "canary question"}]}
    assert API_KEY not in (tmp_path / "rec.jsonl").read_text()


def test_a_trace_that_keeps_message_text_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    async def client_side(client: httpx.AsyncClient) -> None:
        await chat(client, [{"role": "user", "content": "canary question"}])

    old = os.umask(0o022)  # the usual umask, under which a shape-only trace is 0644
    try:
        run_recorder(tmp_path / "text", Upstream(), client_side, keep_content=True)
        run_recorder(tmp_path / "shape", Upstream(), client_side)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "text" / "rec.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shape" / "rec.jsonl").stat().st_mode) == 0o644


# Ollama's native API. The stand-in answers as Ollama documents it (transcript-based: the object shapes
# of tests/data/transcripts/ollama-generate.ndjson and the serving-engines reference): NDJSON by default,
# one JSON object with "stream": false, and no /tokenize (a 404, as on Ollama).

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "data" / "transcripts"
ANSWER = ["Hel", "lo", " there"]


def ollama_objects(path: str, answer: list[str], prompt_tokens: int, context: list[int] | None) -> list[dict[str, Any]]:
    """/api/chat or /api/generate's objects: one per piece, then the final one with the counts (ns durations)."""

    def piece(text: str) -> dict[str, Any]:
        if path == "/api/chat":
            return {
                "model": "llama3.2:3b",
                "created_at": "2026-11-29T10:00:00Z",
                "message": {"role": "assistant", "content": text},
            }
        return {"model": "llama3.2:3b", "created_at": "2026-11-29T10:00:00Z", "response": text}

    final = {
        **piece(""),
        "done": True,
        "done_reason": "stop",
        **({"context": context} if context is not None else {}),
        "total_duration": 2_500_000_000,
        "load_duration": 100_000_000,
        "prompt_eval_count": prompt_tokens,
        "prompt_eval_duration": 400_000_000,
        "eval_count": len(answer),
        "eval_duration": 1_400_000_000,
    }
    return [{**piece(text), "done": False} for text in answer] + [final]


def token_ids(text: str, count: int) -> list[int]:
    """`count` token ids that depend on the text, as a tokenizer's would."""
    return list(hashlib.sha256(text.encode()).digest()[:count])


async def in_pieces(data: bytes, size: int = 37) -> AsyncIterator[bytes]:
    # Cut anywhere, not at line ends: the network does not keep NDJSON's lines whole.
    for start in range(0, len(data), size):
        yield data[start : start + size]


class OllamaUpstream:
    """A stand-in Ollama that keeps the bytes and headers it receives and the bytes it answers. A chat
    prompt is 10 tokens per message; a generate prompt 10 per part (system, prompt) after its `context`,
    and its final object returns the conversation so far as `context`, as Ollama does without `raw`."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.headers: list[httpx.Headers] = []
        self.sent: list[bytes] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path not in ("/api/chat", "/api/generate"):
            return httpx.Response(404, text="404 page not found")
        self.received.append(request.content)
        self.headers.append(request.headers)
        body = json.loads(request.content)
        context: list[int] | None = None
        if request.url.path == "/api/chat":
            prompt_tokens = 10 * len(body["messages"])
        else:
            parts = [part for part in (body.get("system"), body["prompt"]) if part]
            earlier = body.get("context") or []
            prompt_tokens = len(earlier) + 10 * len(parts)
            context = [*earlier, *(i for part in parts for i in token_ids(part, 10)), *token_ids("".join(ANSWER), 3)]
        objects = ollama_objects(request.url.path, ANSWER, prompt_tokens, context)
        if body.get("stream", True):
            data = b"".join(json.dumps(o).encode() + b"\n" for o in objects)
            self.sent.append(data)
            return httpx.Response(200, headers={"content-type": "application/x-ndjson"}, content=in_pieces(data))
        whole = {**objects[-1]}
        if request.url.path == "/api/chat":
            whole["message"] = {"role": "assistant", "content": "".join(ANSWER)}
        else:
            whole["response"] = "".join(ANSWER)
        data = json.dumps(whole).encode()  # Ollama's JSON answer ends without a newline
        self.sent.append(data)
        return httpx.Response(200, headers={"content-type": "application/json; charset=utf-8"}, content=in_pieces(data))


async def ollama(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], *, tag: str | None = None
) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {API_KEY}", **({"x-tuner-tag": tag} if tag else {})}
    async with client.stream("POST", path, content=json.dumps(body).encode(), headers=headers) as response:
        return response.status_code, b"".join([chunk async for chunk in response.aiter_raw()])


def final_object(answer: bytes) -> dict[str, Any]:
    last = json.loads(answer.splitlines()[-1])
    assert isinstance(last, dict) and last["done"] is True
    return last


@pytest.mark.parametrize("stream", [True, False], ids=["ndjson", "stream-false"])
@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_ollama_requests_and_answers_pass_through_unchanged_and_are_recorded_from_the_final_counts(
    path: str, stream: bool, tmp_path: Path
) -> None:
    upstream = OllamaUpstream()
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "canary question"}]}
        if path == "/api/chat"
        else {"prompt": "canary question", "options": {"num_predict": 64}}
    )
    body = {"model": "llama3.2:3b", **prompt, **({} if stream else {"stream": False})}  # streaming is the default
    answers: list[tuple[int, bytes]] = []

    async def client_side(client: httpx.AsyncClient) -> None:
        answers.append(await ollama(client, path, body, tag="support"))

    recorder = run_recorder(tmp_path, upstream, client_side)
    assert answers == [(200, upstream.sent[0])]
    assert upstream.received == [json.dumps(body).encode()]
    assert upstream.headers[0]["authorization"] == f"Bearer {API_KEY}" and "x-tuner-tag" not in upstream.headers[0]
    assert recorder.recorded == 1
    (request,) = load_trace(tmp_path / "rec.jsonl").requests
    assert (request.prompt.total_tokens, request.output_tokens, request.tag) == (10, 3, "support")
    text = (tmp_path / "rec.jsonl").read_text()
    for secret in ("canary", API_KEY, "Hello there", "Bearer"):
        assert secret not in text


def test_an_ollama_transcript_reaches_the_client_byte_for_byte_and_its_counts_are_recorded(tmp_path: Path) -> None:
    transcript = (TRANSCRIPTS / "ollama-generate.ndjson").read_bytes()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/x-ndjson"}, content=in_pieces(transcript))

    upstream = OllamaUpstream()
    upstream.handler = handler  # type: ignore[method-assign]
    answers: list[tuple[int, bytes]] = []

    async def client_side(client: httpx.AsyncClient) -> None:
        body = {"model": "llama3.2:3b", "prompt": "What is the capital of France?"}
        answers.append(await ollama(client, "/api/generate", body))

    run_recorder(tmp_path, upstream, client_side)
    assert answers == [(200, transcript)]
    (request,) = load_trace(tmp_path / "rec.jsonl").requests
    assert (request.prompt.total_tokens, request.output_tokens, request.tag) == (412, 7, "completion")


def test_an_ollama_chat_session_and_its_shared_system_prompt_are_rebuilt_without_any_text(tmp_path: Path) -> None:
    upstream = OllamaUpstream()

    async def client_side(client: httpx.AsyncClient) -> None:
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "canary question one"}]
        other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a different user"}]
        await ollama(client, "/api/chat", {"model": "m", "messages": first}, tag="support")
        await ollama(client, "/api/chat", {"model": "m", "messages": other})
        await asyncio.sleep(0.3)  # the user's think time, not a wait for the proxy
        second = [*first, {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "and?"}]
        await ollama(client, "/api/chat", {"model": "m", "messages": second, "stream": False}, tag="support")

    recorder = run_recorder(tmp_path, upstream, client_side)
    assert recorder.recorded == 3
    one, two, three = load_trace(tmp_path / "rec.jsonl").requests
    assert one.session == three.session != two.session
    assert (three.turn, one.tag, two.tag) == (1, "support", "chat")
    assert one.prompt.shared_prefix == two.prompt.shared_prefix == three.prompt.shared_prefix
    # Ollama has no /tokenize: the system prompt's tokens are its share of the prompt's characters.
    prefix = one.prompt.shared_prefix[0].tokens
    assert abs(prefix - 20 * len(SYSTEM) / len(SYSTEM + "canary question one")) <= 1
    # Turn 1 repeats turn 0's prompt (20 tokens) and answer (3): its history, after the shared prefix.
    assert three.prompt.history_tokens == 20 + 3 - prefix and three.prompt.total_tokens == 40
    assert three.think_s >= 0.25 and one.output_tokens == 3
    text = (tmp_path / "rec.jsonl").read_text()
    for secret in ("canary", API_KEY, "Hello there", "question", "Bearer"):
        assert secret not in text


def test_an_ollama_generate_session_is_followed_through_the_context_it_sends_back(tmp_path: Path) -> None:
    """The deprecated `context` holds the earlier prompt and answer; Ollama puts it before the system
    prompt, which a client may send again or not. Either way the turn continues the session."""
    upstream = OllamaUpstream()

    async def client_side(client: httpx.AsyncClient) -> None:
        for question, repeat_system in (("canary question one", True), ("a different user", False)):
            first = {"model": "m", "system": SYSTEM, "prompt": question}
            context = final_object((await ollama(client, "/api/generate", first))[1])["context"]
            second = {"model": "m", "prompt": "and?", "context": context, "stream": False}
            await ollama(client, "/api/generate", {**second, **({"system": SYSTEM} if repeat_system else {})})
        await ollama(client, "/api/generate", {"model": "m", "prompt": "canary alone"})

    run_recorder(tmp_path, upstream, client_side)
    a0, a1, b0, b1, alone = load_trace(tmp_path / "rec.jsonl").requests
    assert a0.session == a1.session != b0.session == b1.session != alone.session != a0.session
    assert (a1.turn, b1.turn, alone.turn) == (1, 1, 0)
    assert a0.prompt.shared_prefix == a1.prompt.shared_prefix == b0.prompt.shared_prefix == b1.prompt.shared_prefix
    assert not alone.prompt.shared_prefix
    prefix = a0.prompt.shared_prefix[0].tokens
    assert abs(prefix - 20 * len(SYSTEM) / len(SYSTEM + "canary question one")) <= 1
    # The context is turn 0's prompt (20 tokens) and answer (3); turn 1 adds its system and prompt, or its prompt.
    assert (a1.prompt.history_tokens, a1.prompt.total_tokens) == (23 - prefix, 23 + 20)
    assert (b1.prompt.history_tokens, b1.prompt.total_tokens) == (23 - prefix, 23 + 10)
    text = (tmp_path / "rec.jsonl").read_text()
    for secret in ("canary", "question", "context"):
        assert secret not in text


def test_an_ollama_answer_that_fails_reaches_the_client_and_is_not_recorded(tmp_path: Path) -> None:
    busy = (TRANSCRIPTS / "ollama-503.json").read_bytes()
    broken = b"".join(json.dumps(o).encode() + b"\n" for o in ollama_objects("/api/chat", ANSWER, 10, None)[:2])
    broken += b'{"error": "an error was encountered while running the model"}\n'

    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["messages"][0]["content"] == "busy":
            return httpx.Response(503, headers={"content-type": "application/json"}, content=in_pieces(busy))
        return httpx.Response(200, headers={"content-type": "application/x-ndjson"}, content=in_pieces(broken))

    upstream = OllamaUpstream()
    upstream.handler = handler  # type: ignore[method-assign]
    answers: list[tuple[int, bytes]] = []

    async def client_side(client: httpx.AsyncClient) -> None:
        for content in ("busy", "broken"):
            body = {"model": "m", "messages": [{"role": "user", "content": content}]}
            answers.append(await ollama(client, "/api/chat", body))

    recorder = run_recorder(tmp_path, upstream, client_side)
    assert answers == [(503, busy), (200, broken)]
    assert recorder.recorded == 0 and not (tmp_path / "rec.jsonl").exists()


def test_ollama_content_is_written_only_when_the_user_asks_to_keep_it(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "canary question"}]

    async def client_side(client: httpx.AsyncClient) -> None:
        await ollama(client, "/api/chat", {"model": "m", "messages": messages})
        await ollama(client, "/api/generate", {"model": "m", "system": SYSTEM, "prompt": "canary prompt"})

    run_recorder(tmp_path, OllamaUpstream(), client_side, keep_content=True)
    chat_request, generate_request = load_trace(tmp_path / "rec.jsonl").requests
    assert chat_request.content == {"messages": messages}
    assert generate_request.content == {"prompt": "canary prompt", "system": SYSTEM}
    assert API_KEY not in (tmp_path / "rec.jsonl").read_text()


def record_cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tuner", "record", "--upstream", "http://127.0.0.1:9", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("where", ["under a file", "a directory"])
def test_an_out_that_cannot_be_written_is_refused_before_anything_listens(where: str, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    if where == "a directory":
        blocker.mkdir()
        out, expected = blocker, "is a directory, not a regular file"
    else:
        blocker.write_text("a file, not a directory")
        out, expected = blocker / "rec.jsonl", "cannot be written: Not a directory; pass a path in a directory you"
    port = free_port()  # were it opened, the error would not be --out's
    result = record_cli("--listen", f"127.0.0.1:{port}", "--out", str(out), "--duration", "5")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert expected in line and "listen" not in line, line
    assert "recording:" not in result.stdout  # it never listened


def test_a_busy_listen_address_is_still_named_as_such(tmp_path: Path) -> None:
    with busy_port() as port:
        result = record_cli("--listen", f"127.0.0.1:{port}", "--out", str(tmp_path / "r.jsonl"))
    assert result.returncode == 2
    assert "cannot listen on 127.0.0.1:" in result.stderr and "pick another --listen" in result.stderr


def test_a_full_disk_while_recording_is_its_own_line_not_a_listen_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills after the proxy started: the first checkpoint's write fails with ENOSPC. The
    recording stops (what it holds can no longer be saved) and says so, and what was lost."""

    def full_disk(path: Path, data: bytes, **_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("tuner.record.proxy.write_atomic", full_disk)
    options = RecorderOptions(upstream="http://upstream", out=tmp_path / "rec.jsonl", name="rec", listen_port=0)

    async def scenario() -> None:
        both_recorded = asyncio.Event()  # the first checkpoint comes once both requests are recorded
        recorder = Recorder(
            options, transport=httpx.MockTransport(Upstream().handler), checkpoint_due=both_recorded.wait
        )
        recorder.on_request = lambda _, recorded: both_recorded.set() if recorded == 2 else None
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(recorder.run(ready=ready.set_result))
        port = await ready
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for n in range(2):
                await chat(client, [{"role": "user", "content": f"question {n}"}])
        await asyncio.wait_for(task, timeout=30)  # ends by itself at the failed checkpoint

    with pytest.raises(OutputError) as failed:
        asyncio.run(scenario())
    message = str(failed.value)
    assert message.startswith(f"no space left on the disk of {tmp_path / 'rec.jsonl'}; nothing was written")
    assert "the 2 requests recorded since are lost" in message and "listen" not in message
    assert failed.value.exit_code == 1
    assert not (tmp_path / "rec.jsonl").exists()
