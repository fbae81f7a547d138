"""The spares the agent holds: children its zygote forked ahead, each leading its own
process group and waiting for a worker's request on a channel of its own.

A spare is handed to the agent with its pidfd and the agent's end of its channel; a
request written there makes it that worker, with no fork and no round trip through the
zygote. Its pid is known before the request leaves. A spare that exited (the zygote
reports it, and its pidfd says so sooner) is passed over; closing a spare's channel
gives it up: it exits, having run nothing.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

Send = Callable[[socket.socket, dict[str, Any], Sequence[int]], Awaitable[None]]
"""How a message goes out on a non-blocking channel (waiting while it is full)."""


@dataclass
class Spare:
    """One spare: its pid, its pidfd, the agent's end of its channel and its slot (the
    local rank it stands for first; with CUDA, the one whose device it made ready)."""

    pid: int
    pidfd: int
    channel: socket.socket
    slot: int = -1

    def close(self) -> None:
        os.close(self.pidfd)
        self.channel.close()


class Spares:
    """The spares held, oldest (the next one taken) first."""

    def __init__(self) -> None:
        self._held: list[Spare] = []

    @property
    def pids(self) -> list[int]:
        return [spare.pid for spare in self._held]

    def add(self, pid: int, pidfd: int, channel_fd: int, slot: int = -1) -> None:
        """Hold a spare the zygote handed over (the descriptors are ours now)."""
        channel = socket.socket(fileno=channel_fd)
        channel.setblocking(False)
        self._held.append(Spare(pid, pidfd, channel, slot))

    def drop(self, pid: int) -> bool:
        """Forget the spare ``pid`` (it exited); False when it is none we hold."""
        for spare in self._held:
            if spare.pid == pid:
                self._held.remove(spare)
                spare.close()
                return True
        return False

    def close(self) -> None:
        """Give every spare up: each one exits as its channel closes."""
        for spare in self._held:
            spare.close()
        self._held.clear()

    async def take(
        self,
        message: dict[str, Any],
        fds: Sequence[int],
        send: Send,
        slot: int = -1,
        only: bool = False,
    ) -> tuple[int, int] | None:
        """Write the request to the live spare of ``slot``, else (unless ``only``) to the
        oldest live one: ``(pid, pidfd)`` of the worker it is now (its channel closed),
        or None when no spare could take it."""
        while True:
            mine = [spare for spare in self._held if spare.slot == slot]
            if mine:
                spare = mine[0]
            elif only or not self._held:
                return None
            else:
                spare = self._held[0]
            self._held.remove(spare)
            if _exited(spare.pidfd):  # the zygote's report of it is on its way
                spare.close()
                continue
            try:
                await send(spare.channel, message, fds)
            except OSError:  # it died since
                spare.close()
                continue
            spare.channel.close()
            return spare.pid, spare.pidfd


def _exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` exited (a pidfd reads ready then)."""
    with contextlib.suppress(OSError):
        return bool(select.select([pidfd], [], [], 0)[0])
    return True
