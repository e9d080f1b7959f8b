"""A stand-in server for deployer tests: answers GET /health with 503 while "loading", then 200.

    health_server.py                                   on $PORT: /health only (the container tests)
    health_server.py MODEL --host H --port P [FLAGS]   vLLM's `serve` command line: /health, and
                                                       POST /v1/completions with the recorded stream

With vLLM's command line it checks what it receives, as vLLM would: an unknown flag exits 2 with
argparse's "unrecognized arguments" before binding; a completion request whose body is not what the
vllm engine sends (the served model, token ids or a text prompt, a positive max_tokens, a stream
flag) gets HTTP 400 with the reason, and the test sees a failed request instead of a silent pass. The
stream is `transcripts/vllm-completions.sse` (TRANSCRIPT-BASED: written from vLLM's documented format).

It serves one request at a time, so when a request is being handled every earlier answer has been
sent whole: the crash below happens at a known point of a replay.

    LOADING_S=S                              seconds of 503 before the first 200 (default 0.5)
    CRASH_WITH="--max-num-seqs 16"           a server started with these arguments (in this order) ...
    CRASH_AT_COMPLETION=N                    ... SIGKILLs itself on receiving its N-th completion
                                             request, as the kernel's OOM killer does to a server whose
                                             setting takes more memory than there is
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
LOADING_S = float(os.environ.get("LOADING_S", "0.5"))
STREAM = (Path(__file__).resolve().parent / "transcripts" / "vllm-completions.sse").read_bytes()


def vllm_command_line(argv: list[str]) -> argparse.Namespace:
    """The part of `vllm serve`'s command line the vllm engine writes; argparse exits 2 on anything else."""
    parser = argparse.ArgumentParser(prog="vllm serve")
    parser.add_argument("model")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name")
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--kv-cache-dtype")
    for switch in ("--enable-chunked-prefill", "--enable-prefix-caching"):
        parser.add_argument(switch, action=argparse.BooleanOptionalAction)
    return parser.parse_args(argv)


def body_problem(body: Any, model: str) -> str | None:
    """Why a completion request is not what the vllm engine sends; None when it is."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    if body.get("model") != model:
        return f"model {body.get('model')!r} is not the served model {model!r}"
    prompt = body.get("prompt")
    token_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt)
    if not token_ids and not (isinstance(prompt, str) and prompt):
        return "prompt is neither a non-empty list of token ids nor a text"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] <= 0:
        return f"max_tokens {body.get('max_tokens')!r} is not a positive integer"
    if not isinstance(body.get("stream"), bool):
        return "stream is missing"
    return None


class Handler(BaseHTTPRequestHandler):
    model: str | None = None  # set from vLLM's command line; None: /health only
    crash_at: int | None = None
    completions = 0

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        ready = time.monotonic() - STARTED >= LOADING_S
        body = b'{"status":"ok"}' if ready else b'{"error":"Loading model"}'
        self._answer(200 if ready and self.path == "/health" else 503, "application/json", body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.model is None or self.path != "/v1/completions":
            self._answer(404, "application/json", b'{"error":"not found"}')
            return
        Handler.completions += 1
        if self.crash_at is not None and Handler.completions >= self.crash_at:
            print(f"stand-in: killed at completion request {Handler.completions}, as configured", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            problem = body_problem(json.loads(data), self.model)
        except json.JSONDecodeError:
            problem = "the body is not JSON"
        if problem is not None:
            print(f"stand-in: bad completion request: {problem}", file=sys.stderr, flush=True)
            self._answer(400, "application/json", json.dumps({"error": problem}).encode())
            return
        self._answer(200, "text/event-stream", STREAM)

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("request " + format % args + "\n")


def main(argv: list[str]) -> None:
    if argv:
        line = vllm_command_line(argv)
        host, port = line.host, line.port
        Handler.model = line.served_model_name or line.model
        crash_with = os.environ.get("CRASH_WITH", "").split()
        if crash_with and any(argv[i : i + len(crash_with)] == crash_with for i in range(len(argv))):
            Handler.crash_at = int(os.environ["CRASH_AT_COMPLETION"])
    else:
        host, port = "127.0.0.1", int(os.environ["PORT"])
    print(f"stand-in server pid {os.getpid()} on port {port}", flush=True)
    HTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
