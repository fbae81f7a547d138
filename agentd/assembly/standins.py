"""What stands in for a service a job does not use, or does not use yet: the services'
ports (:mod:`agentd.assembly.ports`) kept without loading the service's modules.

- :class:`NoInProcessRestarts`: a group that is never restarted keeps no worker;
- :class:`NoGpus`: a node without NVIDIA's driver waits for no GPU memory;
- :class:`HeartbeatsOnDemand`: hang detection, loaded with the first progress message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.assembly.ports import HeartbeatsPort
    from agentd.group import WorkerGroup
    from agentd.heartbeats.stragglers import StepTimes
    from agentd.inprocess.settings import Fallback
    from agentd.wire.progress import ProgressMessage
    from agentd.workers.processes import WorkerProcess


class NoInProcessRestarts:
    """The in-process port of a group that is never restarted: no worker gets a channel
    (``agentd.inprocess.run`` then calls the function once), nothing is ever kept, and
    none of the in-process machinery is loaded."""

    def __init__(self) -> None:
        self.last_fallback: Fallback | None = None
        self.parked: dict[int, WorkerProcess] = {}
        self.kinds = {"in_process": 0, "process": 0}
        self.fallbacks: dict[str, int] = {}

    @contextlib.contextmanager
    def restarting(self) -> Iterator[None]:
        yield

    def plan(
        self, plans: Any, kept_ranks: Any, peer_loss: float, round_: int = 0, stale: bool = False
    ) -> None:
        pass

    def keeping(self) -> list[int]:
        return []

    def unresumable(self) -> list[WorkerProcess]:
        return []

    async def see_exits(self, procs: Any, cause_wait: float) -> None:
        pass

    def resume_all(self, plans: Any) -> list[WorkerProcess]:
        return []

    def spawned(self, local_ranks: Any) -> None:
        pass

    def closed_at(self, local_rank: int) -> float | None:
        return None

    def has_parked(self, local_rank: int) -> bool:
        return False

    async def park(
        self, procs: Any, failed: Any, fresh_store: bool, asked: Any = None, where: Any = None
    ) -> dict[int, WorkerProcess]:
        return {}

    def raised(self) -> dict[int, tuple[str, float]]:
        return {}

    def forget(self, local_ranks: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class NoGpus:
    """The GPU port of a node without NVIDIA's driver device or ``nvidia-smi``: a stop
    waits for nothing."""

    def look(self) -> None:
        pass

    async def watched(self, pids: Iterable[int]) -> set[int]:
        return set()

    def stopped(self, pids: set[int]) -> None:
        pass

    async def settled(self) -> None:
        pass


class HeartbeatsOnDemand:
    """The heartbeat port of a job that may never heartbeat: the service (``build()``, an
    :class:`~agentd.heartbeats.service.HeartbeatService`) is built with the first progress
    message from the pipe, or when its status or step times are asked for, and told the
    attempt that runs then. Until then nothing is watched: a worker that never heartbeats
    is held to no heartbeat timeout, as under the service itself (which only watches from
    the start when timeouts were given or learned: the assembly builds it eagerly then)."""

    def __init__(self, build: Callable[[], HeartbeatsPort]) -> None:
        self._build = build
        self.service: HeartbeatsPort | None = None
        self._attempt: tuple[WorkerGroup, list[WorkerProcess], Collection[int], float] | None = None

    def _service(self) -> HeartbeatsPort:
        if self.service is None:
            self.service = self._build()
            if self._attempt is not None:
                self.service.started(*self._attempt)
        return self.service

    @property
    def step_times(self) -> StepTimes:
        return self._service().step_times

    def node_sections(self) -> dict[str, float] | None:
        return self.service.node_sections() if self.service is not None else None

    def started(
        self,
        group: WorkerGroup,
        procs: list[WorkerProcess],
        resumed: Collection[int] = (),
        preload_s: float = 0.0,
    ) -> None:
        self._attempt = (group, procs, resumed, preload_s)
        if self.service is not None:
            self.service.started(group, procs, resumed, preload_s)

    async def stopped(self) -> None:
        self._attempt = None
        if self.service is not None:
            await self.service.stopped()

    async def where(self, local_ranks: Collection[int]) -> dict[int, str]:
        return await self.service.where(local_ranks) if self.service is not None else {}

    def feed(self, messages: list[ProgressMessage]) -> None:
        self._service().feed(messages)

    def hold(self, seconds: float | None) -> None:
        if self.service is not None:  # none yet: no worker heartbeats, none is judged
            self.service.hold(seconds)

    def beats_due_in(self) -> float | None:
        return self.service.beats_due_in() if self.service is not None else None

    def status(self) -> dict[str, Any]:
        return self._service().status()

    async def start(self) -> None:
        pass  # a service built later has nothing to start: it builds what it needs

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
