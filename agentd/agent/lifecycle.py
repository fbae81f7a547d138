"""The local agent's worker lifecycle: plan each worker (its log routes, environment and
argv), spawn it (or fork it from the zygote, or resume it in process), watch the group
through exit events, and stop it with the one stop policy, the services told at each
step through the protocols of :mod:`agentd.assembly.ports`."""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.agent.local_views import LocalAgentViews
from agentd.agent.restart_steps import RoundOverBeforeStart
from agentd.agent.template import SimpleElasticAgent
from agentd.assembly.services import can_restart
from agentd.group import RunResult, WorkerGroup, WorkerState
from agentd.rendezvous.api import (
    ComparesNodes,
    CoordinatesDrains,
    KeepsWorkers,
    fresh_store_each_attempt,
)
from agentd.support.sync_bridge import agent_step
from agentd.wire import control
from agentd.workers.output import (
    attempt_dir,
    prune_attempts,
    stage_next_attempt,
    take_staged_attempt,
)
from agentd.workers.plan import plan_workers, reified_error_files
from agentd.workers.processes import WorkerProcess, signal_groups, spawn_worker, stop_workers

if TYPE_CHECKING:
    from agentd.assembly.ports import DrainPort, OomPort, SlowNodesPort
    from agentd.assembly.services import AgentHooks, LocalServices
    from agentd.assembly.settings import AgentSettings
    from agentd.view import Service
    from agentd.workers.logs_specs import LogsSpecs
    from agentd.workers.release_gate import ReleaseGate

log = logging.getLogger(__name__)

_TAIL_WAIT = 0.5
_CAUSE_WAIT = 0.02


class WorkerLifecycle(LocalAgentViews, SimpleElasticAgent):
    """The steps of :class:`~agentd.agent.template.SimpleElasticAgent` for local
    processes; :class:`~agentd.agent.local.LocalElasticAgent` builds what they use."""

    _settings: AgentSettings
    _services: LocalServices
    _hooks: AgentHooks
    _gate: ReleaseGate | None
    _drain: DrainPort | None
    _drain_attempt: int
    """The attempt the drain's service follows."""
    _slow_nodes: SlowNodesPort | None
    _oom: OomPort | None
    _running: list[Service]
    run_id: str
    run_dir: Path
    started_at: float
    run_over: bool
    control_file: str | None
    logs_specs: LogsSpecs | None
    error_files: dict[int, str]
    """Each worker's error file in the current attempt where the user's log specs chose
    it, by local rank (empty: agentd's layout's)."""

    @abc.abstractmethod
    def worker_readings(self) -> list[dict[str, Any]]:
        """Each worker's readings, for ``/status`` (the local agent's)."""

    @abc.abstractmethod
    def request_drain(self, reason: str, signum: int | None = None, replaced: bool = False) -> None:
        """Drain this node (the local agent's; ``replaced``: a spare takes its place)."""

    def _logs_at(self) -> str:
        """Where this attempt's worker logs are, for the start line."""
        if self.error_files:  # the user's log specs chose
            return f"the places {type(self.logs_specs).__name__}.reify chose"
        return str(self.run_dir / f"attempt_{self.attempt}")

    @agent_step
    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        group, preload, hygiene = worker_group, self._services.preload, self._services.hygiene
        # The round's workers' store serves from now on: the other nodes' workers may wait
        # in it before ours start (refused, torch's client retries in native code, where a
        # park cannot reach it), and it closes as soon as the round ends.
        await self._services.workers_store.open_for(group)
        closer = asyncio.create_task(self._close_store_as_the_round_ends())
        try:  # the stopped workers' GPU memory, waited for since their stop; the preload,
            # which can take seconds: a stop signal waits for neither, and a round over
            # meanwhile starts no worker
            await self._unless_stopped(self._services.gpus.settled())
            if preload.forks:
                await self._unless_stopped(preload.ready())
            await self._unless_stopped(hygiene.guarding())  # a lease's guardian runs first
        finally:
            closer.cancel()
        if self._round_ended is not None:
            await self._services.workers_store.close()
            raise RoundOverBeforeStart(self._round_ended)
        self.attempt += 1
        staged = take_staged_attempt(self.run_dir, self.attempt)
        prune_attempts(self.run_dir, self.attempt, self._settings.keep_attempts)
        spec = group.spec
        if isinstance(self.rdzv_handler, CoordinatesDrains):
            self.control_file = self._new_control_file()
        dropped = self._services.inprocess.unresumable()  # kept, but their channel closed since
        if dropped:
            await self._stop_dropped(dropped)
        plans = plan_workers(self, group, staged)
        self.error_files = reified_error_files(self, plans)
        if isinstance(spec.entrypoint, str):
            handler, peer_loss, stale = self.rdzv_handler, 0.0, False
            if isinstance(handler, KeepsWorkers):  # kept workers that missed a round
                stale = handler.sat_out()
                if (group.group_world_size or 1) > 1:  # a lost node takes that long to see
                    peer_loss = handler.peer_loss_timeout()
            inprocess = self._services.inprocess
            inprocess.plan(plans, self.kept_ranks, peer_loss, self.generation, stale)
        else:  # function workers leave together
            from agentd.workers.release_gate import RELEASE_FDS_ENV, ReleaseGate

            self._gate = ReleaseGate(len(plans))
            for _, _, env, *_, pass_fds in plans:
                env[RELEASE_FDS_ENV] = self._gate.env_value
                pass_fds.extend(self._gate.worker_fds)
        kept = self._services.inprocess.parked
        spawn = preload.spawn if preload.forks else spawn_worker  # auto may have chosen a spawn

        async def start(local_rank: int, plan: tuple[Any, ...]) -> WorkerProcess:
            proc = await spawn(local_rank, *plan)
            self._procs[local_rank] = proc  # known, so what it sends is trusted
            hygiene.adopt([proc])  # and guarded: it may run the user's code now
            proc.release()
            return proc

        with hygiene.spawning():
            todo = [(w.local_rank, tuple(plan)) for w, *plan in plans if w.local_rank not in kept]
            procs = await asyncio.gather(*(start(*one) for one in todo), return_exceptions=True)
            started = [p for p in procs if isinstance(p, WorkerProcess)]
            self._services.inprocess.spawned(p.local_rank for p in started)
            await hygiene.started(started)
        resumed = self._services.inprocess.resume_all(plans)
        started += resumed
        if self._oom is None:
            from agentd.assembly.services import oom_watch

            self._oom = oom_watch()
        self._oom.arm()  # after the spawns: the first worker need not wait for it
        if self.attempt == 0:
            self._after_first_start()
        if self._gate is not None:
            self._gate.spawned()
        resumed_ranks = {p.local_rank for p in resumed}
        self._services.heartbeats.started(group, started, resumed_ranks, preload.preload_seconds)
        if self._services.node_checks is not None:
            self._services.node_checks.workers_started()
        self._start_drains(group)
        self._start_slow_nodes()
        errors = [p for p in procs if isinstance(p, BaseException)]
        self._procs = {p.local_rank: p for p in started}
        for proc in started:
            proc.exited.add_done_callback(lambda _f: self._wakeup.set())
        if errors:
            await self._stop_workers(group)
            raise errors[0]
        log.info(
            "[%s] Started %d worker(s), attempt %d, pids %s, logs in %s",
            spec.role,
            len(started),
            self.attempt,
            [p.pid for p in started],
            self._logs_at(),
        )
        if can_restart(self):  # the next attempt's directories, off its path
            stage_next_attempt(self.run_dir, (w.local_rank for w in group.workers))
        return {p.local_rank: p.pid for p in started}

    async def _close_store_as_the_round_ends(self) -> None:
        """While the start waits, a round that ends closes its workers' store at once: the
        other nodes' ranks waiting in it fail and park, not wait for this node's zygote."""
        if self._round_watch is not None:
            await asyncio.shield(self._round_watch)
            await self._services.workers_store.close()

    def _new_control_file(self) -> str | None:
        """This attempt's drain control file: the last attempt's again (its kept workers
        map it), else ``drain.control`` in the run directory, else (a full or read-only log
        disk) in the agent's private runtime directory, the watchdog pipe's. None where
        none can be made: the attempt runs all the same, and a drain of it stops its
        workers without asking them to checkpoint first."""
        places = [str(self.run_dir / control.NAME)]
        if self._services.watchdog.pipe_dir:
            places.append(os.path.join(self._services.watchdog.pipe_dir, control.NAME))
        return control.create_for_attempt(places, self.control_file, self.attempt)

    async def _stop_dropped(self, procs: list[WorkerProcess]) -> None:
        """Stop kept workers that can no longer be resumed; their ranks start anew."""
        pids = await self._services.gpus.watched(p.pid for p in procs)
        spared = {p.pgid for p in self._services.inprocess.parked.values()}  # kept: not strays
        signum = self._worker_group.spec.stop_signal
        await stop_workers(procs, signum, self._stop_timeout(), self._force, self._mark, spared)
        self._services.hygiene.stopped(procs)
        self._services.watchdog.forget(p.pid for p in procs)
        self._services.inprocess.forget(p.local_rank for p in procs)
        self._services.gpus.stopped(pids)

    def _after_first_start(self) -> None:
        """Once the first workers are spawned: sweep dead agents' pipe directories, start a
        bare zygote, and, where the group can restart, load what a failure needs, so
        neither the launch nor the first restart waits for it."""
        self._services.watchdog.sweep_stale_pipes()
        self._services.gpus.look()
        may_restart = can_restart(self)
        self._services.preload.first_started(may_restart)
        if may_restart:  # a failure's report needs it, and a restart should not wait
            import agentd.errors.error_file  # noqa: F401

    def _start_drains(self, group: WorkerGroup) -> None:
        """Follow drains from this attempt's start, once a peer could ask for one; a node
        alone in its round builds the drain's service when it drains (:meth:`_drain_now`)."""
        if self._drain is None and (group.group_world_size or 1) < 2:
            return
        self._drain_now()

    def _drain_now(self) -> DrainPort | None:
        """The drain's service, following the current attempt (None: the rendezvous
        carries no drains, or no workers started yet)."""
        handler = self.rdzv_handler
        if self.control_file is None or not isinstance(handler, CoordinatesDrains):
            return None
        if self._drain is None:
            from agentd.assembly.services import drain_service

            self._drain = drain_service(
                self._settings.drain, handler.drains(), self._hooks, self._services.heartbeats
            )
            self._running.append(self._drain)  # stopped with the other services
        if self._drain_attempt != self.attempt:
            self._drain_attempt = self.attempt
            self._drain.attempt(self.control_file)
            self._drain.workers_started()
        return self._drain

    def _start_slow_nodes(self) -> None:
        handler, settings = self.rdzv_handler, self._settings.slow_nodes
        if not isinstance(handler, ComparesNodes) or (settings and settings.interval <= 0):
            return
        if self._slow_nodes is None:
            from agentd.assembly.services import slow_node_service

            heartbeats = self._services.heartbeats
            self._slow_nodes = slow_node_service(settings, handler, heartbeats, self._hooks)
            self._running.append(self._slow_nodes)  # stopped with the other services
        self._slow_nodes.workers_started()

    @agent_step
    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        await self._wakeup.wait()
        self._wakeup.clear()
        return await self._check_workers(worker_group)

    async def _check_workers(self, group: WorkerGroup) -> RunResult:
        procs = self._procs
        self._services.watchdog.forget(p.pid for p in procs.values() if p.returncode is not None)
        if self._services.watchdog.unhealthy:
            return self._unhealthy_result(group)
        failed = [p for p in procs.values() if p.returncode not in (None, 0)]
        if (
            not failed and self._services.inprocess.raised()
        ):  # the cause may be a peer's exit: see it
            await self._services.inprocess.see_exits(procs.values(), _CAUSE_WAIT)
            failed = [p for p in procs.values() if p.returncode not in (None, 0)]
        raised = {r: e for r, e in self._services.inprocess.raised().items() if r in procs}
        if failed or raised:
            if failed:
                await asyncio.wait([p.pipes_closed for p in failed], timeout=_TAIL_WAIT)
            failures = self._failures(group, failed, raised)
            self._failed_ranks = {p.local_rank for p in failed}
            return RunResult(WorkerState.FAILED, failures=failures)
        if procs and all(p.returncode == 0 for p in procs.values()):
            values: dict[int, Any] = {}
            if not isinstance(group.spec.entrypoint, str):
                from agentd.workers.function import read_result

                for worker in group.workers:
                    wdir = attempt_dir(self.run_dir, self.attempt, worker.local_rank)
                    values[worker.global_rank] = read_result(wdir / "return.pickle")
            return RunResult(WorkerState.SUCCEEDED, return_values=values)
        return RunResult(WorkerState.HEALTHY)

    def _kill_hung(
        self, role: str, procs: list[WorkerProcess], reports: list[Any], when: str
    ) -> None:
        """SIGKILL the workers that hang ``reports`` found hung (their failure says SIGKILL
        already): first thing in a stop, and as the detection finds one during a park. A
        hung rank holds its connections open, so a peer waiting in a collective with it
        neither fails nor parks, and it may run no SIGTERM handler (stopped, or blocked in
        native code). Killed, its peers' collectives fail at once, and an in-process
        restart keeps them. A rank that parked is silent by design, never killed; a worker
        reaped by its expiration timer got the signal its timer asked for."""
        found = {u.pid for u in reports if u.details is not None}
        parked = self._services.inprocess.has_parked
        hung = [
            p for p in procs if p.pid in found and p.returncode is None and not parked(p.local_rank)
        ]
        if hung:
            log.info(
                "[%s] Killing the hung local rank(s) %s (SIGKILL) %s",
                role,
                sorted(p.local_rank for p in hung),
                when,
            )
            signal_groups([p.pgid for p in hung], signal.SIGKILL)

    @agent_step
    async def _stop_workers(self, worker_group: WorkerGroup) -> None:
        group = worker_group
        procs = list(self._procs.values())
        if not procs:
            return
        spec, watchdog = group.spec, self._services.watchdog
        self._kill_hung(spec.role, procs, watchdog.unhealthy, "before the others stop")
        fresh_store = fresh_store_each_attempt(self.rdzv_handler, group.spec.master_addr)
        # The attempt is over on every node: its store closes once the survivors were asked
        # to park, so that a rank blocked in it (an init waiting for a rank that is gone,
        # here or on another node) fails, and parks, where it would wait out its timeout.
        found_now = "while the others park"
        with watchdog.reports_to(lambda u: self._kill_hung(spec.role, procs, [u], found_now)):
            kept = await self._services.inprocess.park(
                procs,
                self._failed_ranks,
                fresh_store,
                asked=self._services.workers_store.close,
                where=self._services.heartbeats.where,  # a rank that did not park: its stack
            )
        await self._services.workers_store.close()  # where nothing here was asked to park
        self._failed_ranks = set()  # the next stop may be a membership change: none failed
        procs = [p for p in procs if p.local_rank not in kept]
        running = sum(p.returncode is None for p in procs)
        level = logging.INFO if running else logging.DEBUG
        log.log(
            level,
            "[%s] Stopping %d running worker(s) with %s",
            spec.role,
            running,
            spec.stop_signal.name,
        )
        await self._services.heartbeats.stopped()
        if self._slow_nodes is not None:
            await self._slow_nodes.workers_stopping()
        if self._services.node_checks is not None:
            await self._services.node_checks.workers_stopping()
        strays: list[int] = []
        gpu_pids = await self._services.gpus.watched(p.pid for p in procs)
        try:
            strays = await stop_workers(
                procs,
                spec.stop_signal,
                self._stop_timeout(),
                self._force,
                self._mark,
                spare_groups={p.pgid for p in kept.values()},
            )
        finally:
            if strays:
                log.warning(
                    "[%s] Killed %d process(es) that left their worker's group: %s",
                    spec.role,
                    len(strays),
                    strays,
                )
            self._services.hygiene.stopped(procs)
            for worker in group.workers:
                worker.id = None
            self._services.watchdog.forget(p.pid for p in procs)
            self._services.watchdog.clear()
            self._procs = dict(kept)
            self._services.inprocess.forget(p.local_rank for p in procs)
            if self._gate is not None:
                self._gate.close()
                self._gate = None
            log.log(level, "[%s] Stopped worker group", spec.role)
        self._services.gpus.stopped(gpu_pids | set(strays))  # waited for by the next start
