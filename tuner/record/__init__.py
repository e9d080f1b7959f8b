"""`tuner record`: a transparent proxy that writes the traffic's shape as a trace.

It sits between an application and its server and passes every byte of a response on as soon as it
arrives, streaming included. Of each completion request (the OpenAI routes, llama-server's `/completion`
and Ollama's native `/api/chat` and `/api/generate`) it keeps only shape: arrival and end times, token
counts from the server's answer, a salted hash chain of the messages (from which sessions, history and
shared system prompts are rebuilt), LoRA use and a tag from a request header. Message text, headers and
API keys are never stored. The trace is rewritten atomically every few seconds and at the end, so an
interrupted recording leaves the last complete trace, never a torn file.

When a streaming chat client did not ask for usage, the proxy asks the server for it and removes that
extra chunk from what the client receives, so the client sees the stream it would have seen directly.
Ollama's native answers carry their counts in their final object, so they pass through untouched.

The proxy and the trace's writes are `proxy.py`; what it learns of each request and answer, `exchange.py`.
"""

from __future__ import annotations

from tuner.record.proxy import Recorder, RecorderOptions

__all__ = ["Recorder", "RecorderOptions"]
