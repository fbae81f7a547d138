"""Process hygiene: no worker, and no child of a worker, outlives the agent or its lease.

The agent becomes a child subreaper and reaps orphans on SIGCHLD; at start it kills the
workers an earlier, dead agent of the same run left behind. A guardian process learns every
worker's process group, kills them if the agent dies, and kills them when the agent's
membership lease runs out while the agent cannot act (frozen). It starts with the first
lease, so it runs and holds the lease before any worker can (an agent frozen between its
first workers' spawn and a guardian started after them left them running past the lease,
beside the round the others formed over their ranks); without a lease (a standalone job),
after the first workers, so it never delays them. The guardian also removes what a killed
agent leaves in ``/tmp``: its pipe directories, and the token files this process published
(its store's, its health endpoint's). See :mod:`agentd.hygiene.orphans` and
:mod:`agentd.hygiene.guardian_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from agentd.hygiene import orphans
from agentd.hygiene.guardian import Guardian, SecretFiles
from agentd.support.aio import cancel_and_wait

if TYPE_CHECKING:
    from agentd.workers.processes import WorkerProcess

log = logging.getLogger(__name__)


class ProcessHygiene:
    """The hygiene of one agent, whose workers carry ``mark``. With ``enabled`` False
    (the Python API's ``process_hygiene=False``) only the reaper's bookkeeping runs."""

    def __init__(self, mark: str, run_id: str, *, enabled: bool, fresh_run_id: bool) -> None:
        self._mark = mark
        self._run_id = run_id
        self._enabled = enabled
        self._fresh_run_id = fresh_run_id
        self._reaper = orphans.ZombieReaper()
        self._guardian: Guardian | None = None
        self._private_dirs: list[str] = []
        self._secrets = SecretFiles()
        """The secret files this process published: the guardian removes them if killed."""
        self._sigchld = False
        self._lease: float | None = None
        self._will: dict[str, Any] | None = None
        self._guarded: set[int] = set()
        """The process groups of the running workers (a new guardian learns them)."""
        self._replacing: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        """The guardian's start, begun by the first lease."""

    async def start(self) -> None:
        if not self._enabled:
            return
        if not self._fresh_run_id:
            orphans.kill_leftovers(self._run_id)
        self._secrets.follow()
        if not orphans.become_subreaper():
            log.warning("Could not become a child subreaper; orphans re-parent to init")
        if threading.current_thread() is threading.main_thread():
            asyncio.get_running_loop().add_signal_handler(signal.SIGCHLD, self._reaper.reap)
            self._sigchld = True
        else:  # signal handlers are the main thread's: orphans are reaped at each stop
            log.debug("Agent off the main thread: orphans are reaped when workers stop")

    async def stop(self) -> None:
        if self._starting is not None:  # let it finish (milliseconds): it is stopped below
            with contextlib.suppress(OSError):
                await self._starting
            self._starting = None
        if self._replacing is not None:
            await cancel_and_wait(self._replacing)
            self._replacing = None
        self._secrets.stop()  # a clean stop: their owners withdraw them
        if self._guardian is not None:
            await self._guardian.stop()
            self._guardian = None
        if self._sigchld:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGCHLD)
            self._sigchld = False
        if self._enabled:
            self._reaper.reap()

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around a spawn: the new children are not reaped before they are known."""
        with self._reaper.spawning():
            yield

    def adopt(self, procs: Sequence[WorkerProcess]) -> None:
        """Workers were spawned (inside :meth:`spawning`): own them, and guard them (the
        guardian, once it runs, learns of their groups at once). Adopting one twice is
        harmless."""
        for proc in procs:
            self._reaper.own(proc.pid)
            if proc.pgid in self._guarded:
                continue
            self._guarded.add(proc.pgid)
            if self._guardian is not None:
                self._guardian.watch(proc.pgid)

    async def guarding(self) -> None:
        """Return once a guardian runs that holds the lease, while a lease is in force
        (called before workers spawn: one frozen with its agent before then would outlive
        the lease on its ranks); at once without a lease. A guardian that cannot be started
        raises here (OSError), so no worker starts unguarded."""
        starting = self._starting
        if starting is not None:
            try:
                await asyncio.shield(starting)  # a stop request does not cut it short
            except OSError:
                self._starting = None  # the next lease, or the workers' start, tries again
                raise
        if self._replacing is not None and self._lease is not None:
            await asyncio.shield(self._replacing)

    async def started(self, procs: Sequence[WorkerProcess]) -> None:
        """An attempt's workers were spawned: adopt them, and start the guardian with the
        first ones where no lease started it before (it learns every group guarded)."""
        self.adopt(procs)
        await self.guarding()
        if self._enabled and self._guardian is None:
            await self._start_guardian()

    def own(self, pid: int | None) -> None:
        """A helper the agent spawned (inside :meth:`spawning`): its exit status is not the
        reaper's to take."""
        if pid is not None:
            self._reaper.own(pid)

    def disown(self, pid: int | None) -> None:
        """A helper was reaped by its owner."""
        if pid is not None:
            self._reaper.disown(pid)

    def stopped(self, procs: Sequence[WorkerProcess]) -> None:
        """Workers were stopped and reaped: nothing is left to guard."""
        for proc in procs:
            self._reaper.disown(proc.pid)
            self._guarded.discard(proc.pgid)
            if self._guardian is not None:
                self._guardian.unwatch(proc.pgid)
        if self._enabled and not self._sigchld:
            self._reaper.reap()

    def on_lease(self, deadline: float | None) -> None:
        """Our membership lease moved: the guardian kills the workers if it runs out while
        the agent cannot (frozen), so no worker outlives the lease on its ranks."""
        self._lease = deadline
        if self._guardian is not None:  # one that is starting sends the latest once it runs
            self._guardian.set_lease(deadline)
        elif deadline is not None and self._enabled and not (self._starting or self._replacing):
            self._starting = asyncio.ensure_future(self._start_guardian())

    def set_will(self, doc: dict[str, Any] | None) -> None:
        """How the guardian releases our membership if the agent dies (None: it does not)."""
        self._will = doc
        if self._guardian is not None:
            self._guardian.set_will(doc)

    def remove_when_gone(self, path: str) -> None:
        """A private directory of the agent's (its named pipe's) that the guardian removes
        if the agent dies without removing it."""
        self._private_dirs.append(path)
        if self._guardian is not None:
            self._guardian.remove_when_gone(path)

    async def _start_guardian(self) -> None:
        """Start a guardian that knows everything known (groups, lease, will, pipe
        directories, secret files) as it runs: told before its start, it finds it all in its
        pipe; what changes meanwhile follows, in order."""
        guardian = self._guardian = Guardian(self._mark, self._guardian_lost)
        for pgid in self._guarded:  # in its pipe before it runs (see Guardian)
            guardian.watch(pgid)
        if self._lease is not None:
            guardian.set_lease(self._lease)
        if self._will is not None:
            guardian.set_will(self._will)
        for path in self._private_dirs:
            guardian.remove_when_gone(path)
        self._secrets.attach(guardian)
        with self._reaper.spawning():
            try:
                await guardian.start()
            except BaseException:
                self._guardian = None  # none runs: the next start tries again
                self._secrets.attach(None)
                raise
            assert guardian.pid is not None
            self._reaper.own(guardian.pid)

    def _guardian_lost(self, pid: int, code: int) -> None:
        """The guardian died (killed, or out of memory): without one, a killed agent's
        workers would outlive it, a lapsed lease would not be fenced and its membership
        not released. Say so, and start another that learns everything again."""
        self._reaper.disown(pid)
        self._guardian = None
        self._secrets.attach(None)
        log.error(
            "Guardian pid %d died (exit status %d); starting a new one (until it runs, "
            "workers are not killed with a dead agent, nor fenced at the lease's end)",
            pid,
            code,
        )
        self._replacing = asyncio.ensure_future(self._replace_guardian())

    async def _replace_guardian(self) -> None:
        try:
            await self._start_guardian()
        except OSError as exc:
            log.error("Could not start a new guardian: %s", exc)
        else:
            pid = self._guardian.pid if self._guardian is not None else None
            log.info("Guardian pid %s guards %d worker group(s)", pid, len(self._guarded))
        finally:
            self._replacing = None
