"""The agent's side of in-process restarts: a channel per worker, park and resume.

Every worker of a script entrypoint gets a channel (:mod:`agentd.inprocess.wire`); a worker
that calls :func:`agentd.inprocess.run` says ``hello`` on it. When the group restarts
(a failure, a hang, a membership change), :meth:`InProcessRestarts.park` asks every live
worker outside ``failed`` to park. Those that park within ``park_timeout`` are kept; a
survivor that cannot be kept on its own account (it never opted in, its channel closed
because its process is on its way out, a line on it was garbage, it exited while the
others parked, or it did not park within the bound) is stopped and replaced with the
failed ranks. The whole group falls back to new processes only when keeping any of it
would be wrong: too many quick in-process restarts in a row, or a workers' store that
outlives attempts.
Every rank that is not kept, and why, is logged as one WARNING and counted by reason
(:attr:`InProcessRestarts.fallbacks`). The next attempt :meth:`resume`\\ s each kept worker
with its new variables, and new processes replace only the ranks that were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentd.inprocess import wire
from agentd.inprocess.channel import Channel, ReadClock, wait_settled
from agentd.inprocess.settings import (
    FALLBACK_REASONS,
    QUICK_WINDOW,
    REPLACED_BECAUSE,
    Fallback,
    InProcessSettings,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)

DYING_WAIT = 2.0
"""How long a failure waits for a worker that closed its channel to exit: its exit, not
its peers' errors, is then the root cause."""


class InProcessRestarts:
    """In-process restarts of one agent's workers (see the module docstring)."""

    def __init__(
        self,
        settings: InProcessSettings | None = None,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        settings = settings or InProcessSettings()
        self.park_timeout = settings.park_timeout
        self.quick_repeats = settings.quick_repeats
        self._on_error = on_error
        self._read_clock = ReadClock()
        self._clock = time.monotonic
        self._quick: list[float] = []
        """When the recent in-process restarts happened, while each came soon after the last."""
        self._restarting = False
        self._channels: dict[int, Channel] = {}
        self.parked: dict[int, WorkerProcess] = {}
        """The workers kept for the next attempt, by local rank."""
        self.kinds = {"in_process": 0, "process": 0}
        """Restarts so far by kind: the survivors kept, or every worker a new process."""
        self.fallbacks: dict[str, int] = dict.fromkeys(FALLBACK_REASONS, 0)
        """Restarts that did not keep a surviving rank, by reason (one count per reason per
        restart, however many ranks it concerned)."""
        self.last_fallback: Fallback | None = None

    @contextlib.contextmanager
    def restarting(self) -> Iterator[None]:
        """While the agent restarts its group, :meth:`park` keeps the workers it can."""
        before, self._restarting = self._restarting, True
        try:
            yield
        finally:
            self._restarting = before

    def plan(
        self,
        plans: list[tuple[Any, ...]],
        kept_ranks: frozenset[int] | None,
        peer_loss: float,
        round_: int = 0,
        stale: bool = False,
    ) -> None:
        """Give each new worker's plan its channel and its grace (see
        :data:`~agentd.inprocess.wire.GRACE_ENV`: the default, plus ``peer_loss``, the
        seconds a lost node takes to be seen), and tell every rank which global ranks
        are new processes, which kept rank hands them its state, and whether no rank kept
        its process (:data:`~agentd.inprocess.wire.FRESH_ENV`: the job's state is then only
        in its checkpoint), and the attempt's rendezvous ``round_``
        (:data:`~agentd.inprocess.wire.ROUND_ENV`); ``stale``: a round was sealed without
        this node since its kept workers' last attempt, their state is older than the job's
        (:data:`~agentd.inprocess.wire.STALE_ENV`). ``kept_ranks`` are the ranks every
        node kept, as the round told it (None: no node announced any, or the rendezvous
        cannot tell, and only a node that is the whole job knows them)."""
        lost = sorted(r for r, p in self.parked.items() if p.returncode is not None)
        if lost:
            log.warning(
                "Kept local rank(s) %s exited before the next attempt started: starting them "
                "anew (the ranks agree which of them hold the job's state before any is handed "
                "over)",
                lost,
            )
        self.parked = {r: p for r, p in self.parked.items() if p.returncode is None}
        if stale and self.parked:
            log.warning(
                "Kept local rank(s) %s missed a round sealed without this node: they hold "
                "an older state than the job's, and receive it (or load the checkpoint)",
                sorted(self.parked),
            )
        world = plans[0][0].world_size if plans else 0
        if kept_ranks is None and world == len(plans):
            kept_ranks = frozenset(w.global_rank for w, *_ in plans if w.local_rank in self.parked)
        replaced = sorted(set(range(world)) - kept_ranks) if kept_ranks else []
        source = str(min(kept_ranks)) if replaced and kept_ranks else ""
        fresh = "0" if kept_ranks or self.parked else "1"
        grace = wire.DEFAULT_GRACE + peer_loss
        for worker, _argv, env, *_, pass_fds in plans:
            env[wire.GRACE_ENV] = f"{grace:g}"
            # set even when empty: a kept worker must not keep the last attempt's values
            env[wire.REPLACED_ENV] = ",".join(map(str, replaced)) if source else ""
            env[wire.SOURCE_ENV] = source
            env[wire.FRESH_ENV] = fresh
            env[wire.ROUND_ENV] = str(round_)
            env[wire.STALE_ENV] = "1" if stale and worker.local_rank in self.parked else ""
            if worker.local_rank not in self.parked:
                fd, names = self.channel_for(worker.local_rank)
                env.update(names)
                pass_fds.append(fd)

    def keeping(self) -> list[int]:
        """The local ranks kept for the next attempt that are still alive and reachable."""
        return sorted(
            r
            for r, p in self.parked.items()
            if p.returncode is None and r in self._channels and not self._channels[r].broken
        )

    def unresumable(self) -> list[WorkerProcess]:
        """Kept workers, still running, whose channel closed or broke since they parked (a
        process on its way out): they are no longer kept, and the agent stops them so that
        their ranks start anew."""
        gone = [
            p for r, p in self.parked.items() if p.returncode is None and r not in self.keeping()
        ]
        for proc in gone:
            del self.parked[proc.local_rank]
        if gone:
            log.warning(
                "Kept local rank(s) %s closed their in-process channel before the next attempt "
                "resumed them: starting them anew",
                [p.local_rank for p in gone],
            )
        return gone

    async def see_exits(self, procs: Iterable[WorkerProcess], cause_wait: float) -> None:
        """Before a failure that a training function raised is reported, let the exits
        that may have caused it be seen: up to :data:`DYING_WAIT` for workers that closed
        their channel (a process that held a CUDA context takes that long to finish
        exiting), else ``cause_wait`` for any."""
        procs = list(procs)
        closing = set(self.closing())
        dying = [p for p in procs if p.local_rank in closing]
        await asyncio.wait(
            [p.exited for p in dying or procs],
            timeout=DYING_WAIT if dying else cause_wait,
            return_when=asyncio.FIRST_COMPLETED,
        )

    def resume_all(self, plans: Sequence[tuple[Any, ...]]) -> list[WorkerProcess]:
        """Resume every kept worker with its plan's variables; returns them all, those that
        could not be told too (their channel just closed: they are exiting, and their exit
        is watched like any other)."""
        kept = [self.parked[w.local_rank] for w, *_ in plans if w.local_rank in self.parked]
        for worker, _argv, env, *_ in plans:
            if worker.local_rank in self.parked and not self.resume(worker.local_rank, env):
                log.warning(
                    "Kept local rank %d could not be resumed: its channel closed", worker.local_rank
                )
        self.parked = {}
        return kept

    def channel_for(self, local_rank: int) -> tuple[int, dict[str, str]]:
        """A new worker's end of a fresh channel and the variable that names it."""
        old = self._channels.pop(local_rank, None)
        if old is not None:
            old.close()
        channel = Channel(self._on_error, self._read_clock)
        self._channels[local_rank] = channel
        assert channel.worker_fd is not None
        return channel.worker_fd, {wire.CHANNEL_FD_ENV: str(channel.worker_fd)}

    def spawned(self, local_ranks: Iterable[int]) -> None:
        for rank in local_ranks:
            if rank in self._channels:
                self._channels[rank].spawned()

    def closing(self) -> list[int]:
        """The local ranks whose worker closed its channel: its process is on its way out
        (a process that held a CUDA context can take a second to finish exiting)."""
        return sorted(r for r, c in self._channels.items() if c.closed_by_worker is not None)

    def closed_at(self, local_rank: int) -> float | None:
        """When that worker closed its channel (epoch seconds), if it did: the start of its
        exit, which the exit itself can follow by a second."""
        channel = self._channels.get(local_rank)
        return None if channel is None else channel.closed_by_worker

    def has_parked(self, local_rank: int) -> bool:
        """Whether that worker is parked: it answered the last park and was not resumed
        since (it is silent by design until it resumes)."""
        channel = self._channels.get(local_rank)
        return channel is not None and channel.parked.is_set()

    async def park(
        self,
        procs: Sequence[WorkerProcess],
        failed: Collection[int],
        fresh_store: bool,
        asked: Callable[[], Awaitable[None]] | None = None,
        where: Callable[[list[int]], Awaitable[dict[int, str]]] | None = None,
    ) -> dict[int, WorkerProcess]:
        """During a restart, park every live worker whose local rank is not in ``failed``;
        returns those kept, by local rank. Nothing is kept when no survivor opted in, when
        the group is stopped for good, or on a fallback of the whole group (see the module
        docstring). ``fresh_store``: every attempt's workers meet in a new store (the
        agent's); a store that outlives attempts (node 0's agent serves one for the whole
        job under ``static``; rank 0's worker hosts it at a pinned address elsewhere)
        would hand a kept rank the last attempt's keys. ``asked`` runs once the survivors
        were asked to park, before they are waited for (the agent closes the attempt's
        store: a survivor blocked in it fails, and parks). ``where`` says where the
        survivors that did not park in time are stuck (their stacks), for the log."""
        if not self._restarting:
            return {}
        survivors = {
            p.local_rank: p for p in procs if p.returncode is None and p.local_rank not in failed
        }
        channels = {r: self._channels.get(r) for r in survivors}
        if not any(c is not None and c.opted_in for c in channels.values()):
            return self._keep_none()  # nobody opted in: a plain restart, not a fallback
        everyone = sorted(survivors)
        if not fresh_store:
            return self._fall_back(
                "static_store",
                everyone,
                "In-process restarts need a fresh workers' store per attempt, and this "
                "job's outlives its attempts (--rdzv-backend static, or --master-addr "
                "pinned to another host)",
            )
        if self._quick_repeat():
            return self._fall_back(
                "quick_repeats",
                everyone,
                f"{self.quick_repeats} in-process restarts within {QUICK_WINDOW:.0f}s of each "
                "other",
            )
        lost: dict[str, list[int]] = {}
        ready: dict[int, Channel] = {}
        for rank, channel in channels.items():
            why = "not_opted_in" if channel is None else channel.why_not_kept()
            if why is None and channel is not None:
                channel.parked.clear()
                channel.settled.clear()
                if channel.send("park"):
                    ready[rank] = channel
                    continue
                why = "channel_closed"
            lost.setdefault(why or "channel_closed", []).append(rank)
        if ready and asked is not None:
            await asked()
        stuck = await wait_settled(ready, survivors, self.park_timeout)
        places = await where(stuck) if stuck and where is not None else {}
        for rank, channel in ready.items():
            if rank in stuck:  # stopped with the lost ranks: its peers parked, and are kept
                lost.setdefault("park_timeout", []).append(rank)
            elif survivors[rank].returncode is not None or channel.closed_by_worker is not None:
                lost.setdefault("exited_while_parking", []).append(rank)
            elif channel.broken or not channel.parked.is_set():
                lost.setdefault("broken_channel", []).append(rank)
        kept = {r: survivors[r] for r in ready if not any(r in ranks for ranks in lost.values())}
        for why, ranks in lost.items():
            at = "; ".join(f"local rank {r} at {places[r]}" for r in ranks if r in places)
            self._count(why, ranks, kept, at)
        if not kept:
            self.kinds["process"] += 1
            return self._keep_none()
        self.kinds["in_process"] += 1
        for channel in ready.values():
            channel.error = None
        self.parked = kept
        return dict(kept)

    def _quick_repeat(self) -> bool:
        """Count this in-process restart; True when it is one too many in a row."""
        if not self.quick_repeats:
            return False
        now = self._clock()
        if self._quick and now - self._quick[-1] > QUICK_WINDOW:
            self._quick = []  # the last one held: the count starts again
        self._quick.append(now)
        if len(self._quick) > self.quick_repeats:
            self._quick = []
            return True
        return False

    def _count(
        self, why: str, local_ranks: Sequence[int], kept: Mapping[int, Any], at: str = ""
    ) -> None:
        """Log survivors that are replaced by new processes, and why (``at``: where they
        were stuck); count those that were alive and well (a fallback)."""
        what = REPLACED_BECAUSE[why].format(park_timeout=self.park_timeout)
        what += f" ({at})" if at else ""
        if why not in self.fallbacks:
            log.info(
                "Local rank(s) %s %s: replacing them with new processes", list(local_ranks), what
            )
            return
        self.fallbacks[why] += 1
        self.last_fallback = Fallback(why, tuple(local_ranks), tuple(sorted(kept)))
        how = (
            f"replacing them with new processes; local rank(s) {sorted(kept)} keep theirs"
            if kept
            else "restarting every worker as a new process"
        )
        log.warning(
            "Local rank(s) %s %s: %s (in-process fallback: %s)", list(local_ranks), what, how, why
        )

    def _fall_back(self, why: str, local_ranks: Sequence[int], detail: str) -> dict[int, Any]:
        """Every worker restarts as a new process, because of ``why`` (``detail`` says it
        for people)."""
        self.fallbacks[why] += 1
        self.last_fallback = Fallback(why, tuple(local_ranks), ())
        self.kinds["process"] += 1
        log.warning(
            "%s; restarting every worker as a new process (in-process fallback: %s)", detail, why
        )
        return self._keep_none()

    def _keep_none(self) -> dict[int, WorkerProcess]:
        self.parked = {}
        return {}

    def raised(self) -> dict[int, tuple[str, float]]:
        """The workers whose training function raised (still alive, waiting to be parked):
        what, and when, by local rank."""
        return {rank: c.error for rank, c in self._channels.items() if c.error is not None}

    def resume(self, local_rank: int, env: Mapping[str, str]) -> bool:
        """Send the kept worker its new variables (those that differ from the agent's own);
        False if it cannot be told (it is then replaced)."""
        channel = self._channels.get(local_rank)
        if channel is None or channel.broken:
            return False
        delta = {k: v for k, v in env.items() if os.environ.get(k) != v}
        channel.parked.clear()  # it runs again: a hang found from now on may be its
        return channel.send("resume", env=delta)

    def forget(self, local_ranks: Iterable[int]) -> None:
        for rank in local_ranks:
            channel = self._channels.pop(rank, None)
            if channel is not None:
                channel.close()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.forget(list(self._channels))
        self.parked = {}
