"""Peak GPU memory during a round, where the host has `nvidia-smi`: sampled every half second on the
host, through its transport (over ssh, the GPU that counts is the remote one, not the controller's)."""

from __future__ import annotations

import asyncio
import contextlib

from tuner.engines.memory import parse_nvidia_smi
from tuner.errors import TransportError
from tuner.transports.base import Transport

__all__ = ["GpuMemorySampler"]

_QUERY = ("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits")


class GpuMemorySampler:
    """`async with GpuMemorySampler(transport) as gpu: ...` then `gpu.peak_mib`: the highest total
    memory used over all GPUs while the block ran; None where the host has no nvidia-smi."""

    def __init__(self, transport: Transport, *, interval_s: float = 0.5) -> None:
        self._transport = transport
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.peak_mib: float | None = None

    async def __aenter__(self) -> GpuMemorySampler:
        if await self._sample():
            self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._sample()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self._sample()

    async def _sample(self) -> bool:
        """Reads the memory in use; False where there is nothing to read (no nvidia-smi, no GPU)."""
        try:
            result = await self._transport.run(list(_QUERY), timeout_s=5, check=False)
        except TransportError:
            return False
        used = parse_nvidia_smi(result.stdout) if result.exit_status == 0 else []
        if used:
            self.peak_mib = max(self.peak_mib or 0.0, sum(used))
        return bool(used)
