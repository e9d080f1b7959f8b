"""Will it fit? KV cache bytes per token from the model's own description, checked before a restart.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element. A config whose
slots x context cannot fit beside the weights is skipped before any restart, with the reason.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

__all__ = [
    "KV_ELEMENT_BYTES",
    "KvShape",
    "gguf_kv_shape",
    "hf_config_kv_shape",
    "kv_bytes_per_token",
    "parse_nvidia_smi",
]

# Bytes per element; block-quantized types include their per-block scales (llama.cpp's block sizes).
KV_ELEMENT_BYTES: dict[str, float] = {
    "f32": 4.0,
    "float32": 4.0,
    "f16": 2.0,
    "float16": 2.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "auto": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}


@dataclass(frozen=True, kw_only=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int


def kv_bytes_per_token(shape: KvShape, *, k_type: str = "f16", v_type: str | None = None) -> float:
    per_head = shape.layers * shape.kv_heads * shape.head_dim
    k = KV_ELEMENT_BYTES[k_type]
    v = KV_ELEMENT_BYTES[v_type or k_type]
    return per_head * (k + v)


@functools.cache
def gguf_kv_shape(path: Path) -> KvShape:
    """From a GGUF header: `<arch>.block_count`, `.attention.head_count(_kv)`, `.embedding_length`
    and, when present, `.attention.key_length` (models whose head dim is not embedding / heads)."""
    try:
        metadata = read_gguf_metadata(path)
    except (OSError, ValueError, struct.error) as exc:
        raise ConfigError(f"{path}: cannot read the GGUF header: {exc}") from None
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ConfigError(f"{path}: no general.architecture in the GGUF header")

    def number(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return value if isinstance(value, int) else None

    layers, heads, embedding = number("block_count"), number("attention.head_count"), number("embedding_length")
    if layers is None or heads is None or embedding is None:
        raise ConfigError(f"{path}: the header lacks {arch}.block_count, head_count or embedding_length")
    return KvShape(
        layers=layers,
        kv_heads=number("attention.head_count_kv") or heads,
        head_dim=number("attention.key_length") or embedding // heads,
    )


# GGUF value types: struct format of the scalar ones; 8 = string, 9 = array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf_metadata(path: Path) -> dict[str, object]:
    """The key-value section of a GGUF file (scalars and strings; arrays are skipped), read without the
    tensor index: the gguf package's reader parses a whole vocabulary and takes seconds."""
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        version, _tensors, count = struct.unpack("<IQQ", handle.read(20))
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")

        def string() -> str:
            (length,) = struct.unpack("<Q", handle.read(8))
            return handle.read(length).decode("utf-8", errors="replace")

        def value(kind: int) -> object:
            if kind in _GGUF_SCALARS:
                fmt = "<" + _GGUF_SCALARS[kind]
                return struct.unpack(fmt, handle.read(struct.calcsize(fmt)))[0]
            if kind == 8:
                return string()
            if kind == 9:
                element, length = struct.unpack("<IQ", handle.read(12))
                if element in _GGUF_SCALARS:
                    handle.seek(length * struct.calcsize("<" + _GGUF_SCALARS[element]), 1)
                else:
                    for _ in range(length):
                        value(element)
                return None
            raise ValueError(f"unknown GGUF value type {kind}")

        metadata: dict[str, object] = {}
        for _ in range(count):
            key = string()
            (kind,) = struct.unpack("<I", handle.read(4))
            metadata[key] = value(kind)
        return metadata


def hf_config_kv_shape(path: Path) -> KvShape:
    """From a Hugging Face `config.json`: `num_hidden_layers`, `num_key_value_heads` (or
    `num_attention_heads`), `head_dim` (or `hidden_size / num_attention_heads`)."""
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the model's config.json: {exc}") from None
    config = config.get("text_config", config)
    try:
        heads = int(config["num_attention_heads"])
        return KvShape(
            layers=int(config["num_hidden_layers"]),
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        )
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            f"{path}: needs num_hidden_layers, num_attention_heads and hidden_size (or head_dim)"
        ) from None


def parse_nvidia_smi(text: str) -> list[float]:
    """MiB used per GPU, from `nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits`."""
    used = []
    for line in text.splitlines():
        first = line.split(",")[0].strip()
        if first:
            try:
                used.append(float(first))
            except ValueError:
                continue
    return used
