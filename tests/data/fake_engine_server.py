"""A stand-in for Ollama, vLLM and (for its launch settings only) llama-server, which cannot all run on
these machines. TRANSCRIPT-BASED: its answers are built from the wire transcripts in `transcripts/`.

It reads its settings the way the real server does (vLLM's flags, Ollama's `OLLAMA_*` variables,
llama-server's `LLAMA_ARG_*` variables and flags, each with the documented value syntax) and echoes
what it parsed at `GET /stand-in/launch`, so a test compares the value a server sees with the value
the tuner chose. It checks every request body against the engine's documented API and answers 400
with the reason on an unknown field, a wrong type, a missing field or a wrong model, so a replay
through it fails when an engine sends the wrong thing. Answers are as long as the request asks:
`max_tokens` / `num_predict` tokens, cut at the transcript's end of text (7 tokens) unless vLLM is
asked to ignore the end of text (`ignore_eos`, `min_tokens`); the usage chunk comes only when
`stream_options.include_usage` asks for it.

    fake_engine_server.py serve MODEL [--port P] [vLLM flags]   vLLM's command line
    OLLAMA_HOST=127.0.0.1:P fake_engine_server.py serve          Ollama's
    LLAMA_ARG_PORT=P fake_engine_server.py llama-server [flags]  llama-server's (/health and /completion)

Ollama's stand-in has pulled the models in STAND_IN_OLLAMA_MODELS (comma-separated; llama3.2:3b).

`GET /stand-in/requests` lists the bodies received so far. Standard library only: it also runs inside
the test systemd host, from a copy of this file and the transcripts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TRANSCRIPTS = Path(os.environ.get("TRANSCRIPTS", Path(__file__).resolve().parent / "transcripts"))

# ---- settings, read as each server reads them ----------------------------------------------------


class LaunchRefused(Exception):
    """The real server would not start with these settings; the message is what it prints."""


# vLLM 0.33 `vllm serve`: the flags the tuner uses, their types and choices (serving-engines reference 3.1).
_VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _vllm_model_len(text: str) -> int:
    """`--max-model-len` takes 1k = 1000, 1K = 1024, and -1 / auto for the largest that fits."""
    if text in ("-1", "auto"):
        return -1
    match = re.fullmatch(r"(\d+)([kKmM]?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid max_model_len {text!r}")
    scale = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}[match[2]]
    return int(match[1]) * scale


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def parse_vllm(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")  # vLLM's is 0.0.0.0: a test double stays local
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--api-key", default=None)
    settings = parser.add_argument_group("settings")  # echoed: the tuner's knobs and neighbours
    settings.add_argument("--max-num-seqs", type=int)
    settings.add_argument("--max-num-batched-tokens", type=int)
    settings.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    settings.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    settings.add_argument("--gpu-memory-utilization", type=_unit_interval)
    settings.add_argument("--max-model-len", type=_vllm_model_len)
    settings.add_argument("--kv-cache-dtype", choices=_VLLM_KV_DTYPES)
    settings.add_argument("--enable-lora", action="store_true", default=None)
    settings.add_argument("--max-loras", type=int)
    settings.add_argument("--max-lora-rank", type=int, choices=_VLLM_LORA_RANKS)
    settings.add_argument("--max-cpu-loras", type=int)
    settings.add_argument("--lora-modules", nargs="+")
    settings.add_argument("--max-num-queued-reqs", type=int)
    settings.add_argument("--long-prefill-token-threshold", type=int)
    settings.add_argument("--scheduling-policy", choices=("fcfs", "priority"))
    parsed = parser.parse_args(argv)  # exits 2 with argparse's message, as vLLM does
    names = {action.dest for action in settings._group_actions}
    values = vars(parsed)
    lora_modules: dict[str, str] = {}
    for module in values["lora_modules"] or []:
        name, equals, path = module.partition("=")
        if not equals or not name or not path:
            parser.error(f"--lora-modules takes name=path, got {module!r}")
        lora_modules[name] = path
    if lora_modules and not values["enable_lora"]:
        parser.error("--lora-modules needs --enable-lora")
    served = values["served_model_name"] or [values["model"]]
    return {
        "engine": "vllm",
        "host": values["host"],
        "port": values["port"],
        "models": served,
        "lora_modules": lora_modules,
        "settings": {name: values[name] for name in sorted(names) if values[name] is not None},
    }


# Ollama's envconfig: unsigned integers (a bad one is warned about and the default kept), Go's ParseBool
# for flags (a value that does not parse counts as true), durations or integer seconds for keep-alive.
_OLLAMA_UINTS = {
    "OLLAMA_NUM_PARALLEL": "num_parallel",
    "OLLAMA_CONTEXT_LENGTH": "context_length",
    "OLLAMA_MAX_QUEUE": "max_queue",
    "OLLAMA_MAX_LOADED_MODELS": "max_loaded_models",
}
_GO_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_GO_BOOLS |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_GO_DURATION = re.compile(r"-?(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+")


def parse_ollama(env: dict[str, str], log: Callable[[str], None]) -> dict[str, Any]:
    host, _, port = env.get("OLLAMA_HOST", "127.0.0.1:11434").rpartition(":")
    settings: dict[str, Any] = {}
    for variable, name in _OLLAMA_UINTS.items():
        if variable in env:
            if re.fullmatch(r"\d+", env[variable]):
                settings[name] = int(env[variable])
            else:
                log(
                    f'level=WARN msg="invalid environment variable, using default" key={variable} value={env[variable]}'
                )
    if "OLLAMA_FLASH_ATTENTION" in env:
        settings["flash_attention"] = _GO_BOOLS.get(env["OLLAMA_FLASH_ATTENTION"], True)
    if "OLLAMA_KV_CACHE_TYPE" in env:
        settings["kv_cache_type"] = env["OLLAMA_KV_CACHE_TYPE"]
    if "OLLAMA_KEEP_ALIVE" in env:
        keep_alive = env["OLLAMA_KEEP_ALIVE"]
        if re.fullmatch(r"-?\d+", keep_alive) or _GO_DURATION.fullmatch(keep_alive):
            settings["keep_alive"] = keep_alive
        else:
            log(
                f'level=WARN msg="invalid environment variable, using default" key=OLLAMA_KEEP_ALIVE value={keep_alive}'
            )
    # Models "pulled" on this stand-in; a name without a tag means :latest, as in Ollama.
    models = [_ollama_tag(m) for m in env.get("STAND_IN_OLLAMA_MODELS", "llama3.2:3b").split(",") if m]
    return {"engine": "ollama", "host": host or "127.0.0.1", "port": int(port), "models": models, "settings": settings}


def _ollama_tag(name: str) -> str:
    return name if ":" in name.rpartition("/")[2] else f"{name}:latest"


# llama-server (common/arg.cpp): setting -> (environment variable, flags, value kind).
_LLAMA_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_LLAMA_SETTINGS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], Any]] = {
    # name: (env, flags that set it, flags that clear it (booleans), kind: int, bool or choices)
    "n_batch": ("LLAMA_ARG_BATCH", ("-b", "--batch-size"), (), int),
    "n_ubatch": ("LLAMA_ARG_UBATCH", ("-ub", "--ubatch-size"), (), int),
    "n_parallel": ("LLAMA_ARG_N_PARALLEL", ("-np", "--parallel"), (), int),
    "kv_unified": ("LLAMA_ARG_KV_UNIFIED", ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified"), bool),
    "cache_ram": ("LLAMA_ARG_CACHE_RAM", ("-cram", "--cache-ram"), (), int),
    "ctx_size": ("LLAMA_ARG_CTX_SIZE", ("-c", "--ctx-size"), (), int),
    "threads": ("LLAMA_ARG_THREADS", ("-t", "--threads"), (), int),
    "cont_batching": ("LLAMA_ARG_CONT_BATCHING", ("-cb", "--cont-batching"), ("-nocb", "--no-cont-batching"), bool),
    "cache_prompt": ("LLAMA_ARG_CACHE_PROMPT", ("--cache-prompt",), ("--no-cache-prompt",), bool),
    "flash_attn": ("LLAMA_ARG_FLASH_ATTN", ("-fa", "--flash-attn"), (), ("on", "off", "auto")),
    "cache_type_k": ("LLAMA_ARG_CACHE_TYPE_K", ("-ctk", "--cache-type-k"), (), _LLAMA_CACHE_TYPES),
    "cache_type_v": ("LLAMA_ARG_CACHE_TYPE_V", ("-ctv", "--cache-type-v"), (), _LLAMA_CACHE_TYPES),
}
_LLAMA_PLAIN = {  # launch fields, not settings: (env, flags)
    "model": ("LLAMA_ARG_MODEL", ("-m", "--model")),
    "host": ("LLAMA_ARG_HOST", ("--host",)),
    "port": ("LLAMA_ARG_PORT", ("--port",)),
}
_TRUTHY, _FALSY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def _llama_value(kind: Any, text: str, where: str) -> Any:
    if kind is bool:
        if text in _TRUTHY or text in _FALSY:
            return text in _TRUTHY
        raise LaunchRefused(f"error while handling {where}: invalid boolean value: {text}")
    if kind is int:
        if not re.fullmatch(r"-?\d+", text):
            raise LaunchRefused(f"error while handling {where}: stoi: no conversion for {text!r}")
        return int(text)
    if text not in kind:
        raise LaunchRefused(f"error while handling {where}: unknown value {text!r}; valid: {', '.join(kind)}")
    return text


def parse_llama_server(argv: list[str], env: dict[str, str], log: Callable[[str], None]) -> dict[str, Any]:
    """Environment first, then flags, which win and are warned about (`common_params_parse_ex`)."""
    settings: dict[str, Any] = {}
    plain = {"host": "127.0.0.1", "port": "8080", "model": None}
    for name, (variable, _, clear, kind) in _LLAMA_SETTINGS.items():
        if variable in env:
            settings[name] = _llama_value(kind, env[variable], f'environment variable "{variable}"')
        if clear and variable.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") in env:
            settings[name] = False  # its mere presence means false
    for name, (variable, _) in _LLAMA_PLAIN.items():
        if variable in env:
            plain[name] = env[variable]
    flags: dict[str, tuple[str, str, Any, bool | None]] = {}  # flag: (name, its variable, kind, value it sets)
    for name, (variable, setters, clearers, kind) in _LLAMA_SETTINGS.items():
        flags |= {flag: (name, variable, kind, True if kind is bool else None) for flag in setters}
        flags |= {flag: (name, variable, kind, False) for flag in clearers}
    for name, (variable, names) in _LLAMA_PLAIN.items():
        flags |= {flag: (name, variable, str, None) for flag in names}
    loras: list[str] = []
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if flag == "--metrics":
            continue
        if flag not in flags and flag not in ("--lora-scaled", "--lora"):
            raise LaunchRefused(f"error: invalid argument: {flag}")
        name, variable, kind, fixed = flags.get(flag, ("lora", "", str, None))
        if variable and (variable in env or variable.replace("_ARG_", "_ARG_NO_") in env):
            log(
                f"warn: {variable} environment variable is set, but will be overwritten by command line argument {flag}"
            )
        if fixed is not None:  # a switch: -kvu, --no-cache-prompt
            settings[name] = fixed
            continue
        if not rest:
            raise LaunchRefused(f"error: expected value for argument {flag}")
        value = rest.pop(0)
        if flag == "--lora-scaled":
            for item in value.split(","):
                path, colon, scale = item.rpartition(":")
                if not colon or not path or not re.fullmatch(r"-?\d+(\.\d+)?", scale):
                    raise LaunchRefused(
                        f"error while handling argument --lora-scaled: expected FNAME:SCALE, got {item}"
                    )
                loras.append(f"{path}:{float(scale):g}")
        elif flag == "--lora":
            loras += [f"{path}:1" for path in value.split(",")]
        elif kind is str:
            plain[name] = value
        else:
            settings[name] = _llama_value(kind, value, f"argument {flag}")
    if not re.fullmatch(r"\d+", str(plain["port"])):
        raise LaunchRefused(f"error while handling port: {plain['port']!r}")
    return {
        "engine": "llama-server",
        "host": plain["host"],
        "port": int(str(plain["port"])),
        "models": [plain["model"]] if plain["model"] else [],
        "lora_adapters": loras,
        "settings": settings,
    }


# ---- request bodies, checked against each documented API -----------------------------------------


class BadRequest(Exception):
    def __init__(self, reason: str, *, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


def _is(kind: str, value: Any) -> bool:
    checks: dict[str, Callable[[Any], bool]] = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
        "str-or-list": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
        "str-or-number": lambda v: isinstance(v, str) or _is("number", v),
        "str-or-object": lambda v: isinstance(v, str | dict),
        "bool-or-str": lambda v: isinstance(v, bool | str),
        "str-or-any-list": lambda v: isinstance(v, str | list),
        "int-list": lambda v: isinstance(v, list) and all(_is("int", i) for i in v),
    }
    return checks[kind](value)


def check_fields(body: Any, fields: dict[str, str], *, required: tuple[str, ...], where: str) -> None:
    if not isinstance(body, dict):
        raise BadRequest(f"{where}: the body must be a JSON object")
    for name in required:
        if name not in body:
            raise BadRequest(f"{where}: missing required field {name!r}")
    for name, value in body.items():
        if name not in fields:
            raise BadRequest(f"{where}: unknown field {name!r}; valid: {', '.join(sorted(fields))}")
        if value is not None and not _is(fields[name], value):
            raise BadRequest(f"{where}: field {name!r} must be {fields[name]}, got {json.dumps(value)[:60]}")


# Ollama docs/api.md: /api/generate and /api/chat, and the `options` they take (api.Options).
_OLLAMA_OPTIONS = {
    "num_keep": "int", "seed": "int", "num_predict": "int", "top_k": "int", "top_p": "number", "min_p": "number",
    "typical_p": "number", "repeat_last_n": "int", "temperature": "number", "repeat_penalty": "number",
    "presence_penalty": "number", "frequency_penalty": "number", "stop": "str-or-list",
    "num_ctx": "int", "num_batch": "int", "num_gpu": "int", "main_gpu": "int", "use_mmap": "bool", "num_thread": "int",
}  # fmt: skip
# Load options: a request whose load options differ from the loaded runner's reloads the model (reference
# 2.2), so a replay must not send them; the stand-in refuses them rather than pretend to reload.
_OLLAMA_LOAD_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread")
_OLLAMA_GENERATE = {
    "model": "str", "prompt": "str", "suffix": "str", "images": "list", "format": "str-or-object",
    "options": "object", "system": "str", "template": "str", "stream": "bool", "raw": "bool",
    "keep_alive": "str-or-number", "context": "int-list", "think": "bool-or-str",
}  # fmt: skip
_OLLAMA_CHAT = {
    "model": "str", "messages": "list", "tools": "list", "format": "str-or-object", "options": "object",
    "stream": "bool", "keep_alive": "str-or-number", "think": "bool-or-str",
}  # fmt: skip
_CHAT_MESSAGE = {"role": "str", "content": "str", "images": "list", "tool_calls": "list", "thinking": "str"}
# Ollama's OpenAI compatibility (openai/openai.go): the fields it reads.
_OLLAMA_OPENAI_COMPLETION = {
    "model": "str", "prompt": "str", "max_tokens": "int", "temperature": "number", "top_p": "number",
    "stream": "bool", "stream_options": "object", "seed": "int", "stop": "str-or-list",
    "frequency_penalty": "number", "presence_penalty": "number", "suffix": "str",
}  # fmt: skip
_OLLAMA_OPENAI_CHAT = {
    "model": "str", "messages": "list", "max_tokens": "int", "max_completion_tokens": "int", "temperature": "number",
    "top_p": "number", "stream": "bool", "stream_options": "object", "seed": "int", "stop": "str-or-list",
    "frequency_penalty": "number", "presence_penalty": "number", "response_format": "object", "tools": "list",
}  # fmt: skip
# vLLM's CompletionRequest and ChatCompletionRequest (OpenAI fields plus its sampling extras).
_VLLM_SAMPLING = {
    "max_tokens": "int", "temperature": "number", "top_p": "number", "top_k": "int", "min_p": "number",
    "seed": "int", "stop": "str-or-list", "stop_token_ids": "int-list", "stream": "bool", "stream_options": "object",
    "n": "int", "presence_penalty": "number", "frequency_penalty": "number", "repetition_penalty": "number",
    "ignore_eos": "bool", "min_tokens": "int", "logprobs": "int", "user": "str", "priority": "int",
    "skip_special_tokens": "bool", "include_stop_str_in_output": "bool",
}  # fmt: skip
_VLLM_COMPLETION = {**_VLLM_SAMPLING, "model": "str", "prompt": "str-or-any-list", "echo": "bool", "suffix": "str"}
_VLLM_CHAT = {**_VLLM_SAMPLING, "model": "str", "messages": "list", "max_completion_tokens": "int", "tools": "list"}
_STREAM_OPTIONS = {"include_usage": "bool", "continuous_usage_stats": "bool"}


def _prompt_units(prompt: Any, where: str) -> list[Any]:
    """vLLM's prompt: a text, token ids, or a batch of either (one prompt here)."""
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list) and prompt and all(_is("int", i) for i in prompt):
        if any(i < 0 for i in prompt):
            raise BadRequest(f"{where}: token ids must be >= 0")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return _prompt_units(prompt[0], where)
    raise BadRequest(f"{where}: field 'prompt' must be a text or a list of token ids, got {json.dumps(prompt)[:60]}")


def _check_messages(messages: list[Any], where: str) -> list[str]:
    if not messages:
        raise BadRequest(f"{where}: messages must not be empty")
    words: list[str] = []
    for number, message in enumerate(messages):
        check_fields(message, _CHAT_MESSAGE, required=("role", "content"), where=f"{where} messages[{number}]")
        if message["role"] not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"{where} messages[{number}]: unknown role {message['role']!r}")
        words += str(message["content"]).split()
    return words


@dataclass(frozen=True, kw_only=True)
class Ask:
    """What one valid request asks for."""

    model: str
    prompt: list[Any]  # words or token ids: the server's prompt count is their number
    max_tokens: int | None
    stream: bool
    ignore_eos: bool = False
    min_tokens: int = 0
    usage: bool = False  # a usage chunk at the end of the stream
    continuous_usage: bool = False  # vLLM: the running count in every chunk
    return_tokens: bool = False  # llama-server: the generated ids in a whole answer


def check_ollama(path: str, body: Any, launch: dict[str, Any]) -> Ask:
    where = f"POST {path}"
    if path in {"/api/generate", "/api/chat"}:
        fields = _OLLAMA_GENERATE if path == "/api/generate" else _OLLAMA_CHAT
        check_fields(
            body, fields, required=("model",) if path == "/api/generate" else ("model", "messages"), where=where
        )
        options = body.get("options") or {}
        check_fields(options, _OLLAMA_OPTIONS, required=(), where=f"{where} options")
        for name in _OLLAMA_LOAD_OPTIONS:
            if name in options:
                raise BadRequest(f"{where}: options.{name} is a load option: Ollama reloads the model for it")
        prompt = body.get("prompt", "").split() if path == "/api/generate" else _check_messages(body["messages"], where)
        _ollama_model(body["model"], launch)
        return Ask(
            prompt=prompt,
            max_tokens=options.get("num_predict"),
            stream=body.get("stream", True),
            usage=True,
            model=body["model"],
        )
    fields = _OLLAMA_OPENAI_COMPLETION if path == "/v1/completions" else _OLLAMA_OPENAI_CHAT
    check_fields(body, fields, required=("model", "prompt" if path == "/v1/completions" else "messages"), where=where)
    usage = _stream_options(body, where, fields={"include_usage": "bool"})
    prompt = body["prompt"].split() if path == "/v1/completions" else _check_messages(body["messages"], where)
    _ollama_model(body["model"], launch)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    return Ask(prompt=prompt, max_tokens=max_tokens, stream=bool(body.get("stream")), usage=usage, model=body["model"])


def _ollama_model(name: str, launch: dict[str, Any]) -> None:
    if _ollama_tag(name) not in launch["models"]:
        raise BadRequest(f'model "{name}" not found, try pulling it first', status=404)


def _stream_options(body: dict[str, Any], where: str, *, fields: dict[str, str]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        raise BadRequest(f"{where}: Stream options can only be defined when `stream=True`.")
    check_fields(options, fields, required=(), where=f"{where} stream_options")
    return bool(options.get("include_usage"))


def check_vllm(path: str, body: Any, launch: dict[str, Any]) -> Ask:
    where = f"POST {path}"
    completion = path == "/v1/completions"
    fields = _VLLM_COMPLETION if completion else _VLLM_CHAT
    check_fields(body, fields, required=("model", "prompt" if completion else "messages"), where=where)
    usage = _stream_options(body, where, fields=_STREAM_OPTIONS)
    prompt = _prompt_units(body["prompt"], where) if completion else _check_messages(body["messages"], where)
    model = body["model"]
    if model not in launch["models"] and model not in launch["lora_modules"]:
        raise BadRequest(f"The model `{model}` does not exist.", status=404)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is None and completion:
        max_tokens = 16  # CompletionRequest's default
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest(f"{where}: max_tokens must be at least 1, got {max_tokens}")
    min_tokens = body.get("min_tokens") or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise BadRequest(f"{where}: min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}")
    longest = launch["settings"].get("max_model_len")
    if longest and longest > 0 and len(prompt) + (max_tokens or 0) > longest:
        raise BadRequest(
            f"This model's maximum context length is {longest} tokens. However, you requested "
            f"{len(prompt) + (max_tokens or 0)} tokens ({len(prompt)} in the messages, {max_tokens} in the completion)."
        )
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    return Ask(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        ignore_eos=bool(body.get("ignore_eos")),
        min_tokens=min_tokens,
        usage=usage,
        continuous_usage=continuous and usage,
        model=model,
    )


# llama-server's /completion (tools/server: params_from_json_cmpl); `lora` is [{"id", "scale"}] by the index
# of an adapter loaded at launch.
_LLAMA_COMPLETION = {
    "prompt": "str-or-any-list", "n_predict": "int", "max_tokens": "int", "ignore_eos": "bool", "stream": "bool",
    "cache_prompt": "bool", "temperature": "number", "top_k": "int", "top_p": "number", "min_p": "number",
    "seed": "int", "stop": "str-or-list", "n_keep": "int", "id_slot": "int", "lora": "list",
    "return_tokens": "bool", "timings_per_token": "bool", "return_progress": "bool", "n_cmpl": "int",
    "n_cache_reuse": "int", "n_probs": "int",
}  # fmt: skip


def check_llama_server(path: str, body: Any, launch: dict[str, Any]) -> Ask:
    where = f"POST {path}"
    check_fields(body, _LLAMA_COMPLETION, required=("prompt",), where=where)
    prompt = _prompt_units(body["prompt"], where)
    for number, adapter in enumerate(body.get("lora") or []):
        check_fields(
            adapter, {"id": "int", "scale": "number"}, required=("id", "scale"), where=f"{where} lora[{number}]"
        )
        if not 0 <= adapter["id"] < len(launch["lora_adapters"]):
            raise BadRequest(f"{where}: invalid adapter id {adapter['id']} ({len(launch['lora_adapters'])} loaded)")
    n_predict = body.get("n_predict", body.get("max_tokens", -1))
    return Ask(
        model=(launch["models"] or ["model.gguf"])[0], prompt=prompt, max_tokens=None if n_predict < 0 else n_predict,
        stream=bool(body.get("stream")), ignore_eos=bool(body.get("ignore_eos")),
        return_tokens=bool(body.get("return_tokens")),
    )  # fmt: skip


# ---- answers, sized to the request, in the transcripts' shapes ------------------------------------

_PIECES = [json.loads(line)["response"] for line in (TRANSCRIPTS / "ollama-generate.ndjson").read_text().splitlines()]
_PIECES = [p for p in _PIECES if p]  # the transcript's answer: its model ends the text after these


def tokens_to_generate(ask: Ask) -> int:
    """As many as asked; without ignore_eos the model's text ends after the transcript's pieces."""
    asked = ask.max_tokens if ask.max_tokens is not None and ask.max_tokens >= 0 else None
    if ask.ignore_eos and asked is not None:
        return asked
    natural = max(len(_PIECES), ask.min_tokens)
    return natural if asked is None else min(asked, natural)


class Cache:
    """A prefix cache: the longest prefix seen before, in blocks (vLLM's are 16 tokens), never the whole
    prompt (its last token is always computed)."""

    def __init__(self) -> None:
        self._seen: list[list[Any]] = []
        self._lock = threading.Lock()

    def cached(self, prompt: list[Any], *, enabled: bool, block: int = 16) -> int:
        with self._lock:
            best = 0
            for earlier in self._seen:
                same = 0
                for a, b in zip(earlier, prompt, strict=False):
                    if a != b:
                        break
                    same += 1
                best = max(best, min(same, len(prompt) - 1) // block * block)
            self._seen.append(prompt)
            return best if enabled else 0


def openai_answer(ask: Ask, *, chat: bool, cached: int | None, fingerprint: str) -> tuple[str, bytes]:
    count = tokens_to_generate(ask)
    finish = "length" if ask.max_tokens is not None and count == ask.max_tokens else "stop"
    usage: dict[str, Any] = {
        "prompt_tokens": len(ask.prompt),
        "total_tokens": len(ask.prompt) + count,
        "completion_tokens": count,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    kind = "chat.completion" if chat else "text_completion"
    head = {"id": "cmpl-stand-in", "created": int(time.time()), "model": ask.model, "system_fingerprint": fingerprint}
    texts = [_PIECES[i % len(_PIECES)] for i in range(count)]
    if not ask.stream:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        choice |= {"message": {"role": "assistant", "content": "".join(texts)}} if chat else {"text": "".join(texts)}
        return "application/json", json.dumps({**head, "object": kind, "choices": [choice], "usage": usage}).encode()
    lines = []
    for number, text in enumerate(texts):
        piece: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
        last = number == count - 1
        chunk: dict[str, Any] = {
            **head,
            "object": kind + (".chunk" if chat else ""),
            "choices": [{"index": 0, **piece, "finish_reason": finish if last else None}],
        }
        if ask.continuous_usage:
            chunk["usage"] = {
                "prompt_tokens": len(ask.prompt),
                "total_tokens": len(ask.prompt) + number + 1,
                "completion_tokens": number + 1,
            }
        lines.append(chunk)
    if ask.usage:
        lines.append({**head, "object": kind, "choices": [], "usage": usage})
    body = "".join(f"data: {json.dumps(line)}\n\n" for line in lines) + "data: [DONE]\n\n"
    return "text/event-stream", body.encode()


def ollama_native_answer(ask: Ask, *, chat: bool) -> tuple[str, bytes]:
    count = tokens_to_generate(ask)
    finish = "length" if ask.max_tokens is not None and count == ask.max_tokens else "stop"
    texts = [_PIECES[i % len(_PIECES)] for i in range(count)]

    def piece(text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}} if chat else {"response": text}

    # Nanosecond metrics as Ollama gives them: 1 ms per prompt token, 10 ms per generated one.
    final = {
        "model": ask.model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **piece(""),
        "done": True,
        "done_reason": finish,
        "total_duration": (len(ask.prompt) + 10 * count + 5) * 1_000_000,
        "load_duration": 1_000_000,
        "prompt_eval_count": len(ask.prompt),
        "prompt_eval_duration": len(ask.prompt) * 1_000_000,
        "eval_count": count,
        "eval_duration": 10 * count * 1_000_000,
    }
    if not ask.stream:
        final |= piece("".join(texts))
        return "application/json", json.dumps(final).encode()
    lines = [{"model": ask.model, "created_at": final["created_at"], **piece(t), "done": False} for t in texts]
    return "application/x-ndjson", "".join(json.dumps(line) + "\n" for line in [*lines, final]).encode()


def llama_server_answer(ask: Ask, *, cached: int) -> tuple[str, bytes]:
    """Partial chunks with the keys in the order this build sends them, then the final one with timings."""
    count = tokens_to_generate(ask)
    ids = [1000 + i % len(_PIECES) for i in range(count)]
    texts = [_PIECES[i % len(_PIECES)] for i in range(count)]
    computed = len(ask.prompt) - cached
    final = {"index": 0, "content": "", "tokens": [], "id_slot": 0, "stop": True, "model": ask.model,
             "tokens_predicted": count, "tokens_evaluated": len(ask.prompt),
             "stop_type": "limit" if ask.max_tokens is not None and count == ask.max_tokens else "eos",
             "tokens_cached": len(ask.prompt) + count,
             "timings": {"cache_n": cached, "prompt_n": computed, "prompt_ms": float(computed), "predicted_n": count,
                         "predicted_ms": 10.0 * count}}  # fmt: skip
    if not ask.stream:
        final |= {"content": "".join(texts), "tokens": ids if ask.return_tokens else []}
        return "application/json", json.dumps(final).encode()
    lines = [
        json.dumps({"index": 0, "content": text, "tokens": [token], "stop": False, "id_slot": -1,
                    "tokens_predicted": number + 1, "tokens_evaluated": len(ask.prompt)}, separators=(",", ":"))
        for number, (text, token) in enumerate(zip(texts, ids, strict=True))
    ]  # fmt: skip
    body = "".join(f"data: {line}\n\n" for line in [*lines, json.dumps(final)])  # no [DONE] on /completion
    return "text/event-stream", body.encode()


# ---- the server -----------------------------------------------------------------------------------


class StandIn:
    def __init__(self, launch: dict[str, Any]) -> None:
        self.launch = launch
        self.received: list[dict[str, Any]] = []
        self.cache = Cache()
        self._lock = threading.Lock()

    def get(self, path: str) -> tuple[int, str, bytes] | None:
        engine = self.launch["engine"]
        echo = {"/stand-in/launch": self.launch, "/stand-in/requests": self.received}
        if path in echo:
            with self._lock:
                return 200, "application/json", json.dumps(echo[path]).encode()
        routes: dict[str, dict[str, tuple[str, bytes]]] = {
            "ollama": {
                "/": ("text/plain", b"Ollama is running"),
                "/api/version": ("application/json", b'{"version": "0.12.3"}'),
            },
            "vllm": {
                "/health": ("application/json", b"{}"),
                "/metrics": ("text/plain", (TRANSCRIPTS / "vllm-metrics-after.txt").read_bytes()),
                "/v1/models": (
                    "application/json",
                    json.dumps(
                        {
                            "object": "list",
                            "data": [
                                {"id": name, "object": "model"}
                                # .get: this table is built for every engine, and only vLLM's launch has these
                                for name in [*self.launch.get("models", []), *self.launch.get("lora_modules", {})]
                            ],
                        }
                    ).encode(),
                ),
            },
            "llama-server": {"/health": ("application/json", b'{"status":"ok"}')},
        }
        route = routes[engine].get(path)
        return None if route is None else (200, *route)

    def post(self, path: str, raw: bytes) -> tuple[int, str, bytes] | None:
        engine = self.launch["engine"]
        routes = {
            "ollama": ("/api/generate", "/api/chat", "/api/show", "/v1/completions", "/v1/chat/completions"),
            "vllm": ("/v1/completions", "/v1/chat/completions"),
            "llama-server": ("/completion", "/completions"),
        }
        if path not in routes[engine]:
            return None
        openai_style = path.startswith("/v1/")
        try:
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise BadRequest(f"POST {path}: the body is not JSON: {exc}") from None
            with self._lock:
                self.received.append({"path": path, "body": body})
            if path == "/api/show":  # Ollama docs/api.md: a model's details, 404 where it has none by that name
                check_fields(body, {"model": "str", "verbose": "bool"}, required=("model",), where=f"POST {path}")
                _ollama_model(body["model"], self.launch)
                return 200, "application/json", json.dumps({"details": {"format": "gguf"}}).encode()
            checks = {"ollama": check_ollama, "vllm": check_vllm, "llama-server": check_llama_server}
            ask = checks[engine](path, body, self.launch)
        except BadRequest as refused:
            if openai_style:
                error: Any = {
                    "message": str(refused),
                    "type": "BadRequestError" if engine == "vllm" else "invalid_request_error",
                    "param": None,
                    "code": refused.status,
                }
            elif engine == "llama-server":
                error = {"code": refused.status, "message": str(refused), "type": "invalid_request_error"}
            else:
                error = str(refused)
            return refused.status, "application/json", json.dumps({"error": error}).encode()
        chat = path.endswith("/chat") or path.endswith("/chat/completions")
        if engine == "llama-server":
            return 200, *llama_server_answer(ask, cached=self.cache.cached(ask.prompt, enabled=True, block=1))
        if engine == "vllm":
            enabled = self.launch["settings"].get("enable_prefix_caching", True)
            cached = self.cache.cached(ask.prompt, enabled=enabled)
            return 200, *openai_answer(ask, chat=chat, cached=cached, fingerprint="vllm-stand-in")
        if openai_style:
            return 200, *openai_answer(ask, chat=chat, cached=None, fingerprint="fp_ollama")
        return 200, *ollama_native_answer(ask, chat=chat)


def handler_for(stand_in: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, answer: tuple[int, str, bytes] | None) -> None:
            status, content_type, body = answer or (404, "text/plain", b"404 page not found")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(stand_in.get(self.path))

        def do_POST(self) -> None:
            self._send(stand_in.post(self.path, self.rfile.read(int(self.headers.get("Content-Length") or 0))))

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write("request " + format % args + "\n")

    return Handler


def parse_launch(argv: list[str], env: dict[str, str], log: Callable[[str], None]) -> dict[str, Any]:
    if argv[:1] == ["llama-server"]:
        return parse_llama_server(argv[1:], env, log)
    if argv[:1] != ["serve"]:
        raise LaunchRefused(f"usage: {Path(__file__).name} serve [MODEL [vLLM flags]] | llama-server [flags]")
    if len(argv) > 1:  # `vllm serve MODEL ...`; `ollama serve` takes no arguments
        return parse_vllm(argv[1:])
    return parse_ollama(env, log)


def main() -> int:
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        launch = parse_launch(sys.argv[1:], dict(os.environ), log)
    except LaunchRefused as refused:
        log(str(refused))
        return 1
    server = ThreadingHTTPServer((launch["host"], launch["port"]), handler_for(StandIn(launch)))
    print(f"stand-in {launch['engine']} (transcripts) on {launch['host']}:{launch['port']}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
