"""What happens when a timer runs out: under an agent, the optional stack-dump signal,
then the request's signal to the worker's process group and the owner told; for torch's
standalone server, the pid alone, retried until it is reaped; and torch's synchronous
pass (:meth:`Expiry._run_watchdog`). A mixin of :class:`~agentd.timer.server.TimerServer`,
whose registry holds the deadlines."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from agentd.support.ratelog import RateLimitedLog
from agentd.timer.api import TimerRequest

log = logging.getLogger(__name__)

OnExpired = Callable[[TimerRequest, "int | None"], None]
"""``on_expired(request, pgid)``: a timer ran out and its worker's group was signalled
(``pgid`` None when nothing was signalled)."""


class Entry(NamedTuple):
    """One live timer: its request, its deadline on the monotonic clock, and the process
    group its owner vouched for (None for the standalone server)."""

    request: TimerRequest
    deadline: float
    pgid: int | None


class Expiry:
    """Expiry and reaping for the timer server (its state lives on the server)."""

    _request_queue: object
    max_interval: float
    _trust: Callable[[int], int | None] | None
    _describe: Callable[[int], str] | None
    _on_expired: OnExpired | None
    _dump_signal: int | None
    _dump_grace: float
    _clock: Callable[[], float]
    _wall: Callable[[], float]
    stats: collections.Counter[str]
    _reap_retries: RateLimitedLog
    _retries: dict[int, asyncio.TimerHandle]

    if TYPE_CHECKING:  # the server's

        def register_timers(self, timer_requests: Iterable[TimerRequest]) -> None: ...

        def clear_timers(self, worker_ids: Iterable[int]) -> None: ...

        def get_expired_timers(self, deadline: float) -> dict[int, list[TimerRequest]]: ...

        def _trusted_group(self, pid: int) -> int | None: ...

        def log_event(self, name: str, request: TimerRequest | None) -> None: ...

        def _put_back(self, requests: list[TimerRequest]) -> None: ...

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
                    self._put_back(expired)  # back as they were
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

    def _expire(self, entry: Entry) -> None:
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
                "Timer %r of %s expired: sent %s, killing in %.1fs",
                request.scope_id,
                self._who(request.worker_id),
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
            "Timer %r of %s expired: sent %s to its process group %d (%.2f ms late)",
            request.scope_id,
            self._who(request.worker_id),
            signal_name(request.signal),
            pgid,
            late * 1000,
        )
        self._notify(request, pgid)

    def _who(self, pid: int) -> str:
        """``pid N``, or what the agent names it by (``rank R (local rank L, pid N)``)."""
        if self._describe is not None:
            return self._describe(pid)
        return f"pid {pid}"

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
