"""One agent's part in the job-wide straggler comparison (see :mod:`agentd.slownodes`).

While its workers run, every ``interval`` seconds an agent makes one store request (the
interval stretches with the job's size, so the whole job asks the store at most
:data:`~agentd.slownodes.settings.JOB_RATE` times a second).
Group rank 0 alternates between gathering every member's times (one read) to judge them
(:mod:`agentd.slownodes.judge`) and publishing its verdict; each other member alternates
between publishing its own times and reading the verdict. So each agent costs the store
one request per ``interval`` (5 s by default); a verdict that names a new slow node or a
swap is published at once, a second request in that rare interval.

Every agent logs each node named slow once (WARNING), and again when it catches up
(INFO), and tells its observers (``slow_node``: an event). With ``replace`` the leader,
seeing a slow node while a spare waits (one more read, only then), names it in the verdict
to be swapped, at most once per window; that node's agent drains itself, so every rank
checkpoints at one step and the spare takes its place in the next round. An agent that
had not read the name yet learns it from the drain's request, which reaches every agent
at once: the node is named on every agent before the round ends.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentd.exceptions import AgentdError
from agentd.slownodes.settings import SlowNodeSettings
from agentd.support.aio import cancel_and_wait
from agentd.support.ratelog import RateLimitedLog
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.rendezvous.timings import NodeTimings
    from agentd.slownodes.judge import NodeJudge
    from agentd.view import AgentView

log = logging.getLogger(__name__)

SWAP_REASON = "straggler:"
"""How a swap's drain reason begins (every agent sees it in the drain request)."""


class SlowNodeService(AgentObserver):
    """Runs the comparison for one agent, and hears of drains as its observer;
    ``sections()`` gives its ranks' recent compute times (None: no heartbeats),
    ``waiting()`` how many spares wait."""

    def __init__(
        self,
        settings: SlowNodeSettings,
        timings: NodeTimings,
        node_id: str,
        view: AgentView,
        sections: Callable[[], dict[str, float] | None],
        waiting: Callable[[], Awaitable[int]],
        notify: Callable[..., None],
    ) -> None:
        self.settings = settings
        self._timings = timings
        self._node_id = node_id
        self._view = view
        self._sections = sections
        self._waiting = waiting
        self._notify = notify
        self._task: asyncio.Task[None] | None = None
        self._judge: NodeJudge | None = None
        self._generation = -1
        self._ticks = 0
        self._last_swap = float("-inf")
        self._swapping = False
        self.verdict: dict[str, Any] | None = None
        self.named: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self._store_trouble = RateLimitedLog(log, interval=60.0)

    async def start(self) -> None:
        """Nothing until the workers run."""

    async def stop(self) -> None:
        await self.workers_stopping()

    def workers_started(self) -> None:
        if self.settings.interval <= 0 or self._task is not None:
            return
        self._task = asyncio.ensure_future(self._run())

    async def workers_stopping(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            size = self._view.get_worker_group().group_world_size or 1
            await asyncio.sleep(self.settings.paced(size))
            try:
                await self._tick()
            except AgentdError as exc:  # the store's trouble: the next tick tries again
                self._store_trouble.warning(
                    "store", "Job-wide straggler comparison skipped a tick: %s", exc
                )
            except Exception:  # a bug would fail every tick: say so once, and stop
                log.exception(
                    "Job-wide straggler comparison stopped; this node's compute times are "
                    "no longer compared with the other nodes' until its workers restart"
                )
                return

    async def _tick(self) -> None:
        group = self._view.get_worker_group()
        generation, rank = self._view.generation, group.group_rank
        size = group.group_world_size or 1
        sections = self._sections()
        if size < 2 or rank is None or not sections:
            return  # alone, or no sections timed here: nothing to compare, no request
        if generation != self._generation:  # a new round: its members start afresh
            from agentd.slownodes.judge import NodeJudge  # statistics: not on the launch path

            self._generation, self._ticks = generation, 0
            self._judge = NodeJudge(self.settings.factor, self.settings.window(size))
            self.verdict, self._swapping = None, False
        self._ticks += 1
        own = {"node": self._node_id, "sections": sections, "at": time.time()}
        if rank == 0:
            await self._lead(generation, size, own)
        elif self._ticks % 2:
            self.requests += 1
            await self._timings.publish(generation, rank, own, ttl=4 * self.settings.paced(size))
        else:
            self.requests += 1
            verdict = await self._timings.verdict(generation)
            if verdict is not None:
                self._apply(verdict)

    async def _lead(self, generation: int, size: int, own: dict[str, Any]) -> None:
        """Odd ticks: gather and judge; even ticks: publish the verdict. A verdict that
        names a new slow node or a swap is published at once (a rare second request)."""
        assert self._judge is not None
        if self._ticks % 2 == 0:
            if self.verdict is not None:
                self.requests += 1
                await self._timings.decide(generation, {**self.verdict, "at": time.time()})
            return
        self.requests += 1
        docs = {**await self._timings.gather(generation, size), 0: own}
        times = {doc["node"]: doc["sections"] for doc in docs.values() if doc.get("sections")}
        if len(times) < 2:
            return
        now = time.monotonic()
        verdict = self._judge.judge(times, now)
        previous = self.verdict or {}
        swap = previous.get("swap")
        if swap is None and self.settings.replace and verdict["slow"]:
            swap = await self._swap(verdict["slow"], verdict["nodes"], now)
        verdict["swap"] = swap
        news = verdict["slow"] != previous.get("slow", []) or swap != previous.get("swap")
        self._apply(verdict)
        if news:
            self.requests += 1
            await self._timings.decide(generation, {**verdict, "at": time.time()})

    async def _swap(self, named: list[str], ratios: dict[str, float], now: float) -> str | None:
        """The slowest of the ``named`` nodes, to swap for a waiting spare, if one waits
        and none was swapped within the window."""
        size = self._view.get_worker_group().group_world_size or 1
        if now - self._last_swap < self.settings.window(size):
            return None
        self.requests += 1
        if await self._waiting() <= 0:
            return None
        self._last_swap = now
        return max(named, key=lambda node: ratios[node])

    def _apply(self, verdict: dict[str, Any]) -> None:
        """Log and tell what changed since the last verdict; swap this node if asked."""
        self.verdict = verdict
        ratios, median = verdict.get("nodes", {}), verdict.get("median", {})
        for node in verdict.get("slow", []):
            if node not in self.named:
                self._name(node, ratios.get(node, 0.0), median)
        for node in [n for n in self.named if n not in verdict.get("slow", [])]:
            del self.named[node]
            if node in ratios:  # else it is no longer in the job
                log.info("Node %s caught up: %.2fx the other nodes' median", node, ratios[node])
        if verdict.get("swap") == self._node_id and not self._swapping:
            self._swapping = True
            ratio = ratios.get(self._node_id, 0.0)
            self._view.request_drain(
                f"{SWAP_REASON} {ratio:.2f}x the other nodes' compute time; a waiting spare "
                "takes its place",
                replaced=True,
            )

    def _name(self, node: str, ratio: float, median: dict[str, float]) -> None:
        details = {"node": node, "ratio": ratio, "median": median}
        self.named[node] = details
        log.warning(
            "Straggler node %s: its compute sections take %.2fx the other nodes' median "
            "(job median %s)%s",
            node,
            ratio,
            ", ".join(f"{s} {m:.3f}s" for s, m in median.items()) or "?",
            " (this node)" if node == self._node_id else "",
        )
        self._notify("slow_node", details)

    def drain_requested(self, details: dict[str, Any]) -> None:
        """A drain began: if it is a straggler's swap this agent had not read of yet (the
        round ends with it), name the node now, from the drain's reason."""
        reason, node = str(details.get("reason", "")), str(details.get("node", ""))
        if reason.startswith(SWAP_REASON) and node not in self.named:
            ratio = re.match(r"\S+ ([0-9.]+)x", reason)
            self._name(node, float(ratio.group(1)) if ratio else 0.0, {})

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows under ``nodes``."""
        verdict = self.verdict or {}
        return {
            "interval": self.settings.paced(self._view.get_worker_group().group_world_size or 1),
            "factor": self.settings.factor,
            "replace": self.settings.replace,
            "median": verdict.get("median", {}),
            "ratios": verdict.get("nodes", {}),
            "slow": list(verdict.get("slow", [])),
            "swap": verdict.get("swap"),
            "store_requests": self.requests,
        }
