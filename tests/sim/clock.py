"""A virtual clock for the protocol simulation: an event loop whose time jumps to its next
timer, and whose callbacks are gated by the simulated process that owns them.

Every callback the loop runs belongs to an *owner* (an agent, a guardian, the store), read
from :data:`OWNER` in the context it runs in: a task started by an owner, and everything
that task schedules, is that owner's. A paused owner (SIGSTOP) runs nothing: its callbacks
are held and run in order when it is resumed, late, as a frozen process's timers fire
after SIGCONT. A dead owner (SIGKILL) never runs again. Nothing sleeps for real: when no
callback is ready, the clock moves to the next timer. ``time.monotonic`` is the same clock
while :func:`run` runs, since agentd's membership reads it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import inspect
import selectors
import sys
import warnings
from collections.abc import Callable, Coroutine, Iterator
from typing import Any
from unittest import mock

START = 1000.0
"""The clock's reading when a simulation starts (monotonic readings are never near 0)."""


LIVELOCK = 100_000
"""Loop turns at one instant after which the simulation is stuck (a livelock)."""
RESOLUTION = 1e-6
"""The smallest step the clock takes when it jumps."""


class Owner:
    """A simulated process: ``paused`` holds its callbacks, ``dead`` drops them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.paused = False
        self.dead = False
        self.held: list[
            tuple[Callable[..., object], tuple[Any, ...], contextvars.Context, asyncio.Handle]
        ] = []
        """What came due while paused: the callback, its arguments, context and handle."""

    def __repr__(self) -> str:
        return f"Owner({self.name})"


OWNER: contextvars.ContextVar[Owner | None] = contextvars.ContextVar("sim_owner", default=None)


class Stuck(RuntimeError):
    """Nothing is ready and no timer is set: every simulated process waits forever."""


class _JumpingSelector(selectors.BaseSelector):
    """A selector that never sleeps: a wait of ``timeout`` moves the clock instead."""

    def __init__(self, clock: VirtualLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:  # callbacks are ready: the wakeup pipe can wait for the next jump
            return []
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            raise Stuck("no callback is ready and no timer is set")
        # at least a microsecond: a timer due a float's rounding away (asyncio runs one up
        # to its clock resolution early) would otherwise be re-armed at the same instant
        self._loop.now += max(timeout, RESOLUTION)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time with callbacks gated by their owner."""

    def __init__(self) -> None:
        self.now = START
        self.ending = False
        """The simulation is over: every owner's callbacks run (its tasks are cancelled)."""
        self._spins = 0
        self.holding: set[Owner] = set()
        """The paused owners whose callbacks are held (:meth:`resume` runs them)."""
        self.interrupted: BaseException | None = None
        """What ended the run from outside the simulation (:meth:`_ended_from_outside`)."""
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now

    def _run_once(self) -> None:
        before = self.now
        super()._run_once()  # type: ignore[misc]
        if self.now != before:
            self._spins = 0
            return
        self._spins += 1
        if self._spins > LIVELOCK:
            raise Stuck(f"{LIVELOCK} loop turns at t={self.now - START:.6f}s without time moving")

    def call_soon(
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        context = context if context is not None else contextvars.copy_context()
        gated = _gate(self, callback, context)
        handle = super().call_soon(gated, *args, context=context)
        if gated is not callback:
            gated.handle = handle  # type: ignore[attr-defined]
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        context = context if context is not None else contextvars.copy_context()
        gated = _gate(self, callback, context)
        handle = super().call_at(when, gated, *args, context=context)
        if gated is not callback:
            gated.handle = handle  # type: ignore[attr-defined]
        return handle

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:  # type: ignore[override]
        task = super().create_task(coro, **kwargs)
        task.add_done_callback(self._ended_from_outside)
        return task

    def _ended_from_outside(self, task: asyncio.Task[Any]) -> None:
        """A task that ended on something no simulated process raises (pytest's timeout,
        which lands in whatever task runs): it ends the run, as it would a real program.
        Such an exception is kept in its task, not raised, and the agent whose task it was
        looked dead, so the timeout read as an invariant broken (an S5 of a loaded machine,
        2026-12-03)."""
        error = None if task.cancelled() else task._exception  # type: ignore[attr-defined]
        if error is not None and not isinstance(error, Exception):
            task.exception()  # raised from run(): retrieved
            if self.interrupted is None:
                self.interrupted = error
                self.stop()

    def resume(self, owner: Owner) -> None:
        """Run what ``owner`` held while it was paused, in order."""
        owner.paused = False
        self.holding.discard(owner)
        held, owner.held = owner.held, []
        for callback, args, context, handle in held:
            super().call_soon(_unless_cancelled, handle, callback, *args, context=context)


def _unless_cancelled(handle: asyncio.Handle, callback: Callable[..., object], *args: Any) -> None:
    """Run a held callback unless its handle was cancelled meanwhile, up to its turn (as a
    real loop skips it): a timeout left between the resume and that turn cancels it then,
    and a timer that fired anyway failed ``asyncio.timeout``'s own assertion."""
    if not handle.cancelled():
        callback(*args)


def _gate(
    loop: VirtualLoop, callback: Callable[..., object], context: contextvars.Context
) -> Callable[..., object]:
    owner = context.get(OWNER)
    if owner is None:
        return callback

    def gated(*args: Any) -> object:
        if loop.ending:
            return callback(*args)
        if owner.dead:
            _close_unstarted(callback)
            return None
        if owner.paused:
            owner.held.append((callback, args, context, gated.handle))  # type: ignore[attr-defined]
            loop.holding.add(owner)
            return None
        return callback(*args)

    return gated


def _close_unstarted(callback: Callable[..., object]) -> None:
    """A dead owner's task that never took its first step (spawned as its process died)
    never will: close its coroutine, which Python would otherwise call never awaited."""
    task = getattr(callback, "__self__", None)
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    if inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
        coro.close()


def run(main: Callable[[VirtualLoop], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``main(loop)`` on a new virtual loop, with ``time.monotonic`` on its clock.

    The collection at the end finalizes what the run left, the loop included (its
    coroutines warn then, here, not in a later test). The heap from before the run is
    frozen meanwhile, so the collection costs what the run made, not what the process
    holds: with torch imported, a full collection per seed made 300 seeds take 75 s of
    CPU instead of 13."""
    gc.freeze()
    try:
        with _dead_coroutines_quiet():
            try:
                return _run(main)
            finally:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # coroutines never started
                    gc.collect()  # nothing of the run is referenced any more: all of it goes
    finally:
        gc.unfreeze()


IGNORED_EXIT = "coroutine ignored GeneratorExit"


@contextlib.contextmanager
def _dead_coroutines_quiet() -> Iterator[None]:
    """A dead owner's coroutines, suspended in a ``finally`` that awaits (a cleanup, say
    :func:`agentd.support.aio.first_done`'s), are closed by the garbage collector, and
    awaiting again there is what Python reports as unraisable (:data:`IGNORED_EXIT`). A
    killed process's work is lost, and a real loop never closes coroutines that way: that
    report is dropped; any other goes on to the hook before."""
    before = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        value = unraisable.exc_value
        if not (isinstance(value, RuntimeError) and str(value) == IGNORED_EXIT):
            before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before


def _run(main: Callable[[VirtualLoop], Coroutine[Any, Any, Any]]) -> Any:
    loop = VirtualLoop()
    loop.set_exception_handler(_quiet_about_the_dead)
    try:
        with mock.patch("time.monotonic", loop.time):
            try:
                return loop.run_until_complete(main(loop))
            except RuntimeError:  # the loop stopped before main was done: what stopped it
                if loop.interrupted is None:
                    raise
                raise loop.interrupted from None
    finally:
        loop.ending = True
        for owner in list(loop.holding):
            loop.resume(owner)
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        with mock.patch("time.monotonic", loop.time), contextlib.suppress(Stuck):
            if tasks:  # a dead owner's task never ends: wait a virtual minute at most
                loop.run_until_complete(asyncio.wait(tasks, timeout=60))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for task in asyncio.all_tasks(loop):  # a dead owner's: it never ran again
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                with contextlib.suppress(BaseException):  # its finally blocks run now
                    task.get_coro().close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # coroutines it never started
            loop.close()


def _quiet_about_the_dead(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A dead owner's tasks are destroyed pending, as a killed process's work is lost."""
    if not str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
        loop.default_exception_handler(context)


def spawn(owner: Owner, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """Start ``coro`` as a task of ``owner``."""
    context = contextvars.copy_context()
    context.run(OWNER.set, owner)
    return asyncio.get_running_loop().create_task(coro, name=name, context=context)


def answer_lost(task: asyncio.Task[Any]) -> None:
    """A request whose caller stopped waiting (cut off, or the store restarted or died
    under it): its answer, an error too, is lost on the network, not raised in nobody's
    hands."""
    if not task.cancelled():
        task.exception()
