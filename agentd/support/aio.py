"""Asyncio patterns the agent's long-lived tasks share, and how its loop watches its
children."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has really finished (its cancellation swallowed)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def close_stream(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` and wait until its connection is gone, whatever went wrong on it
    (a caller cancelled meanwhile gets CancelledError, as at any await).

    The wait is shielded: asyncio's ``StreamWriter.wait_closed()`` awaits a future that the
    connection keeps, and a task cancelled in it cancels that future, so every later close
    of the same stream would raise CancelledError (a request abandoned while it closed
    its connection, then its owner's close: an agent that crashed in its exit barrier)."""
    writer.close()
    await asyncio.shield(_wait_closed(writer))


async def _wait_closed(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):  # a reset or broken connection is closed too
        await writer.wait_closed()


async def first_done(*coros: Coroutine[Any, Any, Any]) -> list[asyncio.Task[Any]]:
    """Run ``coros`` until the first one finishes; the others are cancelled and waited for.

    Returns their tasks in the order given: read the one that is done (not cancelled).
    """
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tasks


async def run_shielded(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile (cleanup that
    survives cancellation); a cancellation that arrived is raised once it is done."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the cleanup itself was cancelled (or raised it)
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result


def use_pidfd_child_watcher() -> None:
    """On Python 3.11, watch children through pidfds (3.12+ does so by itself). Called
    before every child the agent starts through asyncio: a watcher replaced while it
    watches a child warns, and loses that child's exit.

    3.11's default watcher starts a thread per child; a pidfd makes an exit one more event
    on the loop, noticed as soon as it happens.
    """
    if sys.version_info >= (3, 12):
        return
    loop = asyncio.get_running_loop()
    ours = _pidfd_watchers.get(loop)
    if ours is not None and asyncio.get_child_watcher() is ours:
        return  # still the policy's: nothing replaced it since
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(loop)
    asyncio.set_child_watcher(watcher)
    _pidfd_watchers[loop] = watcher


_pidfd_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary()
)
"""The pidfd watcher attached to each loop (Python 3.11), while the loop lives."""
