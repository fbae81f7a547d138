"""asyncio's private parts: the child watcher the policy holds, on Python 3.11 (3.12
watches children through pidfds by itself and deprecates watchers)."""

from __future__ import annotations

import asyncio


def has_pidfd_watcher(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the policy's child watcher is a pidfd watcher attached to ``loop``
    (``policy._watcher`` and the watcher's ``_loop``: asyncio has no public way to ask
    without creating a watcher)."""
    current = getattr(asyncio.get_event_loop_policy(), "_watcher", None)
    return (
        isinstance(current, asyncio.PidfdChildWatcher) and getattr(current, "_loop", None) is loop
    )
