"""The boundary between torch's synchronous API and agentd's one event loop.

torch's elastic API is synchronous: ``agent.run()`` blocks, ``server.start()`` returns at
once with the server on a daemon thread, a subclass overrides ``_start_workers`` with a
plain method. agentd's core is async. This module joins the two:

- :func:`run_blocking` runs a coroutine to completion on a new loop, and refuses (with the
  async twin's name) when called from inside a running loop, where it would deadlock.
- :class:`BackgroundLoop` is an event loop on a daemon thread, for servers started
  synchronously (the timer and health servers), as torch's run on daemon threads.
- :func:`agent_step` marks an async method of the agent template that a subclass may
  override with a plain method. :func:`call_step` runs the method bound on the instance:
  an agentd or ``async def`` step on the loop, a plain override in a worker thread, so a
  blocking override does not stall the loop. Inside such a thread, calling an
  :func:`agent_step` method (``super()._start_workers(group)``) runs it on the loop and
  returns its result, as torch's synchronous method would; called from plain code with no
  loop running (``agent._rendezvous(group)``, as torch's tests do), it runs to completion
  on a loop of its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")
_in_step = threading.local()


def run_blocking(main: Coroutine[Any, Any, _T], twin: str) -> _T:
    """Run ``main`` on a new event loop until it completes; ``twin`` names the async way
    for callers already on a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main)
    main.close()
    raise RuntimeError(
        f"this call blocks until it is done and cannot run inside a running event loop; "
        f"use `await {twin}` there"
    )


class BackgroundLoop:
    """An event loop running on a daemon thread until :meth:`close`."""

    def __init__(self, name: str, daemon: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=daemon)
        self._thread.start()

    def call(self, func: Callable[_P, Awaitable[_T]], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``func(*args)`` on the loop and wait for its result."""

        async def main() -> _T:
            return await func(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(main(), self.loop).result()

    def close(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not threading.current_thread():
            self._thread.join()
        self.loop.close()


def agent_step(
    method: Callable[..., Coroutine[Any, Any, _T]],
) -> Callable[..., Any]:
    """Mark an async template step (see the module docstring)."""

    @functools.wraps(method)
    def step(*args: Any, **kwargs: Any) -> Any:
        if getattr(_in_step, "active", False):  # a plain override calling up: block on it
            import anyio.from_thread

            return anyio.from_thread.run(functools.partial(method, *args, **kwargs))
        if not _loop_running():  # torch's synchronous call, from plain code
            return run_blocking(method(*args, **kwargs), f"agent.{method.__name__}(...)")
        return method(*args, **kwargs)

    step.__agentd_step__ = True  # type: ignore[attr-defined]
    return step


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def is_agentd_step(bound: Callable[..., Any]) -> bool:
    """True for an :func:`agent_step` method (agentd's own implementation)."""
    return getattr(bound, "__agentd_step__", False) is True  # a Mock's attribute is not


async def call_step(bound: Callable[..., Any], *args: Any) -> Any:
    """Run one template step: agentd's and ``async def`` ones on the loop, plain ones in a
    worker thread (abandoned, not waited for, if the agent is cancelled meanwhile)."""
    if is_agentd_step(bound) or inspect.iscoroutinefunction(bound):
        return await bound(*args)

    def in_thread() -> Any:
        _in_step.active = True
        try:
            return bound(*args)
        finally:
            _in_step.active = False

    import anyio.to_thread  # only for a subclass's plain (torch-style) override

    result = await anyio.to_thread.run_sync(in_thread, abandon_on_cancel=True)
    if inspect.isawaitable(result):
        return await result
    return result


class StartedInBackground:
    """``start()``/``stop()`` as torch's servers have them, for a server whose work is
    ``start_async()``/``stop_async()`` on an event loop: started synchronously, it runs on
    a :class:`BackgroundLoop` (a daemon thread unless ``daemon`` is False) until stopped.
    Code on a loop awaits the async twins instead and keeps the server on its own loop."""

    daemon: bool = True
    _background: BackgroundLoop | None = None

    async def start_async(self) -> None:
        raise NotImplementedError

    async def stop_async(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Start serving on a background thread; returns once serving (idempotent)."""
        if self._background is not None:
            return
        background = BackgroundLoop(type(self).__name__, daemon=self.daemon)
        try:
            background.call(self.start_async)
        except BaseException:
            background.close()
            raise
        self._background = background

    def stop(self) -> None:
        """Stop a server that :meth:`start` started (idempotent)."""
        background, self._background = self._background, None
        if background is not None:
            try:
                background.call(self.stop_async)
            finally:
                background.close()
