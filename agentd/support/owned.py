"""Helper processes the agent runs and waits for itself (py-spy, node checks,
nvidia-smi): the agent reaps every child it does not own on SIGCHLD, so a helper is
started inside its owner's ``spawning()`` and owned until it has exited (the owner is
the process hygiene: :class:`agentd.view.Helpers`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from agentd.view import Helpers


@contextlib.asynccontextmanager
async def owned(
    owner: Helpers | None, start: Awaitable[asyncio.subprocess.Process]
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The process ``start`` (an un-awaited ``asyncio.create_subprocess_*``) makes, owned
    by ``owner`` from its spawn; disowned on leaving the block once it has exited (wait
    for it inside). With no owner (no hygiene runs), just the process."""
    with owner.spawning() if owner is not None else contextlib.nullcontext():
        proc = await start
        if owner is not None:
            owner.own(proc.pid)
    try:
        yield proc
    finally:
        if owner is not None and proc.returncode is not None:
            owner.disown(proc.pid)
