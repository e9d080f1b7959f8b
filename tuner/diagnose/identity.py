"""Which server wrote a log, and the models it names, from the few lines that say so.

Ollama: its own lines (`level=INFO source=routes.go:1234 msg=...`, `[GIN] 2025/01/10 - ...`) or its
journal unit (`ollama[PID]: `) beside its runner's llama-server lines; the model's name from its
scheduler's debug lines (`runner.name=registry.ollama.ai/library/llama3.2:latest`, with OLLAMA_DEBUG=1).
vLLM: the model from its engine's start-up line (`... with config: model='Qwen/Qwen2.5-7B-Instruct', ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuner.redact import redact

__all__ = ["ServerIdentity", "ollama_model_name"]

_OLLAMA_LINE = re.compile(r"\bollama\[\d+\]: |\[GIN\] \d{4}/\d{2}/\d{2} |\blevel=[A-Z]+ source=\S+\.go:\d+ ")
_OLLAMA_RUNNER_NAME = re.compile(r'\brunner\.name=(?:"([^"]+)"|(\S+))')
_VLLM_MODEL = re.compile(r"""with config: model=(?:'([^']+)'|"([^"]+)")""")
# Ollama shows a model of its own registry's library without either prefix (`llama3.2:latest`), as `ollama ps`
# does and as requests name it.
_OLLAMA_REGISTRY = "registry.ollama.ai/"
_OLLAMA_LIBRARY = "library/"
# A log that names more models than this is a multi-model server: the study asks which one to tune.
_MODELS_KEPT = 8


def ollama_model_name(full: str) -> str:
    """`registry.ollama.ai/library/llama3.2:latest` -> `llama3.2:latest`, as Ollama's requests name it."""
    if not full.startswith(_OLLAMA_REGISTRY):
        return full  # another registry's model (hf.co/...) keeps its whole name
    return full.removeprefix(_OLLAMA_REGISTRY).removeprefix(_OLLAMA_LIBRARY)


@dataclass(slots=True)
class ServerIdentity:
    """Fed every line of the log; cheap substring tests first, since most lines say none of this."""

    ollama: bool = False
    models: list[str] = field(default_factory=list)

    def feed(self, line: str) -> None:
        if not self.ollama and ("ollama[" in line or "[GIN]" in line or "source=" in line):
            self.ollama = _OLLAMA_LINE.search(line) is not None
        if "runner.name=" in line and (match := _OLLAMA_RUNNER_NAME.search(line)) is not None:
            self._model(ollama_model_name(match[1] or match[2]))
        elif "with config: model=" in line and (match := _VLLM_MODEL.search(line)) is not None:
            self._model(match[1] or match[2])

    def _model(self, name: str) -> None:
        # Text from the log is redacted where it is kept; a name that redaction would change is left unnamed
        # rather than kept mangled (the study then asks for it).
        if redact(name) != name:
            return
        if name not in self.models and len(self.models) < _MODELS_KEPT:
            self.models.append(name)
