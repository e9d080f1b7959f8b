"""A loopback streaming server for load-generator benchmarks: llama-server's `/completion` stream and
the OpenAI `/v1/completions` and `/v1/chat/completions` streams, with no model behind them.

Every request gets `--tokens` tokens (or the request's own `n_predict`/`max_tokens` when
`--honour-length` is set), written in bursts of `--burst` events every `--interval-ms`. The server
records, on its own monotonic clock, when each request's headers arrived and when its stream ended,
and how many streams were open at once, and writes that to `--stats` as JSON when it gets SIGTERM.
It is one asyncio process meant to run pinned to its own core, so that the client is what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import time
from pathlib import Path

CHAT = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
TEXT = (
    b'data: {"id":"c","object":"text_completion","created":1,"model":"bench","choices":[{"index":0,"text":" tok"}]}\n\n'
)
DONE = b"data: [DONE]\n\n"
MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]}).encode()


class Stats:
    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.ends: list[float] = []
        self.tokens = 0
        self.open = 0
        self.max_open = 0


def llama_event(index: int) -> bytes:
    return (
        b'data: {"index":0,"content":" tok","tokens":[1234],"stop":false,"id_slot":-1,"tokens_predicted":'
        + str(index + 1).encode()
        + b',"tokens_evaluated":8}\n\n'
    )


_LLAMA_EVENTS: list[bytes] = []


def llama_events(up_to: int) -> list[bytes]:
    """Pre-encoded partial chunks, so that the server spends no time per token formatting them."""
    while len(_LLAMA_EVENTS) < up_to:
        _LLAMA_EVENTS.append(llama_event(len(_LLAMA_EVENTS)))
    return _LLAMA_EVENTS


def llama_final(tokens: int) -> bytes:
    final = {
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "tokens_predicted": tokens,
        "tokens_evaluated": 8,
        "timings": {"cache_n": 0, "prompt_n": 8, "prompt_ms": 1.0, "predicted_n": tokens, "predicted_ms": 1.0},
    }
    return b"data: " + json.dumps(final).encode() + b"\n\n"


async def handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, args: argparse.Namespace, stats: Stats
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = time.perf_counter()
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if method == "GET":
                payload = MODELS if path.startswith("/v1/models") else b'{"status":"ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(payload)).encode()
                    + b"\r\n\r\n"
                    + payload
                )
                await writer.drain()
                continue
            stats.arrivals.append(arrived)
            tokens = args.tokens
            if args.honour_length and body:
                request = json.loads(body)
                tokens = int(
                    request.get("n_predict")
                    or request.get("max_tokens")
                    or request.get("max_completion_tokens")
                    or tokens
                )
            stats.open += 1
            stats.max_open = max(stats.max_open, stats.open)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            sent = 0
            while sent < tokens:
                count = min(args.burst, tokens - sent)
                if path.startswith("/completion"):
                    data = b"".join(llama_events(sent + count)[sent : sent + count])
                else:
                    data = (CHAT if "chat" in path else TEXT) * count
                sent += count
                if sent >= tokens:
                    data += llama_final(tokens) if path.startswith("/completion") else DONE
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                if sent < tokens and args.interval_ms > 0:
                    await asyncio.sleep(args.interval_ms / 1000)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            stats.tokens += tokens
            stats.open -= 1
            stats.ends.append(time.perf_counter())
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--burst", type=int, default=1)
    parser.add_argument("--interval-ms", type=float, default=0.0)
    parser.add_argument("--honour-length", action="store_true")
    parser.add_argument("--stats", type=Path, required=True)
    args = parser.parse_args()
    stats = Stats()
    gc.disable()  # the server's own collector pauses would show up as the client's send-time error
    server = await asyncio.start_server(lambda r, w: handle(r, w, args, stats), "127.0.0.1", args.port, backlog=4096)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        print("ready", flush=True)
        await stop.wait()
    stats_json = {
        "arrivals": stats.arrivals,
        "ends": stats.ends,
        "tokens": stats.tokens,
        "max_open": stats.max_open,
        "cpu_s": time.process_time(),
    }
    args.stats.write_text(json.dumps(stats_json))


if __name__ == "__main__":
    asyncio.run(main())
