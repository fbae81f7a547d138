"""Which processes hold memory on this node's GPUs, read through NVML (the optional
``nvidia-ml-py`` package: ``pip install 'agentd[gpu]'``) or, without it, through
``nvidia-smi --query-compute-apps``. A node with neither has no GPU to watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from agentd.gpus import nvidia_smi
from agentd.support.secrets import child_env

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT = 10.0


class GpuUsage(Protocol):
    """Reads the processes that hold GPU memory on this node."""

    name: str

    async def holders(self) -> dict[int, int] | None:
        """MiB held on the node's GPUs, by pid (summed over GPUs); None when it could not
        be read."""
        ...


class NvmlUsage:
    """Through NVML, in a thread (its calls block)."""

    name = "NVML"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    @classmethod
    def open(cls) -> NvmlUsage | None:
        try:
            import pynvml  # type: ignore[import-not-found,import-untyped,unused-ignore]

            pynvml.nvmlInit()
        except Exception:  # not installed, or no driver: NVMLError_LibraryNotFound, ...
            return None
        return cls(pynvml)

    def _read(self) -> dict[int, int]:
        nvml = self._nvml
        held: dict[int, int] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            device = nvml.nvmlDeviceGetHandleByIndex(index)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(device):
                used = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else 0
                held[proc.pid] = held.get(proc.pid, 0) + used // 2**20
        return held

    async def holders(self) -> dict[int, int] | None:
        try:
            return await asyncio.to_thread(self._read)
        except Exception as exc:
            log.warning("Could not read the GPUs' processes through NVML: %s", exc)
            return None


class NvidiaSmiUsage:
    """Through ``nvidia-smi --query-compute-apps`` (one process per reading)."""

    name = "nvidia-smi"

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def open(cls) -> NvidiaSmiUsage | None:
        path = nvidia_smi()
        return cls(path) if path is not None else None

    async def holders(self) -> dict[int, int] | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.path,
                *NVIDIA_SMI_QUERY,
                env=child_env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            log.warning("Could not run %s: %s", self.path, exc)
            return None
        try:
            async with asyncio.timeout(NVIDIA_SMI_TIMEOUT):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            log.warning("%s did not answer within %.0fs", self.path, NVIDIA_SMI_TIMEOUT)
            return None
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
            log.warning("%s %s failed: %s", self.path, NVIDIA_SMI_QUERY[0], why[-1])
            return None
        return parse_compute_apps(out.decode(errors="replace"))


def parse_compute_apps(text: str) -> dict[int, int]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``'s
    lines (``1234, 2048``; memory may read ``[N/A]``) as MiB by pid; other lines are
    skipped."""
    held: dict[int, int] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        pid = int(fields[0])
        used = int(fields[1]) if fields[1].isdigit() else 0
        held[pid] = held.get(pid, 0) + used
    return held


def open_usage() -> GpuUsage | None:
    """NVML where it loads, else nvidia-smi where it is on PATH, else None (no GPU)."""
    return NvmlUsage.open() or NvidiaSmiUsage.open()
