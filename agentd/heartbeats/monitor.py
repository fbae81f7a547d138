"""The progress monitor: each worker's last sign of progress and its deadline, one timer.

Fed the progress messages of the agent's workers (see
:mod:`agentd.wire.progress`), it keeps for each worker when it last made progress,
which sections it is in, and so its deadline: the last progress plus the timeout of the
innermost section (or of the step), or its start plus the initial timeout before its
first message (a rank resumed in process: its start plus the resume timeout, learned
from the time new workers take to their first message). One loop timer is armed at the
earliest deadline (none while nothing is watched); when it fires with a worker past its
deadline, ``on_hang`` gets what every watched worker was doing, once per attempt.
Intervals go to the learned timeouts, step and section times to the straggler
statistics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentd.heartbeats.settings import START, STEP
from agentd.heartbeats.stragglers import STEP_SERIES, StepTimes
from agentd.heartbeats.timeouts import LearnedTimeouts, Timeout
from agentd.wire.progress import ProgressMessage

log = logging.getLogger(__name__)

LATE = 1.0
"""Seconds past its deadline after which a check finds the agent itself was not running."""


@dataclass
class _Watch:
    local_rank: int
    pid: int
    started: float
    resumed: bool = False
    """It kept its process through an in-process restart (it was started before)."""
    last: float | None = None
    sections: list[tuple[str, float]] = field(default_factory=list)
    steps: int = 0
    beat_at: float | None = None
    beat_steps: int = 0
    done: bool = False
    dump_signal: int = 0

    @property
    def key(self) -> str:
        return self.sections[-1][0] if self.sections else STEP


@dataclass(frozen=True)
class Silence:
    """What one watched worker was doing when a hang was found."""

    local_rank: int
    pid: int
    section: str
    """The innermost section's name, or :data:`STEP` outside sections."""
    last_progress: float | None
    """Monotonic time of its last message; None: it never sent one."""
    silent_for: float
    timeout: Timeout
    overdue: bool
    steps: int
    dump_signal: int
    resumed: bool = False
    """It resumed in process and has not heartbeated since."""


class ProgressMonitor:
    """Watches one attempt's workers at a time (see the module's docstring).

    ``active()`` says whether workers that never sent a message are held to the initial
    timeout (the run is instrumented, or the user set that timeout); ``running(local_rank)``
    whether a worker still runs (an exited worker is not hung); ``drain()`` reads what is
    waiting on the pipe, before a deadline is judged.
    """

    def __init__(
        self,
        timeouts: LearnedTimeouts,
        step_times: StepTimes,
        on_hang: Callable[[list[Silence]], None],
        running: Callable[[int], bool],
        clock: Callable[[], float] = time.monotonic,
        drain: Callable[[], None] = lambda: None,
    ) -> None:
        self.timeouts = timeouts
        self.step_times = step_times
        self._on_hang = on_hang
        self._running = running
        self._clock = clock
        self._drain = drain
        self._watches: dict[int, _Watch] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._reported = False
        self._held_until = float("-inf")
        self._graced = False
        self._dump_signals: dict[int, int] = {}
        """The dump signal each worker process registered, by pid: a process resumed in
        process registered it in an earlier attempt, and still answers it."""

    def active(self) -> bool:
        return self.timeouts.instrumented or self.timeouts.settings.initial_timeout is not None

    def watch(
        self, pids: dict[int, int], ranks: dict[int, int], resumed: Collection[int] = ()
    ) -> None:
        """Watch a new attempt's workers: ``pids`` and global ``ranks`` by local rank;
        ``resumed``: the local ranks that kept their process (an in-process restart)."""
        now = self._clock()
        self._cancel()
        self._reported = False
        self._held_until = float("-inf")
        self._watches = {lr: _Watch(lr, pid, now, lr in resumed) for lr, pid in pids.items()}
        kept = {pids[lr]: self._dump_signals.get(pids[lr], 0) for lr in resumed if lr in pids}
        self._dump_signals = {pid: signal for pid, signal in kept.items() if signal}
        for w in self._watches.values():
            w.dump_signal = self._dump_signals.get(w.pid, 0)
        self.step_times.new_attempt(ranks)
        self._arm()

    def hold(self, seconds: float | None) -> None:
        """Hold no worker to its timeout for ``seconds`` from now; None ends the hold now.
        A drain pauses every rank at its step and has it checkpoint, while the ranks of
        other nodes wait on them in a collective: silences that are no hang. Each
        worker's silence counts from the hold's end, and no interval across the hold is a
        sample of a timeout."""
        now = self._clock()
        self._held_until = now + seconds if seconds is not None else min(self._held_until, now)
        self._cancel()
        self._arm()

    def unwatch(self) -> None:
        """The attempt's workers are stopped: nothing is watched until the next one."""
        self._cancel()
        self._watches = {}

    def feed(self, messages: Iterable[tuple[int, ProgressMessage]]) -> None:
        """Take (local rank, message) pairs, in the order they arrived."""
        now = self._clock()
        for local_rank, message in messages:
            watch = self._watches.get(local_rank)
            if watch is not None:
                self._take(watch, message, now)
        self.timeouts.save_if_due(now)
        self._arm()

    def _take(self, w: _Watch, m: ProgressMessage, now: float) -> None:
        at = min(m.at, now)
        if w.last is not None:
            at = max(at, w.last)
        self.timeouts.mark_instrumented()
        # The timeout bounds the time from one message to the next, wherever they come
        # from: every such interval is a sample of the innermost section it passed in. A
        # park ends one early (a failure elsewhere interrupted it): no sample.
        sample = m.kind != "parked"
        if sample and w.last is not None and not w.done and w.last >= self._held_until:
            self.timeouts.observe(w.key, at - w.last)
        elif sample and w.last is None and not w.resumed and w.started >= self._held_until:
            self.timeouts.observe(START, at - w.started)  # a new worker's start
        if m.kind == "beat":
            if not w.sections:
                if w.beat_at is not None and m.steps > w.beat_steps:
                    count = m.steps - w.beat_steps
                    self.step_times.observe(
                        w.local_rank, STEP_SERIES, (at - w.beat_at) / count, count
                    )
                w.beat_at, w.beat_steps = at, m.steps
        elif m.kind == "enter":
            assert m.section is not None
            w.sections.append((m.section, at))
            w.beat_at = None
        elif m.kind == "exit":
            for i in range(len(w.sections) - 1, -1, -1):
                name, entered = w.sections[i]
                if name == m.section:
                    del w.sections[i:]
                    self.step_times.observe(w.local_rank, name, at - entered)
                    break
            w.beat_at = None
        elif m.kind in ("drain", "saved"):  # a drain's pause is no step time
            w.beat_at = None
        else:  # done, parked
            w.sections.clear()
            w.beat_at = None
        w.done = m.kind in ("done", "parked")
        w.last, w.steps = at, m.steps
        if m.dump_signal:
            w.dump_signal = self._dump_signals[w.pid] = m.dump_signal

    def _deadline(self, w: _Watch) -> tuple[float, Timeout] | None:
        if w.done or not self._running(w.local_rank):
            return None
        if w.last is None:
            if not self.active():
                return None
            if w.resumed:
                timeout = self.timeouts.timeout(START)
            else:
                timeout = Timeout(self.timeouts.settings.initial, "initial")
            return max(w.started, self._held_until) + timeout.seconds, timeout
        timeout = self.timeouts.timeout(w.key)
        return max(w.last, self._held_until) + timeout.seconds, timeout

    def beats_due_in(self) -> float | None:
        """Seconds from now within which every running worker that heartbeats will send
        its next message unless it is hung (its deadline, a hold aside); None when none of
        the attempt's running workers has sent one."""
        now = self._clock()
        due = [
            w.last + self.timeouts.timeout(w.key).seconds - now
            for w in self._watches.values()
            if w.last is not None and not w.done and self._running(w.local_rank)
        ]
        return max(0.0, *due) if due else None

    def next_deadline(self) -> float | None:
        """The earliest deadline of the watched workers (monotonic), if any."""
        deadlines = [d[0] for w in self._watches.values() if (d := self._deadline(w))]
        return min(deadlines) if deadlines else None

    def _arm(self) -> None:
        """Arm the timer at the earliest deadline, unless it already fires before that (a
        timer that fires early finds nothing overdue and arms itself again)."""
        if self._reported:
            return
        head = self.next_deadline()
        if head is None or (self._armed_at is not None and self._armed_at <= head):
            return
        self._cancel()
        loop = asyncio.get_running_loop()
        self._armed_at = head
        self._timer = loop.call_at(loop.time() + max(0.0, head - self._clock()), self._fire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_at = None, None

    def _fire(self) -> None:
        armed_at = self._armed_at
        self._timer, self._armed_at = None, None
        self._drain()  # messages already sent (the loop may have been late) count first
        if self._reported:
            return
        now = self._clock()
        lateness = now - armed_at if armed_at is not None else 0.0
        late = lateness > LATE
        if late and not self._graced:
            # This agent did not run meanwhile (frozen, starved): the silence it sees may
            # be its own, and what it has not read yet (a drain, a round's end) may explain
            # the workers' waits. Each silence counts from now, once: an agent late at
            # every check still judges, at the next.
            self._graced = True
            log.warning(
                "The hang check ran %.1fs late (this agent was not running); the workers' "
                "silences count from now",
                lateness,
            )
            self._held_until = max(self._held_until, now)
            self._arm()
            return
        self._graced = late
        silences = self.silences(now)
        if not any(s.overdue for s in silences):
            self._arm()
            return
        self._reported = True
        self.timeouts.save()
        try:
            self._on_hang(silences)
        except Exception:
            log.exception("The hang handler failed")

    def silences(self, now: float | None = None) -> list[Silence]:
        """What every watched worker that still runs is doing now."""
        now = self._clock() if now is None else now
        out = []
        for w in self._watches.values():
            found = self._deadline(w)
            if found is None:
                continue
            deadline, timeout = found
            since = w.last if w.last is not None else w.started
            out.append(
                Silence(
                    w.local_rank,
                    w.pid,
                    w.key,
                    w.last,
                    now - since,
                    timeout,
                    now >= deadline,
                    w.steps,
                    w.dump_signal,
                    w.resumed and w.last is None,
                )
            )
        return out

    def ended_but_running(self) -> list[tuple[int, int, int]]:
        """(local rank, pid, dump signal) of each watched worker that ended its heartbeats
        and still runs: held to no timeout, but a hang's dump shows where it waits (often
        in a last collective with the rank that hung)."""
        return [
            (w.local_rank, w.pid, w.dump_signal)
            for w in self._watches.values()
            if w.done and self._running(w.local_rank)
        ]

    def status(self) -> list[dict[str, Any]]:
        """Each watched worker: steps, section, seconds since its last progress, timeout."""
        now = self._clock()
        out = []
        for w in self._watches.values():
            found = self._deadline(w)
            since = w.last if w.last is not None else w.started
            entry: dict[str, Any] = {
                "local_rank": w.local_rank,
                "steps": w.steps,
                "section": w.sections[-1][0] if w.sections else None,
                "silent_for": round(now - since, 3),
                "heartbeating": w.last is not None and not w.done,
                "resumed": w.resumed,
                "timeout": round(found[1].seconds, 3) if found else None,
                "timeout_source": found[1].source if found else None,
            }
            entry["times"] = self.step_times.status(w.local_rank)
            out.append(entry)
        return out
