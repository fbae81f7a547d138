"""Which processes hold memory on this node's GPUs, and how much each GPU has free, read
through NVML (the optional ``nvidia-ml-py`` package: ``pip install 'agentd[gpu]'``) or,
without it, through ``nvidia-smi``. A node with neither has no GPU to watch."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentd.gpus import nvidia_smi
from agentd.support.owned import output_within, owned
from agentd.support.secrets import child_env

if TYPE_CHECKING:
    from agentd.view import Helpers

log = logging.getLogger(__name__)

APPS_QUERY = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
GPUS_QUERY = ("--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT = 10.0


@dataclass(frozen=True)
class GpuMemory:
    """One reading of the node's GPUs: the MiB each process holds on each GPU (by pid,
    then by GPU index) and the MiB free on each GPU. A GPU known only by a process's
    reading (its index unknown) is named by its UUID and has no free figure."""

    held: dict[int, dict[str, int]] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)

    def by_pid(self) -> dict[int, int]:
        """MiB each process holds, summed over the GPUs."""
        return {pid: sum(on.values()) for pid, on in self.held.items()}


class GpuUsage(Protocol):
    """Reads which processes hold memory on this node's GPUs, and what is free there."""

    name: str

    async def read(self) -> GpuMemory | None:
        """A reading now; None when it could not be taken (the reason is logged)."""
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

    def _read(self) -> GpuMemory:
        nvml, memory = self._nvml, GpuMemory()
        for index in range(nvml.nvmlDeviceGetCount()):
            device, gpu = nvml.nvmlDeviceGetHandleByIndex(index), str(index)
            memory.free[gpu] = nvml.nvmlDeviceGetMemoryInfo(device).free // 2**20
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(device):
                used = proc.usedGpuMemory if isinstance(proc.usedGpuMemory, int) else 0
                on = memory.held.setdefault(proc.pid, {})
                on[gpu] = on.get(gpu, 0) + used // 2**20
        return memory

    async def read(self) -> GpuMemory | None:
        try:
            return await asyncio.to_thread(self._read)
        except Exception as exc:
            log.warning("Could not read the GPUs' memory through NVML: %s", exc)
            return None


class NvidiaSmiUsage:
    """Through ``nvidia-smi`` (two queries, run together, a reading). ``helpers``: the
    agent's process hygiene, whose reaper must leave nvidia-smi's exit status to us."""

    name = "nvidia-smi"

    def __init__(self, path: str, helpers: Helpers | None = None) -> None:
        self.path = path
        self._helpers = helpers

    @classmethod
    def open(cls, helpers: Helpers | None = None) -> NvidiaSmiUsage | None:
        path = nvidia_smi()
        return cls(path, helpers) if path is not None else None

    async def read(self) -> GpuMemory | None:
        gpus, apps = await asyncio.gather(self._query(GPUS_QUERY), self._query(APPS_QUERY))
        if gpus is None or apps is None:
            return None
        return parse_readings(gpus, apps)

    async def _query(self, query: tuple[str, str]) -> str | None:
        start = asyncio.create_subprocess_exec(
            self.path,
            *query,
            env=child_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with owned(self._helpers, start) as proc:
                output = await output_within(proc, NVIDIA_SMI_TIMEOUT)
        except OSError as exc:
            log.warning("Could not run %s: %s", self.path, exc)
            return None
        if output is None:
            log.warning("%s did not answer within %.0fs", self.path, NVIDIA_SMI_TIMEOUT)
            return None
        out, err = output
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"]
            log.warning("%s %s failed: %s", self.path, query[0], why[-1])
            return None
        return out.decode(errors="replace")


def parse_readings(gpus: str, apps: str) -> GpuMemory:
    """``nvidia-smi``'s answers to :data:`GPUS_QUERY` (``0, GPU-8f.., 80512``) and
    :data:`APPS_QUERY` (``GPU-8f.., 1234, 2048``; memory may read ``[N/A]``, counted as 0)
    as one reading, GPUs named by index; lines of any other shape are skipped."""
    memory, index_of = GpuMemory(), {}
    for line in gpus.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit():
            index_of[fields[1]] = fields[0]
            if fields[2].isdigit():
                memory.free[fields[0]] = int(fields[2])
    for line in apps.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[1].isdigit():
            continue
        gpu = index_of.get(fields[0], fields[0])
        on = memory.held.setdefault(int(fields[1]), {})
        on[gpu] = on.get(gpu, 0) + (int(fields[2]) if fields[2].isdigit() else 0)
    return memory


def open_usage(helpers: Helpers | None = None) -> GpuUsage | None:
    """NVML where it loads, else nvidia-smi where it is on PATH (run as ``helpers``
    allow), else None (no GPU)."""
    return NvmlUsage.open() or NvidiaSmiUsage.open(helpers)
