"""One TLS context for the HTTP clients the controller opens, made once.

httpx builds a new context for every client, loading the CA bundle each time: about 18 ms on a 2-core
machine, and a trial opens several clients per server start (health wait, warm-up, probes, two counter
scrapes). bench/trial_overhead.py counted them; sharing the context keeps the same verification.
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    import httpx  # on use: `tuner --help` imports no httpx (tests/fast/test_startup.py)

    return httpx.create_ssl_context()
