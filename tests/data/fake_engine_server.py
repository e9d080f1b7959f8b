"""A stand-in for Ollama and vLLM, which cannot run on these machines: it answers their documented
HTTP endpoints with the wire transcripts in `transcripts/` (TRANSCRIPT-BASED), so that the systemd
deployer can be tested deploying their launch specs to a real unit.

    fake_engine_server.py serve [MODEL] [--port P] [...]    vLLM's command line (other flags ignored)
    OLLAMA_HOST=127.0.0.1:P fake_engine_server.py serve      Ollama's
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TRANSCRIPTS = Path(os.environ.get("TRANSCRIPTS", Path(__file__).resolve().parent / "transcripts"))
ROUTES = {
    ("GET", "/"): ("text/plain", b"Ollama is running"),
    ("GET", "/api/version"): ("application/json", b'{"version": "0.12.3"}'),
    ("GET", "/health"): ("application/json", b"{}"),
    ("GET", "/metrics"): ("text/plain", (TRANSCRIPTS / "vllm-metrics-after.txt").read_bytes()),
    ("POST", "/api/generate"): ("application/x-ndjson", (TRANSCRIPTS / "ollama-generate.ndjson").read_bytes()),
    ("POST", "/v1/completions"): ("text/event-stream", (TRANSCRIPTS / "vllm-completions.sse").read_bytes()),
}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, method: str) -> None:
        if method == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        route = ROUTES.get((method, self.path))
        if route is None:
            self.send_response(404)
            self.end_headers()
            return
        content_type, body = route
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("request " + format % args + "\n")


def _address(argv: list[str]) -> tuple[str, int]:
    if "--port" in argv:
        return "127.0.0.1", int(argv[argv.index("--port") + 1])
    host, _, port = os.environ["OLLAMA_HOST"].rpartition(":")
    return host or "127.0.0.1", int(port)


if __name__ == "__main__":
    address = _address(sys.argv)
    print(f"stand-in engine server (transcripts) on {address[0]}:{address[1]}", flush=True)
    ThreadingHTTPServer(address, Handler).serve_forever()
