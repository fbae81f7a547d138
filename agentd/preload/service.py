"""The preload service: the zygote that forks the workers when ``spec.preload`` is set.

A zygote with modules to preload starts with the agent, before the first rendezvous, so
the interpreter and the preloaded imports overlap with the wait for peers, and every
attempt forks its workers from it. A bare zygote (``spec.preload`` empty: nothing to
preload) cannot beat a spawn at the launch, only at restarts: the first attempt's workers
are spawned, the zygote starts once they run (where the job may restart at all), and
every later attempt forks from it.

A zygote that dies is replaced at once (with a warning), so the next attempt is warm
again; so is one that does not answer (:mod:`agentd.preload.liveness`: killed first),
and what it was asked is asked of its successor. A preload that cannot work (a module
fails to import, CUDA initialized at import) is a configuration error: the attempt fails
with it, never falling back to spawn. A preload that read a variable each worker sets
for itself at import (the zygote reports it with its ``ready``:
:mod:`agentd.preload.import_state`) is not: ``--preload auto`` spawns the workers
instead, with a warning; a ``--preload`` given is warned about and kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from agentd.exceptions import StartError
from agentd.workers.env import common_env
from agentd.workers.plan import worker_command

if TYPE_CHECKING:
    from agentd.hygiene.service import ProcessHygiene
    from agentd.preload.client import Zygote
    from agentd.preload.forked import ZygoteWorker
    from agentd.spec import WorkerSpec

log = logging.getLogger(__name__)


class PreloadService:
    """Keeps one zygote for ``spec``'s workers while the agent runs; with
    ``spec.preload`` None it does nothing and :attr:`enabled` is False."""

    def __init__(self, spec: WorkerSpec, hygiene: ProcessHygiene, spares: int = 0) -> None:
        self._spec = spec
        self._hygiene = hygiene
        self._spares = spares
        """Standby workers the zygote keeps forked ahead (by default one attempt's,
        where the group may restart): a restart then forks nothing."""
        self.enabled = spec.preload is not None
        self.zygote: Zygote | None = None
        self.zygotes_started = 0
        self._replacing: asyncio.Task[None] | None = None
        self._judged: Zygote | None = None
        """The zygote whose preload's reads of the workers' variables were judged."""
        self._longest_preload = 0.0

    @property
    def forks(self) -> bool:
        """Whether the next attempt's workers are forked (a bare zygote's, once it started
        with the first attempt: see :meth:`first_started`)."""
        return self.enabled and (bool(self._spec.preload) or self.zygotes_started > 0)

    @property
    def preload_seconds(self) -> float:
        """The longest a zygote of this agent took to preload (0.0: none is ready yet):
        how much later than this node a node that joined just now may start its workers."""
        zygote = self.zygote
        if zygote is not None and zygote.ready_info:
            seconds = zygote.ready_info.get("seconds", 0.0)
            if isinstance(seconds, (int, float)):
                self._longest_preload = max(self._longest_preload, float(seconds))
        return self._longest_preload

    async def start(self) -> None:
        if self.enabled and self._spec.preload:  # a command a zygote cannot run is a
            await self._start_zygote()  # ConfigError before it starts

    def first_started(self, may_restart: bool) -> None:
        """The first attempt's workers run: a bare zygote starts now, in the background,
        for the attempts after it, if there may be any (``may_restart``: restarts are
        allowed, or a change of membership starts new workers)."""
        if self.enabled and may_restart and not self.zygotes_started and not self._replacing:
            self._replacing = asyncio.ensure_future(self._replace())

    async def stop(self) -> None:
        self.enabled = False
        replacing = self._replacing
        if replacing is not None:  # a zygote cancelled as it starts is killed: wait for it
            replacing.cancel()
            await asyncio.gather(replacing, return_exceptions=True)
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            await zygote.stop()
            self._hygiene.disown(zygote.pid)

    def status(self) -> dict[str, Any] | None:
        """For ``/status``: the modules, the zygote's pid, whether it is up, how many ran,
        and its standby workers (how many it keeps, the ones held now, CUDA or not)."""
        if self._spec.preload is None:
            return None
        zygote = self.zygote
        return {
            "modules": list(self._spec.preload),
            "zygote_pid": zygote.pid if zygote is not None else None,
            "ready": bool(zygote is not None and zygote.alive and zygote.ready_info),
            "zygotes_started": self.zygotes_started,
            "preload_seconds": round(self.preload_seconds, 3),
            "standby_workers": self._spares,
            "standby_pids": zygote.spare_pids if zygote is not None else [],
            "standby_cuda": self._spec.standby_cuda,
        }

    async def ready(self) -> None:
        """Wait until a worker can be forked at once: a live zygote whose preload is done
        (ConfigError or StartError when it cannot be). Where ``auto``'s preload read a
        variable of a worker's own, the zygote is stopped instead and :attr:`forks` is
        False from then on: ask it again after this."""
        zygote, info = await self._ready_zygote()
        if info.get("worker_reads") and zygote is not self._judged:
            from agentd.preload.import_state import varying

            self._judged = zygote
            reads = varying(info["worker_reads"], self._spec.virtual_local_rank)
            if reads:
                await self._read_at_import(zygote, reads)

    async def _ready_zygote(self) -> tuple[Zygote, dict[str, Any]]:
        """A live zygote, and its preload's report; one that does not answer is replaced
        once (:meth:`_discard`)."""
        for last_try in (False, True):
            if self._replacing is not None:
                await asyncio.shield(self._replacing)
            if self.zygote is None or not self.zygote.alive:
                await self._start_zygote()
            zygote = self.zygote
            assert zygote is not None
            try:
                return zygote, await zygote.ready()
            except StartError as exc:
                if zygote.answering or last_try:
                    raise
                self._discard(zygote, exc)
        raise AssertionError("a second try returns or raises")

    async def _read_at_import(self, zygote: Zygote, reads: dict[str, list[str]]) -> None:
        """The preload read variables each worker sets for itself: under ``auto``, the
        workers are spawned from now on (the zygote stops); an explicit ``--preload`` is
        kept, with a warning."""
        what = "; ".join(
            f"importing {name} read {', '.join(names)}" for name, names in reads.items()
        )
        role, pid = self._spec.role, zygote.pid
        if self._spec.preload_is_auto:
            log.warning(
                "[%s] Zygote pid %s: %s, which each worker sets for itself; spawning the "
                "workers instead (auto), so that each import reads its own",
                role,
                pid,
                what,
            )
            await self.stop()
            return
        log.warning(
            "[%s] Zygote pid %s: %s, which each worker sets for itself; a forked worker "
            "keeps what that import made of the zygote's environment (--preload given: "
            "forking anyway)",
            role,
            pid,
            what,
        )

    async def spawn(self, local_rank: int, *launch: Any) -> ZygoteWorker:
        """Fork one worker; ``launch`` is the rest of
        :func:`~agentd.workers.processes.spawn_worker`'s arguments (argv, env, stdout and
        stderr routes, cwd, pass_fds)."""
        await self.ready()
        zygote = self.zygote
        assert zygote is not None
        try:
            return await zygote.fork(local_rank, *launch)
        except StartError as exc:
            if zygote.answering:  # it died, or refused: the attempt fails with it
                raise
            self._discard(zygote, exc)
        await self.ready()
        assert self.zygote is not None
        return await self.zygote.fork(local_rank, *launch)

    def _discard(self, zygote: Zygote, why: StartError) -> None:
        """Replace ``zygote``, which does not answer (once, however many waited on it)."""
        if zygote is not self.zygote:
            return
        log.warning(
            "[%s] Zygote pid %s %s; killing it and starting a new one",
            self._spec.role,
            zygote.pid,
            why,
        )
        self.zygote = None
        self._replacing = asyncio.ensure_future(self._replace(instead_of=zygote))

    async def _start_zygote(self) -> None:
        from agentd.preload import command  # only a job that asked for --preload loads these
        from agentd.preload.client import Zygote

        spec = self._spec
        zygote = Zygote(
            command.parse(worker_command(spec)),
            spec.preload or (),
            common_env(spec),
            on_lost=self._lost,
            spares=self._spares,
            cuda=spec.standby_cuda,
        )
        with self._hygiene.spawning():  # the zygote's exit status is its watcher's
            await zygote.start(os.getcwd())
            self._hygiene.own(zygote.pid)
        self.zygote = zygote
        self.zygotes_started += 1
        asyncio.ensure_future(self._announce(zygote)).add_done_callback(
            lambda t: t.cancelled() or t.exception()
        )

    async def _announce(self, zygote: Zygote) -> None:
        """Log the zygote's preload once it is done (a failure is the first attempt's)."""
        info = await zygote.ready()
        names = info.get("names") or {}
        modules = ", ".join(
            f"{m} ({', '.join(names[m])})" if names.get(m) else m for m in info.get("modules", [])
        )
        modules = modules or "nothing"
        log.info(
            "[%s] Zygote pid %s ready: preloaded %s in %.2fs",
            self._spec.role,
            zygote.pid,
            modules,
            info.get("seconds", 0.0),
        )
        threads = info.get("threads") or []
        if threads:
            log.info(
                "[%s] Zygote pid %s has %d other thread(s) at fork time (not copied to "
                "the workers): %s",
                self._spec.role,
                zygote.pid,
                len(threads),
                ", ".join(map(str, threads)),
            )

    def _lost(self, zygote: Zygote, code: int | None) -> None:
        self._hygiene.disown(zygote.pid)
        if not self.enabled or zygote is not self.zygote:
            return
        log.warning(
            "[%s] Zygote pid %s died (exit status %s); starting a new one",
            self._spec.role,
            zygote.pid,
            code,
        )
        self._replacing = asyncio.ensure_future(self._replace())

    async def _replace(self, instead_of: Zygote | None = None) -> None:
        try:
            if instead_of is not None:  # one that does not answer: gone before its successor
                await instead_of.kill()
                self._hygiene.disown(instead_of.pid)
            await self._start_zygote()
        except StartError as exc:
            log.error("[%s] %s", self._spec.role, exc)
        finally:
            self._replacing = None
