"""The watchdog: an asyncio timer server that reaps workers whose timers ran out.

One task holds every deadline in a heap and sleeps until the earliest; a new request that
comes due sooner wakes it. The loop's timeouts are whole milliseconds rounded up, so it
wakes two milliseconds early and sleeps the rest exactly. Deadlines are kept on the
monotonic clock (the wire's epoch seconds are converted once, on arrival). On expiry the
server optionally sends a stack-dump signal and waits a grace period, then sends the
request's signal to the worker's process group and tells its owner (the agent), which
restarts the group per policy. The agent itself is never signalled.

Under an agent, requests are honoured only for processes the owner vouches for (``trust``:
the pid's worker process group, or None); anything else is logged, counted and dropped.
A server built without ``trust`` is torch's standalone server: whoever can write to its
queue or pipe is believed, and an expired pid is signalled alone (as torch's
``os.kill(pid, sig)``), once it is still running, never this process nor a pid <= 0.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from agentd.support.aio import cancel_and_wait
from agentd.support.ratelog import RateLimitedLog
from agentd.support.sync_bridge import StartedInBackground
from agentd.timer.api import TimerRequest
from agentd.timer.expiry import Entry, Expiry, OnExpired

log = logging.getLogger(__name__)

Trust = Callable[[int], "int | None"]
"""``trust(pid)`` -> the process group to signal for ``pid``, or None if not ours."""
DEFAULT_MAX_OVERDUE = 0.5
MAX_TIMERS_PER_WORKER = 1024
"""Live timers one process may hold; more are dropped and counted (``capped``)."""
MAX_TIMERS = 16384
"""Live timers in all, whatever the number of workers."""
_FINE_SLEEP = 0.002


class TimerServer(Expiry, StartedInBackground):
    """Expiration timers for local workers, enforced by one asyncio task.

    ``register_timers``, ``clear_timers`` and ``get_expired_timers`` are the seed's API and
    plain synchronous logic on an injectable ``clock`` (monotonic seconds) and
    ``wall_clock`` (epoch seconds), so they can be tested without waiting. Deadlines come
    and go in epoch seconds, as ``TimerRequest.expiration_time`` (torch's ``time.time()``).

    The positional arguments are torch's: ``request_queue`` (a
    :class:`~agentd.timer.api.RequestQueue`, drained every ``max_interval`` seconds; the
    subclasses here are fed by events instead, and expire timers on time whatever
    ``max_interval`` says) and ``daemon`` (the thread of a server started with the
    synchronous :meth:`start`). In async code, ``await start_async()`` runs the server on
    the running loop. :meth:`_run_watchdog` is torch's one synchronous pass.

    A process holds at most ``max_timers_per_worker`` live timers and the server at most
    ``max_timers``; a new scope beyond either is dropped and counted as ``capped`` (moving
    or releasing a scope it holds always works), so a runaway worker costs bounded memory.
    """

    def __init__(
        self,
        request_queue: object = None,
        max_interval: float = 1.0,
        daemon: bool = True,
        *,
        trust: Trust | None = None,
        gone: Callable[[int], bool] | None = None,
        on_expired: OnExpired | None = None,
        dump_signal: int | None = None,
        dump_grace: float = 1.0,
        max_overdue: float = DEFAULT_MAX_OVERDUE,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
        max_timers: int = MAX_TIMERS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        self._request_queue = request_queue
        self._describe = describe
        """Names a worker pid in the kill lines (the agent's: its rank), else ``pid N``."""
        self.max_interval = max_interval
        self.daemon = daemon
        self._trust = trust
        self._gone = gone
        self._request_count = 0
        self._on_expired = on_expired
        self._dump_signal = dump_signal
        self._dump_grace = dump_grace
        self.max_overdue = max_overdue
        self._clock = clock
        self._wall = wall_clock
        self._max_per_worker = max_timers_per_worker
        self._max_timers = max_timers
        self._timers: dict[tuple[int, str], Entry] = {}
        self._per_pid: collections.Counter[int] = collections.Counter()
        self._heap: list[tuple[float, int, tuple[int, str]]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._drain: asyncio.Task[None] | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        self._last_warning: dict[str, float] = {}
        self._reap_retries = RateLimitedLog(log)
        self._retries: dict[int, asyncio.TimerHandle] = {}
        """The standalone task's pending reap retries, by pid."""

    # -- the seed's API: plain logic ---------------------------------------------------------

    def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None:
        """Acquire or release timers; requests for processes not ours are dropped."""
        earliest = self.next_deadline()
        for request in timer_requests:
            self._request_count += 1
            key = (request.worker_id, request.scope_id)
            if request.is_release:
                self.stats["released"] += 1
                self._remove(key)
                continue
            if key not in self._timers and (
                self._per_pid[request.worker_id] >= self._max_per_worker
                or len(self._timers) >= self._max_timers
            ):
                held = self._per_pid[request.worker_id]
                limits = f"at most {self._max_per_worker} each, {self._max_timers} in all"
                self.count_bad("capped", f"pid {request.worker_id} holds {held} timers ({limits})")
                continue
            pgid = self._trusted_group(request.worker_id)
            if pgid is None and self._trust is not None:
                if self._gone is not None and self._gone(request.worker_id):
                    self.stats["late"] += 1  # sent as our worker exited: nothing to time
                    continue
                self.count_bad("untrusted", f"pid {request.worker_id} is not one of our workers")
                continue
            deadline = self._clock() + (request.expiration_time - self._wall())
            if key not in self._timers:
                self._per_pid[request.worker_id] += 1
            self._timers[key] = Entry(request, deadline, pgid)
            heapq.heappush(self._heap, (deadline, next(self._seq), key))
            self.stats["acquired"] += 1
            if earliest is None or deadline < earliest:
                earliest = deadline
                if self._wake is not None:
                    self._wake.set()
        if len(self._heap) > 2 * len(self._timers) + 64:
            self._compact()

    def _trusted_group(self, pid: int) -> int | None:
        if self._trust is None:
            return None
        try:
            return self._trust(pid)
        except (OverflowError, ValueError):
            return None

    def clear_timers(self, worker_ids: Iterable[int]) -> None:
        """Forget every timer of these workers (they exited or were stopped)."""
        gone = set(worker_ids)
        for key in [k for k in self._timers if k[0] in gone]:
            self._remove(key)

    def _remove(self, key: tuple[int, str]) -> Entry | None:
        entry = self._timers.pop(key, None)
        if entry is not None:
            self._per_pid[key[0]] -= 1
            if self._per_pid[key[0]] <= 0:
                del self._per_pid[key[0]]
        return entry

    def get_expired_timers(self, deadline: float) -> dict[int, list[TimerRequest]]:
        """Remove and return the timers due at ``deadline`` (epoch seconds, the clock of
        ``TimerRequest.expiration_time``), by worker pid."""
        expired: dict[int, list[TimerRequest]] = {}
        for entry in self._pop_due(self._clock() + (deadline - self._wall())):
            expired.setdefault(entry.request.worker_id, []).append(entry.request)
        return expired

    def next_deadline(self) -> float | None:
        """The earliest live deadline (monotonic), or None without timers."""
        while self._heap:
            deadline, _, key = self._heap[0]
            entry = self._timers.get(key)
            if entry is not None and entry.deadline == deadline:
                return deadline
            heapq.heappop(self._heap)  # released, cleared or re-acquired since
        return None

    def _put_back(self, requests: list[TimerRequest]) -> None:
        """Timers a reap could not end, registered again as they were (this registry,
        whatever a subclass's ``register_timers`` does)."""
        TimerServer.register_timers(self, requests)

    def __len__(self) -> int:
        return len(self._timers)

    def count_bad(self, kind: str, detail: str) -> None:
        """Count a dropped request; log it (at most once a second per kind)."""
        self.stats[kind] += 1
        now = self._clock()
        if now - self._last_warning.get(kind, -1e9) >= 1.0:
            self._last_warning[kind] = now
            log.warning("Timer request dropped (%s, %d so far): %s", kind, self.stats[kind], detail)

    def _pop_due(self, deadline: float) -> list[Entry]:
        due = []
        while (head := self.next_deadline()) is not None and head <= deadline:
            _, _, key = heapq.heappop(self._heap)
            entry = self._remove(key)
            assert entry is not None  # next_deadline() vouched for it
            due.append(entry)
        return due

    def _compact(self) -> None:
        self._heap = [(e.deadline, next(self._seq), k) for k, e in self._timers.items()]
        heapq.heapify(self._heap)

    # -- the watchdog task -------------------------------------------------------------------

    async def start_async(self) -> None:
        """Start the watchdog task on the running loop (idempotent)."""
        self.start_on_loop()

    def start_on_loop(self) -> None:
        """:meth:`start_async` from code that runs on the loop already (a callback)."""
        if self._task is None:
            self._wake = asyncio.Event()
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._watch(), name="watchdog")
            if self._request_queue is not None:
                self._drain = loop.create_task(self._drain_queue(), name="timer-queue")

    async def stop_async(self) -> None:
        """Stop the watchdog task; pending timers are dropped."""
        task, self._task = self._task, None
        drain, self._drain = self._drain, None
        for retry in self._retries.values():
            retry.cancel()
        self._retries.clear()
        await cancel_and_wait(drain)
        await cancel_and_wait(task)

    async def _drain_queue(self) -> None:
        """torch's polling of a ``RequestQueue``: whatever is there, every max_interval."""
        import anyio.to_thread

        queue: Any = self._request_queue
        while True:
            size = max(1, queue.size())
            requests = await anyio.to_thread.run_sync(
                queue.get, size, self.max_interval, abandon_on_cancel=True
            )
            self.register_timers(requests)

    def alive(self) -> bool:
        """The watchdog's task runs and no deadline is overdue beyond ``max_overdue``.

        Answered from state alone, without waking the task: an idle watchdog is asleep.
        """
        if self._task is None or self._task.done():
            return False
        head = self.next_deadline()
        return head is None or self._clock() - head <= self.max_overdue

    async def _watch(self) -> None:
        assert self._wake is not None
        while True:
            head = self.next_deadline()
            if head is not None and head - self._clock() <= _FINE_SLEEP:
                # epoll counts whole milliseconds, rounded up: sleep the last ones exactly
                time.sleep(max(0.0, head - self._clock()))  # noqa: ASYNC251 (<= 2 ms)
                for entry in self._pop_due(max(head, self._clock())):
                    self._expire(entry)
                continue
            timeout = None if head is None else head - self._clock() - _FINE_SLEEP
            with contextlib.suppress(TimeoutError):  # not wait_for: see membership.py
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()

    def log_event(self, name: str, request: TimerRequest | None) -> None:
        """Hook for torch's ``log_event`` (see :class:`FileTimerServer`)."""
