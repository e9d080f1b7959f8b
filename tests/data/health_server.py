"""A stand-in server for deployer tests: answers GET /health with 503 for a while, then 200."""

from __future__ import annotations

import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

STARTED = time.monotonic()
LOADING_S = float(os.environ.get("LOADING_S", "0.5"))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ready = time.monotonic() - STARTED >= LOADING_S
        self.send_response(200 if ready and self.path == "/health" else 503)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}' if ready else b'{"error":"Loading model"}')

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("request " + format % args + "\n")


if __name__ == "__main__":
    print(f"stand-in server pid {os.getpid()} on port {os.environ['PORT']}", flush=True)
    HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
