"""A stand-in for a llama-server that quotes the key it refuses: `/health` answers 200, every other
request 401 with `invalid api key Bearer <the key it was given>` in the body, as some servers and
proxies do. With `--fail-at-start` it logs the key and exits instead, as a server that dies on a bad
key might. It reads llama-server's own variables (LLAMA_ARG_HOST, LLAMA_ARG_PORT, LLAMA_API_KEY)."""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = os.environ.get("LLAMA_API_KEY", "")


class Handler(BaseHTTPRequestHandler):
    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, {"status": "ok"})
        else:
            self._refuse()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._refuse()

    def _refuse(self) -> None:
        message = f"invalid api key Bearer {self.headers.get('Authorization', '').removeprefix('Bearer ')}"
        self._answer(401, {"error": {"code": 401, "message": message, "type": "authentication_error"}})

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("request " + format % args + "\n")


if __name__ == "__main__":
    if "--fail-at-start" in sys.argv:
        print(f"main: loaded the API key {KEY}", flush=True)
        print(f"error: key {KEY} is not accepted by the license server", file=sys.stderr, flush=True)
        sys.exit(1)
    address = (os.environ.get("LLAMA_ARG_HOST", "127.0.0.1"), int(os.environ["LLAMA_ARG_PORT"]))
    print(f"stand-in llama-server on {address[0]}:{address[1]} (refuses every key, quoting it)", flush=True)
    ThreadingHTTPServer(address, Handler).serve_forever()
