"""Importers: other tools' traces and logs turned into serve-tuner traces."""

from __future__ import annotations

from tuner.importers import azure, llama_server_log, mooncake, openai_log
from tuner.importers.base import IMPORTERS, Importer, import_trace

__all__ = ["IMPORTERS", "Importer", "azure", "import_trace", "llama_server_log", "mooncake", "openai_log"]
