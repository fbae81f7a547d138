"""One agent's part in drains (see :mod:`agentd.drain` and :mod:`agentd.rendezvous.drains`).

Every agent watches the store for a drain request while its workers run. On one it tells
its workers through the control file (and ``--checkpoint-signal``, if set), reports the
furthest step they reported, passes on the step chosen, and acknowledges once every local
worker said its checkpoint is saved. The draining agent also chooses the step and waits
for every node's acknowledgement (or ``--drain-timeout``); then it leaves the job, which
re-forms without it, and exits. An agent asked to drain during another node's drain joins
it, and leaves once it is done, without joining the next round meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from agentd.drain.client import PAUSE_LIMIT
from agentd.drain.settings import DrainSettings
from agentd.exceptions import DRAINED_UNFINISHED
from agentd.rendezvous.drains import DrainRequest, Drains
from agentd.store.api import StoreError
from agentd.wire import control
from agentd.wire.progress import ProgressMessage
from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

REPORT_WINDOW = 0.25
"""How long a node waits for its workers' steps when none of them heartbeats (it may be
the attempt's first step, or the script never calls ``agentd.heartbeat()``). A node whose
workers heartbeat waits for them until each is due to beat again (the hang detection's
deadline, this window past it), within ``--drain-timeout``: a step longer than this
window is a step, not silence."""
SLOW_REPORT = 0.5
"""Seconds after which the wait for this node's workers' steps is worth a line in the log."""
SETTLE = 0.02
"""After a worker's first report, how long the node's others are waited for: in a
synchronous job a rank blocked in a collective (its peer paused to report) cannot report,
nor be ahead."""
STALE_MARGIN = 10.0
"""Seconds past the longest a drain lasts after which its request, still standing, is
stale (its agent died before it withdrew it): a new drain replaces it, not joins it."""
TOLD_WITHIN = 5.0
"""How long the draining agent waits for every member to tell its workers of the drain
before it chooses the step without those missing (their ranks may then checkpoint later
than the others)."""


class DrainService:
    """Runs ``drains`` for one agent, whose workers ``workers()`` gives; ``leave(why,
    exit_code)`` takes the draining agent out of the job; ``hold_hangs(seconds)`` holds
    the hang detection while a drain pauses the workers (None: holds it no longer);
    ``beats_due_in()`` says within how many seconds every worker that heartbeats beats
    again unless hung (None: none heartbeats)."""

    def __init__(
        self,
        settings: DrainSettings,
        drains: Drains,
        workers: Callable[[], Mapping[int, WorkerProcess]],
        leave: Callable[[str, int, bool], None],
        notify: Callable[..., None],
        hold_hangs: Callable[[float | None], None] = lambda seconds: None,
        beats_due_in: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._drains = drains
        self._workers = workers
        self._leave = leave
        self._notify = notify
        self._hold_hangs = hold_hangs
        self._beats_due_in = beats_due_in
        self._control: str | None = None
        self._watch: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._request: DrainRequest | None = None
        self._reported: dict[int, int] = {}
        self._new_report = asyncio.Event()
        self._first_report = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._saved: dict[int, int] = {}
        self._acknowledged = False
        self._step: int | None = None
        self._holding = False
        self.status_doc: dict[str, Any] | None = None

    # -- the agent's hooks ---------------------------------------------------------------

    def attempt(self, control_file: str) -> None:
        """The control file of the attempt whose workers just started (fresh: a drain
        already followed is not theirs)."""
        self._control = control_file

    async def start(self) -> None:
        """Nothing until the first workers start."""

    def workers_started(self) -> None:
        if self._watch is None:
            self._watch = asyncio.create_task(self._follow(), name="drain-watch")

    async def stop(self) -> None:
        for task in (self._watch, self._draining, *self._tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watch = self._draining = None

    def request(self, reason: str, exit_code: int) -> bool:
        """Drain this node (False: a drain of ours is under way already)."""
        if self._draining is not None:
            return False
        self._draining = asyncio.create_task(self._drain(reason, exit_code), name="drain")
        return True

    @property
    def draining(self) -> bool:
        return self._draining is not None

    def feed(self, messages: list[ProgressMessage]) -> None:
        """The workers' ``drain`` (step reports) and ``saved`` messages."""
        if self._request is None:
            return
        pids = {p.pid for p in self._workers().values()}
        for message in messages:
            if message.pid not in pids:
                continue
            if message.kind == "drain":
                if not self._reported:
                    self._first_report = asyncio.get_running_loop().time()
                self._reported[message.pid] = message.steps
                self._new_report.set()
            elif message.kind == "saved":
                self._saved[message.pid] = message.steps
        if self._saved and set(self._saved) >= self._live_pids() and not self._acknowledged:
            self._acknowledged = True
            self._spawn(self._acknowledge())

    def status(self) -> dict[str, Any] | None:
        return self.status_doc

    # -- every agent ---------------------------------------------------------------------

    async def _follow(self) -> None:
        """Watch the store for drains while the agent runs (a store problem: try again)."""
        drains = self._drains
        revision = 0
        while True:
            try:
                if not revision:
                    revision = await drains.revision()
                request, step = await drains.current()
                if request is not None and not await drains.live(request, self._stale_after):
                    request = None  # its agent died during its drain: nobody leaves with it
                if request is not None:
                    await self._follow_request(request, step)
                elif self._request is not None and self._holding:
                    self._holding = False  # withdrawn: the workers go on, judged again
                    self._hold_hangs(None)
                revision = await drains.changes(revision)
            except (StoreError, RuntimeError) as exc:  # RuntimeError: the store is closed
                log.debug("Drain watch: %s", exc)
                revision = 0
                await asyncio.sleep(1.0)

    async def _follow_request(self, request: DrainRequest, step: int | None) -> None:
        path = self._control
        if path is None:
            return
        if self._request is None or self._request.id != request.id:
            self._start_following(request, path)
            self._spawn(self._tell_and_report(request.id))
        if step is not None and self._step is None:
            self._step = step
            control.publish(path, request.id, step)
            self.status_doc = {**(self.status_doc or {}), "step": step}
            log.info("Drain: every rank checkpoints at step %d", step)

    def _start_following(self, request: DrainRequest, path: str) -> None:
        self._request, self._step = request, None
        self._reported, self._saved, self._acknowledged = {}, {}, False
        # Every rank pauses at its step, then checkpoints, while other nodes' ranks wait on
        # them in a collective: no hang, for as long as the drain may last.
        self._holding = True
        self._hold_hangs(PAUSE_LIMIT + self.settings.timeout + TOLD_WITHIN)
        control.publish(path, request.id)
        self.status_doc = {
            "id": request.id,
            "node": request.node,
            "reason": request.reason,
            "requested_at": request.at,
            "step": None,
            "saved_ranks": [],
            "acknowledged": False,
        }
        log.warning("Drain requested by node %s (%s): checkpointing", request.node, request.reason)
        self._notify("drain_requested", dict(self.status_doc))
        sig = self.settings.checkpoint_signal
        if sig is not None:
            for proc in self._workers().values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    async def _tell_and_report(self, drain_id: int) -> None:
        """Say our workers are told and how long their steps may take to come (the choice
        waits for every node's word), then report their step."""
        within = self._report_within()
        with contextlib.suppress(StoreError):
            await self._drains.told(drain_id, within)
        await self._report(drain_id, within)
        if not self._live_pids() and not self._acknowledged:
            self._acknowledged = True  # its workers are done (the exit barrier): none saves
            await self._acknowledge()

    def _report_within(self) -> float:
        """How long our workers' steps are waited for (see :data:`REPORT_WINDOW`)."""
        due = self._beats_due_in()
        if due is None:
            return REPORT_WINDOW
        return min(self.settings.timeout, due + REPORT_WINDOW)

    async def _report(self, drain_id: int, within: float) -> None:
        """Report the furthest step our workers reported, once all did, ``SETTLE`` after
        the first, or ``within`` seconds on (a worker blocked in a collective cannot)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + within
        with contextlib.suppress(TimeoutError):
            while set(self._reported) < self._live_pids():
                if self._reported:
                    deadline = min(deadline, self._first_report + SETTLE)
                self._new_report.clear()
                async with asyncio.timeout_at(deadline):
                    await self._new_report.wait()
        steps = list(self._reported.values())
        waited = loop.time() - began
        if waited >= SLOW_REPORT:  # a long step, or ranks blocked on a paused peer
            log.info(
                "Drain: this node's workers reported %s after %.1fs (at their next heartbeat)",
                f"step {max(steps)}" if steps else "no step",
                waited,
            )
        with contextlib.suppress(StoreError):
            await self._drains.report_step(drain_id, max(steps) if steps else -1)

    async def _acknowledge(self) -> None:
        request = self._request
        if request is None:
            return
        by_rank = {p.local_rank: self._saved.get(p.pid) for p in self._workers().values()}
        doc = {"ranks": len(by_rank), "steps": sorted({s for s in by_rank.values() if s})}
        assert self.status_doc is not None
        self.status_doc.update(saved_ranks=sorted(by_rank), acknowledged=True)
        with contextlib.suppress(StoreError):
            await self._drains.acknowledge(request.id, doc)
        if self._live_pids():
            log.info("Drain: the checkpoints of this node's %d worker(s) are saved", len(by_rank))
        else:
            log.info("Drain: this node's workers are done: nothing to save")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def _stale_after(self) -> float:
        """Seconds after which a drain's request, still standing, is stale: its agent died
        before it withdrew it."""
        return TOLD_WITHIN + REPORT_WINDOW + self.settings.timeout + STALE_MARGIN

    def _why_no_step(self) -> str:
        """Why no rank reported a step: this node's ranks heartbeat, so they are blocked
        (one hung, or every one in a collective waiting for a peer that is), or they
        report no steps at all."""
        if self._beats_due_in() is not None:
            return (
                "this node's ranks heartbeat, but none reached its next step: a rank hung, "
                "or blocked in a collective on a hung or paused peer, reports none"
            )
        return (
            "they call neither agentd.heartbeat() nor agentd.checkpoint_saved(), or none "
            "has reached its first step yet"
        )

    def _live_pids(self) -> set[int]:
        return {p.pid for p in self._workers().values() if p.returncode is None}

    # -- the draining agent --------------------------------------------------------------

    async def finished(self) -> None:
        """Return once this node's drain, if one was asked for, is done (it has left)."""
        if self._draining is not None:
            await asyncio.wait({self._draining})

    async def _drain(self, reason: str, exit_code: int) -> None:
        began = time.monotonic()
        joined, lost = False, False
        request: DrainRequest | None = None
        step: int | None = None
        acks: dict[str, Any] = {}
        try:
            request, joined = await self._drains.request(reason, self._stale_after)
            if joined:
                log.warning(
                    "Drain: node %s drains already (%s); this node leaves with it, once "
                    "every node's checkpoint is saved",
                    request.node,
                    request.reason,
                )
                # as long as the choice may take: every node told, then their reports
                within = TOLD_WITHIN + self.settings.timeout + 1.0
                step = await self._drains.chosen_step(request.id, within)
                missing: list[str] = []
            else:
                step, missing = await self._drains.choose_step(
                    request.id, told_within=TOLD_WITHIN, grace=0.05, settle=SETTLE
                )
            if missing:
                log.warning(
                    "Drain %d: node(s) %s did not tell their workers of the drain within "
                    "%.0fs; the step is chosen without them, and their ranks may checkpoint "
                    "at a later one",
                    request.id,
                    ", ".join(missing),
                    TOLD_WITHIN,
                )
            if step is None:
                log.warning(
                    "Drain %d: the workers report no steps within %.2fs (%s), so no "
                    "checkpoint could be coordinated; this node leaves without one",
                    request.id,
                    time.monotonic() - began,
                    self._why_no_step(),
                )
            else:
                log.info("Drain %d: every rank checkpoints at step %d", request.id, step)
                left = self.settings.timeout - (time.monotonic() - began)
                acks = await self._drains.acknowledgements(request.id, max(0.0, left))
        except StoreError as exc:  # who confirmed is unknown; the step chosen, if any, stands
            log.error("Drain: the store cannot be reached (%s); leaving without it", exc)
            lost = True
        try:
            members: list[str] | None = await self._drains.members()
            leaving = await self._drains.leaving(request.id) if request is not None else set()
        except StoreError:
            members = None  # who else runs the job is unknown: leave as asked
            leaving = set()
        confirmed = step is not None and not lost  # else no confirmation was waited for
        missing = [node for node in members or () if node not in acks and confirmed]
        alone = members is not None and not set(members) - leaving - {self._drains.node_id}
        seconds = time.monotonic() - began
        outcome = {
            "step": step,
            "nodes": len(members or ()),
            "acknowledged": len(acks),
            "missing": missing,
            "seconds": round(seconds, 3),
            "alone": alone,
            "leaving": sorted(leaving | {self._drains.node_id}),
            "store_lost": lost,
        }
        self.status_doc = {**(self.status_doc or {}), "outcome": outcome}
        self._notify("drain_done", outcome)
        if not joined:  # its requester withdraws it: an agent that joins later must not follow it
            with contextlib.suppress(StoreError):
                await self._drains.finish()
        if missing:
            log.warning(
                "Drain: %d node(s) did not confirm their checkpoints within %gs: %s",
                len(missing),
                self.settings.timeout,
                ", ".join(missing),
            )
        if alone and exit_code == 0:  # not a success: the job did not finish
            exit_code = DRAINED_UNFINISHED
            log.warning(
                "Drain: no other node runs this job: it ends here, unfinished (exit %d)", exit_code
            )
        saved = "no checkpoint" if step is None else f"checkpoints at step {step}"
        if lost:
            saved += (
                ", unconfirmed: the store was lost" if step is not None else ": the store was lost"
            )
        why = f"drained ({reason}; {saved} in {seconds:.2f}s)"
        self._leave(why, exit_code, alone)
