"""`tuner record` in front of the real llama-server: it records real traffic until Ctrl-C, and the trace
it writes keeps the sessions and shared prompts without any text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import free_port
from tuner.workloads import load_trace

SYSTEM = "You are the canary-system-prompt assistant."


def test_record_in_front_of_the_real_llama_server_until_ctrl_c(tmp_path: Path, llama_server_binary: Path) -> None:
    import signal

    from tuner.config import PluginSpec
    from tuner.engines import create_engine

    # One server thread: beside other tests, a busy core would stall every barrier of two.
    engine = create_engine(PluginSpec.model_validate({"kind": "llama-server", "settings": {"threads": 1}}))
    launch = engine.launch_spec({})
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([launch.executable, *launch.args], env={**os.environ, **launch.env}, stderr=log)
    listen = f"127.0.0.1:{free_port()}"
    out = tmp_path / "prod.jsonl"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "tuner", "record", "--upstream", launch.base_url, "--listen", listen, "--out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(launch.base_url):
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
        assert recorder.stdout is not None
        assert "recording:" in recorder.stdout.readline()
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
        streams = []
        with httpx.Client(base_url=f"http://{listen}", timeout=60) as client:
            for _ in range(2):
                body = {"messages": messages, "stream": True, "max_tokens": 8, "temperature": 0}
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    lines = [line for line in response.iter_lines() if line.startswith("data: {")]
                streams.append(lines)
                answer = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in lines)
                messages = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "Another."},
                ]
        recorder.send_signal(signal.SIGINT)
        assert recorder.wait(timeout=30) == 0
    finally:
        recorder.kill()
        server.kill()
        server.wait()
        log.close()
    assert all('"choices":[]' not in line.replace(" ", "") for lines in streams for line in lines)
    first, second = load_trace(out).requests
    assert first.session == second.session and second.turn == 1
    assert 1 <= first.output_tokens <= 8 and 1 <= second.output_tokens <= 8  # the model may end early
    assert first.prompt.shared_prefix and first.prompt.shared_prefix[0].tokens >= 5
    assert second.prompt.history_tokens >= first.prompt.new_tokens + first.output_tokens
    assert "colour" not in out.read_text()


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
