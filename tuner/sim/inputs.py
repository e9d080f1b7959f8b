"""What the simulated server's model runs on: the server's settings (`SimSettings`, with llama-server's
defaults), the calibrated seconds of a forward pass (`CostModel`, fitted by `scripts/calibrate_sim.py`,
shipped as `calibration.json` and read strictly by `load_cost_model`) and the noise (`NoiseModel`)."""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["NARROW_PASS", "CostModel", "NoiseModel", "SimSettings", "load_cost_model"]

_CALIBRATION = "calibration.json"


# The widest pass a calibration counts as decode (one token for each decoding slot); wider ones are prefill.
NARROW_PASS = 16


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Seconds of one forward pass of `k` tokens: `pass_s + k * token_s(k) + context_s * context / 1000`.

    `token_s` is measured at a few widths and interpolated on log(k): narrow passes (decode) cost more per
    token than wide ones (prefill), and micro-batches below about 64 tokens lose the wide kernels' speed.
    """

    pass_s: float = 0.008
    token_points: tuple[tuple[int, float], ...] = ((1, 0.0025), (4, 0.002), (32, 0.0085), (64, 0.0052), (512, 0.0052))
    context_s: float = 0.0006  # per computed token, per 1,000 tokens of context it attends to
    sample_s: float = 0.0005  # per generating slot and iteration
    lora_switch_s: float = 0.01  # applying another adapter setting to the context
    restore_s_per_token: float = 2e-6  # copying a prompt from the host-RAM cache into a slot
    kv_bytes_per_token: int = 23040  # SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x f16
    load_s: float = 0.35  # model load at start
    # Per forward pass, per slot the server runs (n_parallel), whether busy or not: what seed 004 saw on a GPU,
    # where 64 slots for 16 users halved the throughput of 16 slots. 0 in the CPU calibration, never measured.
    slot_s: float = 0.0

    def token_s(self, width: int) -> float:
        points = self.token_points
        if width <= points[0][0]:
            return points[0][1]
        if width >= points[-1][0]:
            return points[-1][1]
        widths = [w for w, _ in points]
        right = bisect.bisect_left(widths, width)
        (w0, c0), (w1, c1) = points[right - 1], points[right]
        share = (math.log(width) - math.log(w0)) / (math.log(w1) - math.log(w0))
        return c0 + share * (c1 - c0)

    def scaled(self, factor: float, *, decode: float | None = None) -> CostModel:
        """The same server `factor` times slower: every cost of a pass times it (a prompt cache's copy and
        the model's load stay as they are). With `decode`, the narrow passes (up to NARROW_PASS tokens, as
        decoding slots make), the per-pass cost and sampling take that factor instead, and the wide ones
        (prefill) and their attention `factor`: a GPU prefills many times faster than it decodes, a CPU not."""
        narrow = factor if decode is None else decode
        # The curve gets points at both sides of the boundary, so that a pass between two of its old points
        # takes its own side's factor rather than a blend of the two (a pass of 8 between the points at 4
        # and 32).
        widths = sorted({w for w, _ in self.token_points} | {NARROW_PASS, NARROW_PASS + 1})
        return dataclasses.replace(
            self,
            pass_s=self.pass_s * narrow,
            token_points=tuple(
                (width, self.token_s(width) * (narrow if width <= NARROW_PASS else factor)) for width in widths
            ),
            context_s=self.context_s * factor,
            sample_s=self.sample_s * narrow,
            slot_s=self.slot_s * narrow,
        )

    def forward_s(self, width: int, context_tokens: float) -> float:
        """One pass of `width` tokens whose contexts add up to `context_tokens`."""
        return self.pass_s + width * self.token_s(width) + self.context_s * context_tokens / 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "pass_s": self.pass_s,
            "token_points": [list(p) for p in self.token_points],
            "context_s": self.context_s,
            "sample_s": self.sample_s,
            "lora_switch_s": self.lora_switch_s,
            "restore_s_per_token": self.restore_s_per_token,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "load_s": self.load_s,
            "slot_s": self.slot_s,
        }

    @classmethod
    def from_json(cls, data: object) -> CostModel:
        """The constants as `to_json` writes them, every one present: a file that leaves one out or adds an
        unknown one (a typo) must not run on the shipped defaults without a word. `ValueError` names it."""
        if not isinstance(data, dict):
            raise ValueError(f"the cost model is a JSON object of constants, not {type(data).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown, missing = sorted(set(data) - fields), sorted(fields - set(data))
        if unknown or missing:
            raise ValueError(f"unknown constant {unknown[0]!r}" if unknown else f"constant {missing[0]!r} is missing")
        constants: dict[str, Any] = {}
        for name in sorted(fields - {"token_points"}):
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")
            if name == "kv_bytes_per_token" and not isinstance(value, int):
                raise ValueError(f"kv_bytes_per_token must be a whole number of bytes, got {value!r}")
            constants[name] = value if name == "kv_bytes_per_token" else float(value)
        points = data["token_points"]
        if not isinstance(points, list) or not points or not all(_is_point(p) for p in points):
            raise ValueError("token_points must be a non-empty list of [width >= 1, seconds per token > 0]")
        widths = [int(w) for w, _ in points]
        if widths != sorted(set(widths)):
            raise ValueError("token_points' widths must increase")
        return cls(token_points=tuple((int(w), float(c)) for w, c in points), **constants)


def _is_point(point: object) -> bool:
    if not isinstance(point, list) or len(point) != 2:
        return False
    width, cost = point
    return (
        isinstance(width, int)
        and not isinstance(width, bool)
        and width >= 1
        and isinstance(cost, int | float)
        and not isinstance(cost, bool)
        and math.isfinite(cost)
        and cost > 0
    )


def load_cost_model(path: Path | None = None) -> CostModel:
    """The fitted constants: from `path`, or the ones calibrated on a 2-core CPU and shipped with the package.
    `ValueError` with one line for a file that cannot be read or is not such a calibration."""
    where = str(path) if path is not None else "the shipped calibration"
    try:
        text = path.read_text() if path is not None else resources.files("tuner.sim").joinpath(_CALIBRATION).read_text()
        data = json.loads(text)
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
    try:
        return CostModel.from_json(data.get("cost_model", data) if isinstance(data, dict) else data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class NoiseModel:
    """Multiplicative noise, log-normal: `restart` once per server start, `iteration` per forward pass."""

    restart: float = 0.0
    iteration: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    """The server settings the model reads, with llama-server's defaults."""

    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 4
    ctx_size: int = 4096
    kv_unified: bool = True  # llama-server turns it on when -np is left to auto
    cache_ram: int = 8192  # MiB; -1 no limit, 0 off
    cache_prompt: bool = True
    cont_batching: bool = True
    verbosity: int = 3
    lora_adapters: tuple[str, ...] = ()  # paths, in id order
    lora_scales: tuple[float, ...] = ()  # global scales, used by a request without `lora`

    @property
    def micro_batch(self) -> int:
        return max(1, min(self.n_ubatch, self.n_batch))

    @property
    def n_ctx_slot(self) -> int:
        return self.ctx_size if self.kv_unified else max(1, self.ctx_size // self.n_parallel)
