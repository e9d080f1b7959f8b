"""llama-server's knobs (each a `LLAMA_ARG_*` variable and its flags), the metrics its `/metrics` counters
add to a round, and where it reads its model and address from: data only, read by the engine
(`llama_server.py`, which exports them too)."""

from __future__ import annotations

from tuner.engines.base import Knob
from tuner.metrics import MetricInfo
from tuner.models import ListenRule

__all__ = ["LLAMA_SERVER_KNOBS", "LLAMA_SERVER_LISTEN", "LLAMA_SERVER_METRICS", "LORA_POLICIES"]

LORA_POLICIES = ("as_recorded", "all_on", "all_off")

LLAMA_SERVER_KNOBS: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            name="n_batch",
            value_type="int",
            env="LLAMA_ARG_BATCH",
            flag="-b",
            other_flags=("--batch-size",),
            minimum=1,
            description="Logical batch: most tokens per server loop iteration, all slots together.",
        ),
        Knob(
            name="n_ubatch",
            value_type="int",
            env="LLAMA_ARG_UBATCH",
            flag="-ub",
            other_flags=("--ubatch-size",),
            minimum=1,
            description="Physical micro-batch.",
        ),
        Knob(
            name="n_parallel",
            value_type="int",
            env="LLAMA_ARG_N_PARALLEL",
            flag="-np",
            other_flags=("--parallel",),
            minimum=1,
            description="Slots: requests served at once.",
        ),
        Knob(
            name="kv_unified",
            value_type="bool",
            env="LLAMA_ARG_KV_UNIFIED",
            flag="--kv-unified",
            other_flags=(
                "-kvu",
                "-no-kvu",
                "--no-kv-unified",
            ),
            description="One KV buffer shared by all slots.",
        ),
        Knob(
            name="cache_ram",
            value_type="int",
            env="LLAMA_ARG_CACHE_RAM",
            flag="--cache-ram",
            other_flags=("-cram",),
            minimum=-1,
            description="Host-RAM prompt cache in MiB (-1 no limit, 0 off).",
        ),
        Knob(
            name="ctx_size",
            value_type="int",
            env="LLAMA_ARG_CTX_SIZE",
            flag="-c",
            other_flags=("--ctx-size",),
            minimum=0,
            description="Total KV tokens over all slots.",
        ),
        Knob(
            name="threads",
            value_type="int",
            env="LLAMA_ARG_THREADS",
            flag="-t",
            other_flags=("--threads",),
            minimum=-1,
            description="Generation threads.",
        ),
        Knob(
            name="cont_batching",
            value_type="bool",
            env="LLAMA_ARG_CONT_BATCHING",
            flag="-cb",
            other_flags=(
                "--cont-batching",
                "-nocb",
                "--no-cont-batching",
            ),
            description="Mix prefill into decode iterations.",
        ),
        Knob(
            name="cache_prompt",
            value_type="bool",
            env="LLAMA_ARG_CACHE_PROMPT",
            flag="--cache-prompt",
            other_flags=("--no-cache-prompt",),
            description="Reuse the common prefix of a slot's previous prompt.",
        ),
        Knob(
            name="flash_attn",
            value_type="str",
            env="LLAMA_ARG_FLASH_ATTN",
            flag="-fa",
            other_flags=("--flash-attn",),
            choices=("on", "off", "auto"),
            description="Flash attention.",
        ),
        Knob(
            name="cache_type_k",
            value_type="str",
            env="LLAMA_ARG_CACHE_TYPE_K",
            flag="-ctk",
            other_flags=("--cache-type-k",),
            choices=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            description="KV cache type for K.",
        ),
        Knob(
            name="cache_type_v",
            value_type="str",
            env="LLAMA_ARG_CACHE_TYPE_V",
            flag="-ctv",
            other_flags=("--cache-type-v",),
            choices=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            description="KV cache type for V.",
        ),
        Knob(
            name="lora_policy",
            value_type="str",
            choices=LORA_POLICIES,
            scope="request",
            description="as_recorded: each request's own adapters; all_on: every request gets the workload's "
            "most common adapter setting; all_off: no request gets an adapter. Slots whose settings differ "
            "cannot share a batch.",
        ),
    )
}

# What `round_counters` adds to a round, from llama-server's /metrics.
LLAMA_SERVER_METRICS: dict[str, MetricInfo] = {
    info.name: info
    for info in (
        MetricInfo(
            name="server_decode_calls",
            unit="",
            better="lower",
            description="Server loop iterations (llama_decode calls) during the round, from /metrics.",
        ),
        MetricInfo(
            name="server_tokens_per_decode",
            unit="tok",
            better="higher",
            description="Prompt and generated tokens per decode call: the average batch the server ran.",
        ),
    )
}


# What llama-server reads its model and address from (common/arg.cpp): a flag wins over its variable.
LLAMA_SERVER_LISTEN = ListenRule(
    host_flags=("--host",),
    port_flags=("--port",),
    model_flags=("-m", "--model"),
    host_env="LLAMA_ARG_HOST",
    port_env="LLAMA_ARG_PORT",
    model_env="LLAMA_ARG_MODEL",
    default_host="127.0.0.1",
    default_port=8080,
)
