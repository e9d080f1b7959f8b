"""Peak GPU memory during a round, where the host has `nvidia-smi`: sampled every half second."""

from __future__ import annotations

import asyncio
import contextlib
import shutil

from tuner.engines.memory import parse_nvidia_smi

__all__ = ["GpuMemorySampler"]

_QUERY = ("--query-gpu=memory.used", "--format=csv,noheader,nounits")


class GpuMemorySampler:
    """`async with GpuMemorySampler() as gpu: ...` then `gpu.peak_mib`: the highest total memory used
    over all GPUs while the block ran; None where there is no nvidia-smi or it never answered."""

    def __init__(self, *, interval_s: float = 0.5, command: str = "nvidia-smi") -> None:
        self._interval_s = interval_s
        self._binary = shutil.which(command)
        self._task: asyncio.Task[None] | None = None
        self.peak_mib: float | None = None

    async def __aenter__(self) -> GpuMemorySampler:
        if self._binary is not None:
            await self._sample()
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

    async def _sample(self) -> None:
        assert self._binary is not None
        try:
            process = await asyncio.create_subprocess_exec(
                self._binary, *_QUERY, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
            )
            output, _ = await asyncio.wait_for(process.communicate(), timeout=5)
        except (OSError, TimeoutError):
            return
        used = parse_nvidia_smi(output.decode(errors="replace"))
        if used:
            self.peak_mib = max(self.peak_mib or 0.0, sum(used))
