"""A LoRA adapter GGUF for a base model, with random low-rank weights: real enough for timing.

llama-server cannot batch slots whose LoRA settings differ, and that wait is what a LoRA policy is
tuned against; measuring it needs an adapter the server really loads. This writes one for any GGUF
base model (shapes read from the base file, GQA included) with the `gguf` package, in the layout
llama-server's `llama_adapter_lora_init_impl` accepts: `general.type = adapter`, `adapter.type =
lora`, `adapter.lora.alpha`, and `<tensor>.lora_a` / `.lora_b` pairs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tuner.errors import AssetError

__all__ = ["TEST_LORA_FILENAME", "write_random_lora"]

TEST_LORA_FILENAME = "SmolLM2-135M-test-lora.gguf"


def write_random_lora(
    base: Path,
    out: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ("attn_q", "attn_v"),
    seed: int = 0,
) -> Path:
    """Writes an adapter for the `targets` projections of every layer of `base`, atomically."""
    import gguf

    try:
        reader = gguf.GGUFReader(base)
    except (OSError, ValueError) as exc:
        raise AssetError(f"{base}: cannot read the base model's GGUF header: {exc}") from None
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise AssetError(f"{base}: no general.architecture; is it a model GGUF?")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    wanted = [t for t in reader.tensors if t.name.endswith(".weight") and t.name.split(".")[-2] in targets]
    if not wanted:
        raise AssetError(f"{base}: no {', '.join(targets)} tensors to adapt")
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".part")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(partial, arch)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for tensor in wanted:
            # GGUF lists `ne` (innermost first); numpy's shape is the reverse: (n_out, n_in).
            n_in, n_out = int(tensor.shape[0]), int(tensor.shape[1])
            writer.add_tensor(f"{tensor.name}.lora_a", (rng.standard_normal((rank, n_in)) * 0.05).astype(np.float32))
            writer.add_tensor(f"{tensor.name}.lora_b", (rng.standard_normal((n_out, rank)) * 0.05).astype(np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, out)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return out
