"""The guardian: kills an agent's workers if the agent dies without stopping them.

Run by the agent as ``python -m agentd.guardian MARK`` in a session of its own. The agent
writes ``+PGID`` / ``-PGID`` lines on the guardian's stdin as worker process groups come
and go. End of input means the agent is gone (exited or killed): the guardian then sends
SIGKILL to every process group still listed and to every process carrying ``MARK`` in
``AGENTD_OWNER`` (children that left their group), and exits. After a clean stop nothing
is listed and nothing is marked, so it simply exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from agentd.orphans import kill_marked

log = logging.getLogger(__name__)


class Guardian:
    """The agent's side: starts the guardian and keeps it told of the worker groups."""

    def __init__(self, mark: str) -> None:
        self._mark = mark
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "AGENTD_OWNER"}
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentd.guardian",
            self._mark,
            stdin=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def unwatch(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        proc = self._process
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return
        try:
            proc.stdin.write(line.encode())
        except (BrokenPipeError, ConnectionResetError):
            log.warning("Guardian %s is gone: workers may outlive a killed agent", proc.pid)

    async def stop(self) -> None:
        """Close the guardian's input (nothing is left to kill) and reap it."""
        proc = self._process
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.wait_closed()
        await proc.wait()
        self._process = None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m agentd.guardian MARK\n")
        return 2
    mark = argv[0]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # only the end of the agent's pipe ends the guardian
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if line[:1] in (b"+", b"-") and line[1:].isdigit():
            pgid = int(line[1:])
            if line[:1] == b"+":
                groups.add(pgid)
            else:
                groups.discard(pgid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    kill_marked(lambda m: m == mark)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
