"""Helper processes the agent runs and waits for itself (py-spy, node checks,
nvidia-smi): the agent reaps every child it does not own on SIGCHLD, so a helper is
started inside its owner's ``spawning()`` and owned until it has exited (the owner is
the process hygiene: :class:`agentd.view.Helpers`); :func:`output_within` reads its
output with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

from agentd.support.aio import use_pidfd_child_watcher

if TYPE_CHECKING:
    from agentd.view import Helpers


@contextlib.asynccontextmanager
async def owned(
    owner: Helpers | None, start: Awaitable[asyncio.subprocess.Process]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The process ``start`` (an un-awaited ``asyncio.create_subprocess_*``) makes, owned
    by ``owner`` from its spawn; disowned on leaving the block once it has exited (wait
    for it inside). With no owner (no hygiene runs), just the process."""
    use_pidfd_child_watcher()
    with owner.spawning() if owner is not None else contextlib.nullcontext():
        proc = await start
        if owner is not None:
            owner.own(proc.pid)
    try:
        yield proc
    finally:
        if owner is not None and proc.returncode is not None:
            owner.disown(proc.pid)


async def output_within(
    proc: asyncio.subprocess.Process, seconds: float
) -> tuple[bytes, bytes] | None:
    """``proc``'s stdout and stderr once it exits, or None when it has not within
    ``seconds`` (it is killed and reaped then)."""
    try:
        async with asyncio.timeout(seconds):
            return await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return None
