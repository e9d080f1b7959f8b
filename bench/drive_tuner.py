"""Drives serve-tuner's load generator against bench/sse_server.py, as a user's study would."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

from tuner.config import PluginSpec
from tuner.engines import create_engine
from tuner.loadgen import replay
from tuner.models import ReplayRequest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--rate", type=float, help="requests per second; all at once when omitted")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    engine = create_engine(
        PluginSpec.model_validate({"kind": "llama-server", "binary": "/bin/true", "model": "/bin/true"})
    )
    requests = [
        ReplayRequest(
            request_id=f"r{i}",
            session=f"s{i}",
            offset_s=i / args.rate if args.rate else 0.0,
            prompt_token_ids=tuple(range(100, 108)),
            output_tokens=args.tokens,
        )
        for i in range(args.requests)
    ]
    started = time.perf_counter()
    records = asyncio.run(replay(requests, engine=engine, base_url=args.base_url, request_timeout_s=600))
    took = time.perf_counter() - started
    failed = sum(1 for r in records if not r.ok)
    print(json.dumps({"failed": failed, "took_s": took, "tokens": sum(len(r.token_s) for r in records)}))


if __name__ == "__main__":
    main()
