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
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from agentd.support.aio import cancel_and_wait
from agentd.support.ratelog import RateLimitedLog
from agentd.support.sync_bridge import StartedInBackground
from agentd.timer.api import TimerRequest

log = logging.getLogger(__name__)

Trust = Callable[[int], "int | None"]
"""``trust(pid)`` -> the process group to signal for ``pid``, or None if not ours."""
OnExpired = Callable[[TimerRequest, "int | None"], None]
"""``on_expired(request, pgid)``: a timer ran out; ``pgid`` was signalled (None: it was not)."""

DEFAULT_MAX_OVERDUE = 0.5
MAX_TIMERS_PER_WORKER = 1024
"""Live timers one process may hold; more are dropped and counted (``capped``)."""
MAX_TIMERS = 16384
"""Live timers in all, whatever the number of workers."""
_FINE_SLEEP = 0.002


class _Entry(NamedTuple):
    request: TimerRequest
    deadline: float
    pgid: int | None


class TimerServer(StartedInBackground):
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
        on_expired: OnExpired | None = None,
        dump_signal: int | None = None,
        dump_grace: float = 1.0,
        max_overdue: float = DEFAULT_MAX_OVERDUE,
        max_timers_per_worker: int = MAX_TIMERS_PER_WORKER,
        max_timers: int = MAX_TIMERS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._request_queue = request_queue
        self.max_interval = max_interval
        self.daemon = daemon
        self._trust = trust
        self._request_count = 0
        self._on_expired = on_expired
        self._dump_signal = dump_signal
        self._dump_grace = dump_grace
        self.max_overdue = max_overdue
        self._clock = clock
        self._wall = wall_clock
        self._max_per_worker = max_timers_per_worker
        self._max_timers = max_timers
        self._timers: dict[tuple[int, str], _Entry] = {}
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
                self.count_bad("untrusted", f"pid {request.worker_id} is not one of our workers")
                continue
            deadline = self._clock() + (request.expiration_time - self._wall())
            if key not in self._timers:
                self._per_pid[request.worker_id] += 1
            self._timers[key] = _Entry(request, deadline, pgid)
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

    def _remove(self, key: tuple[int, str]) -> _Entry | None:
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

    def __len__(self) -> int:
        return len(self._timers)

    def count_bad(self, kind: str, detail: str) -> None:
        """Count a dropped request; log it (at most once a second per kind)."""
        self.stats[kind] += 1
        now = self._clock()
        if now - self._last_warning.get(kind, -1e9) >= 1.0:
            self._last_warning[kind] = now
            log.warning("Timer request dropped (%s, %d so far): %s", kind, self.stats[kind], detail)

    def _pop_due(self, deadline: float) -> list[_Entry]:
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

    # -- torch's synchronous pass and reaping -------------------------------------------------

    def _run_watchdog(self) -> None:
        """One pass, as torch's watchdog thread makes every ``max_interval``: register what
        the requests source holds (:meth:`_take_requests`), reap each worker with an expired
        timer and forget the timers of those reaped. A reap that returns False is retried at
        the next pass; one that raises is logged and counted as done, as torch's contract for
        ``_reap_worker`` says (agentd's own never raises: it returns False on a failure).
        agentd's own task expires timers on time without these passes."""
        self.register_timers(self._take_requests())
        reaped: set[int] = set()
        for worker_id, expired in self.get_expired_timers(self._wall()).items():
            scopes = [request.scope_id for request in expired]
            try:
                if self._reap_expired(worker_id, expired):
                    reaped.add(worker_id)
                else:
                    self._failed_reap(worker_id, scopes)
                    TimerServer.register_timers(self, expired)  # back as they were
            except Exception:
                log.exception("Reaping pid %d (timers %s) raised", worker_id, scopes)
                reaped.add(worker_id)  # torch's contract: a reap that raises is done
        self.clear_timers(reaped)

    def _failed_reap(self, worker_id: int, scopes: list[str]) -> None:
        message = "Could not reap pid %d (timers %s); retrying every %gs"
        self._reap_retries.error("retry", message, worker_id, scopes, self.max_interval)

    def _take_requests(self) -> list[TimerRequest]:
        """torch's ``request_queue.get(max(1, size()), max_interval)``; [] without one."""
        queue: Any = self._request_queue
        if queue is None:
            return []
        return list(queue.get(max(1, queue.size()), self.max_interval))

    def _reap_expired(self, worker_id: int, expired: list[TimerRequest]) -> bool:
        """Reap one worker whose timers ran out (a subclass may need the signal)."""
        return bool(self._reap_worker(worker_id))

    def _reap_worker(self, worker_id: int, signal: int = int(signal.SIGKILL)) -> bool:
        """torch's standalone reaping: ``signal`` to the pid alone. True when done (or the
        pid is already gone); a pid <= 0 or this process is refused and reported."""
        if worker_id <= 0 or worker_id == os.getpid():
            log.error("Timer of pid %d expired; refusing to signal it", worker_id)
            return True
        if not self.is_process_running(worker_id):
            return True
        try:
            os.kill(worker_id, signal)
        except ProcessLookupError:
            return True
        except OSError as exc:  # retried by the caller, never dropped: the worker may hang on
            self.stats["reap_errors"] += 1
            log.error("Could not send %s to pid %d: %s", signal_name(signal), worker_id, exc)
            return False
        self.stats["reaped"] += 1
        log.error("Timer of pid %d expired: sent %s", worker_id, signal_name(signal))
        return True

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """True when ``pid`` is a live process (torch's check before reaping)."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except (PermissionError, OverflowError, ValueError):
            return pid > 0
        return True

    # -- the watchdog task -------------------------------------------------------------------

    async def start_async(self) -> None:
        """Start the watchdog task on the running loop (idempotent)."""
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

    def _expire(self, entry: _Entry) -> None:
        """Reap one worker: never raises, never signals the agent."""
        request = entry.request
        self.stats["expired"] += 1
        self.log_event("timer expired", request)
        if self._trust is None:
            self._reap_standalone(request)
            return
        pgid = self._trusted_group(request.worker_id)  # again: the pid may have gone since
        if pgid is None or pgid == os.getpgid(0):
            log.warning(
                "Timer %r of pid %d expired, but the pid is no longer ours",
                request.scope_id,
                request.worker_id,
            )
            return
        if request.signal <= 0:
            log.warning(
                "Timer %r of pid %d expired (signal %d: not killing)",
                request.scope_id,
                request.worker_id,
                request.signal,
            )
            self._notify(request, None)
            return
        if self._dump_signal:
            _signal_pid(request.worker_id, self._dump_signal)
            log.warning(
                "Timer %r of pid %d expired: sent %s, killing in %.1fs",
                request.scope_id,
                request.worker_id,
                signal.Signals(self._dump_signal).name,
                self._dump_grace,
            )
            loop = asyncio.get_running_loop()
            loop.call_later(self._dump_grace, self._kill, request, pgid, entry.deadline)
        else:
            self._kill(request, pgid, entry.deadline)

    def _reap_standalone(self, request: TimerRequest) -> None:
        """Reap an expired pid of torch's standalone server; a reap that returns False is
        retried every ``max_interval`` until it succeeds or the pid is gone (before, the
        timer was dropped and the hung worker ran on)."""
        pending = self._retries.pop(request.worker_id, None)
        if pending is not None:
            pending.cancel()
        if request.signal <= 0 or not self.is_process_running(request.worker_id):
            self._notify(request, None)
            return
        try:
            done = self._reap_expired(request.worker_id, [request])  # logs what it sent
        except Exception:  # torch's contract: a reap that raises is done
            log.exception("Reaping pid %d raised", request.worker_id)
            done = True
        if not done:
            self._failed_reap(request.worker_id, [request.scope_id])
            loop = asyncio.get_running_loop()
            retry = loop.call_later(self.max_interval, self._reap_standalone, request)
            self._retries[request.worker_id] = retry
            return
        self.log_event("kill worker process", request)
        self._notify(request, None)

    def _kill(self, request: TimerRequest, pgid: int, deadline: float) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, request.signal)
        late = self._clock() - deadline
        self.stats["reaped"] += 1
        self.log_event("kill worker process", request)
        log.error(
            "Timer %r of pid %d expired: sent %s to its process group %d (%.2f ms late)",
            request.scope_id,
            request.worker_id,
            signal_name(request.signal),
            pgid,
            late * 1000,
        )
        self._notify(request, pgid)

    def _notify(self, request: TimerRequest, pgid: int | None) -> None:
        if self._on_expired is not None:
            try:
                self._on_expired(request, pgid)
            except Exception:
                log.exception("Timer expiry callback failed")


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
