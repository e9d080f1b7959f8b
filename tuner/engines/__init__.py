"""Engines know a server's knobs, how to launch it, how to talk to it and how to read its stream.

Adding an engine means adding one module here and one search-space file; nothing else changes.
"""

from __future__ import annotations

from tuner.engines.base import ENGINES, Engine, HttpCall, Knob, StreamEvent, create_engine
from tuner.engines.llama_server import LlamaServerEngine
from tuner.engines.ollama import OllamaEngine
from tuner.engines.vllm import VllmEngine

__all__ = [
    "ENGINES",
    "Engine",
    "HttpCall",
    "Knob",
    "LlamaServerEngine",
    "OllamaEngine",
    "StreamEvent",
    "VllmEngine",
    "create_engine",
]
