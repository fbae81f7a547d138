"""The agent template: rendezvous, rank assignment, start, monitor, restart, stop.

:class:`SimpleElasticAgent` is the seed's template, on asyncio: subclasses provide the
``_start_workers`` / ``_stop_workers`` / ``_monitor_workers`` / ``_shutdown`` steps and the
template runs the loop around them. State changes go through :meth:`_set_state` only.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import signal
import time
from collections.abc import Sequence

import anyio

from agentd.exceptions import AgentdError, AgentStopped, ConfigError
from agentd.observer import AgentObserver
from agentd.rendezvous.api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RoleInstanceInfo,
)
from agentd.rendezvous.static import StaticRendezvous
from agentd.spec import (
    DEFAULT_ROLE,
    RunResult,
    Worker,
    WorkerFailure,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
    check_transition,
)
from agentd.store.api import StoreError

log = logging.getLogger(__name__)

_WATCH_RETRY = 5.0


def assign_worker_ranks(
    role_infos: Sequence[RoleInstanceInfo], group_rank: int, spec: WorkerSpec
) -> list[Worker]:
    """Global and role ranks for this agent's workers, as the seed assigns them.

    Agents are ordered by group rank; an agent's workers take the next ``local_world_size``
    global ranks, and the next role ranks among agents of the same role.
    """
    infos = sorted(role_infos, key=lambda info: info.rank)
    world_size = sum(info.local_world_size for info in infos)
    base_rank = sum(info.local_world_size for info in infos if info.rank < group_rank)
    same_role = [info for info in infos if info.role == spec.role]
    role_world_size = sum(info.local_world_size for info in same_role)
    base_role_rank = sum(info.local_world_size for info in same_role if info.rank < group_rank)
    return [
        Worker(
            local_rank=i,
            global_rank=base_rank + i,
            role_rank=base_role_rank + i,
            world_size=world_size,
            role_world_size=role_world_size,
        )
        for i in range(spec.local_world_size)
    ]


class ElasticAgent(abc.ABC):
    """An agent that runs and supervises one role's worker group on this host."""

    @abc.abstractmethod
    async def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the workers until they succeed or fail for good."""

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        """The worker group of ``role`` (its state is live)."""


class SimpleElasticAgent(ElasticAgent):
    """The template of an elastic agent; subclasses implement how workers are handled."""

    def __init__(self, spec: WorkerSpec, exit_barrier_timeout: float = 300.0) -> None:
        if spec.rdzv_handler is None:
            spec.rdzv_handler = StaticRendezvous(run_id="none")
        if exit_barrier_timeout < 0:
            raise ConfigError(f"exit_barrier_timeout: {exit_barrier_timeout!r} must be >= 0")
        self._worker_group = WorkerGroup(spec)
        self._remaining_restarts = spec.max_restarts
        self._exit_barrier_timeout = exit_barrier_timeout
        self._observers: list[AgentObserver] = []
        self._wakeup = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._stop_signal: int | None = None
        self._consecutive_failures = 0
        self._healthy_since: float | None = None
        self._round_watch: asyncio.Task[None] | None = None
        self._round_ended: str | None = None
        self._round_closed: RendezvousClosedError | None = None
        """Why the rendezvous round ended elsewhere, once :meth:`_watch_round` saw it."""
        self.generation = -1
        self.restart_count = 0
        self.last_result: RunResult | None = None
        self.last_failure: WorkerFailure | None = None
        """The root cause of the latest failure, even one that a restart recovered from."""
        self.exit_error: BaseException | None = None
        """What ended :meth:`run` when it did not return a result (a stop signal, ...)."""

    @property
    def rdzv_handler(self) -> RendezvousHandler:
        handler = self._worker_group.spec.rdzv_handler
        assert handler is not None  # set in __init__
        return handler

    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        return self._worker_group

    def add_observer(self, observer: AgentObserver) -> None:
        """Tell ``observer`` about state changes, recovery phases, restarts and failures."""
        self._observers.append(observer)

    def _notify(self, hook: str, *args: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                log.exception("Agent observer %r failed in %s", observer, hook)

    def request_stop(self, signum: int = signal.SIGTERM, force: bool = False) -> None:
        """Ask the agent to stop its workers and make :meth:`run` raise AgentStopped.

        Safe to call from a signal handler callback; a second request, or ``force``, skips
        the stop signal's grace period and kills the workers at once.
        """
        if self._stop_signal is not None or force:
            self._force.set()
        if self._stop_signal is None:
            self._stop_signal = signum
        self._stop_requested.set()
        self._wakeup.set()

    # -- the template ----------------------------------------------------------------------

    async def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        started = time.monotonic()
        try:
            await self._startup()
            result = await self._invoke_run(role)
            self.last_result = result
            log.info(
                "[%s] Worker group %s after %.2fs",
                role,
                result.state.value,
                time.monotonic() - started,
            )
            return result
        except BaseException as exc:
            self.exit_error = exc
            self._settle_state(exc)
            raise
        finally:
            self._stop_round_watch()
            with anyio.CancelScope(shield=True):  # a cancelled run still stops everything
                await self._shutdown()

    def _settle_state(self, exc: BaseException) -> None:
        """The group's final state when :meth:`run` ends by an exception: STOPPED for a
        stop signal, FAILED for anything else (the state machine never ends in INIT)."""
        state = self._worker_group.state
        if state in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.UNKNOWN):
            return
        stopped = (AgentStopped, asyncio.CancelledError, KeyboardInterrupt)
        if isinstance(exc, stopped) or getattr(exc, "exit_code", 1) == 0:
            if state is not WorkerState.STOPPED:
                self._set_state(WorkerState.STOPPED, str(exc) or type(exc).__name__)
            return
        self._set_state(WorkerState.FAILED, str(exc) or type(exc).__name__)

    async def _invoke_run(self, role: str) -> RunResult:
        group = self._worker_group
        spec = group.spec
        log.info(
            "[%s] Starting agent: %d worker(s) of %s, max_restarts=%d, rendezvous %s",
            role,
            spec.local_world_size,
            spec.get_entrypoint_name(),
            spec.max_restarts,
            self.rdzv_handler.get_backend(),
        )
        await self._initialize_workers(group)
        while True:
            result = await self._monitor_workers(group)
            self._raise_if_stop_requested()
            state = result.state
            if self._round_closed is not None and state == WorkerState.HEALTHY:
                closed = self._round_closed
                log.error("[%s] %s; stopping the workers", role, closed)
                await self._timed_stop(group)
                self._set_state(WorkerState.FAILED, "a peer failed for good")
                raise closed
            # Our workers may have died because we lost our membership (killed at the end of
            # its lease while the agent was frozen, say): that is a membership change, not
            # their failure, and it spends no restart. Workers that succeeded did, lease or
            # not: their exit barrier copes with a store out of reach.
            lost = self._membership_lost() if state != WorkerState.SUCCEEDED else ""
            if lost or (state == WorkerState.HEALTHY and self._round_ended is not None):
                why = lost or self._round_ended
                log.info("[%s] Rendezvous round over (%s); restarting the group without "
                         "spending a restart", role, why)  # fmt: skip
                self._notify("restarted", "membership", self.restart_count)
                await self._restart_workers(group, reason="membership")
                continue
            if state == WorkerState.HEALTHY:
                continue
            if state == WorkerState.SUCCEEDED:
                self._set_state(WorkerState.SUCCEEDED, "all workers exited 0")
                self._stop_round_watch()
                await self._exit_barrier()
                await self._close_rendezvous(True, "the workers succeeded")
                return result
            # FAILED or UNHEALTHY
            reason = "failure" if state == WorkerState.FAILED else "unhealthy"
            self._set_state(state, reason)
            root = result.root_cause
            if root is not None:
                self.last_failure = root
                self._notify("phase_timed", "detect", max(0.0, time.time() - root.timestamp))
            for failure in sorted(result.failures.values(), key=lambda f: f.timestamp):
                self._notify("worker_failed", failure)
            retryable = root is None or spec.restart_policy.is_retryable(root.exitcode)
            if self._remaining_restarts > 0 and retryable:
                self._remaining_restarts -= 1
                self.restart_count += 1
                self._notify("restarted", reason, self.restart_count)
                self._stop_round_watch()
                ending = asyncio.create_task(self._end_round(f"worker {reason} on this node"))
                await self._timed_stop(group)  # while the peers learn of it
                await ending
                self._set_state(WorkerState.STOPPED, "restarting")
                await self._backoff(role)
                log.info(
                    "[%s] Restarting worker group (restart %d of %d)",
                    role,
                    self.restart_count,
                    spec.max_restarts,
                )
                await self._restart_workers(group, reason=reason, stopped=True)
                continue
            if not retryable and root is not None:
                log.error("[%s] Exit code %d is non-retryable; not restarting", role, root.exitcode)
            self._stop_round_watch()
            why = root.summary() if root is not None else f"worker group {reason}"
            closing = asyncio.create_task(self._close_rendezvous(False, why))
            await self._timed_stop(group)
            await closing
            self._set_state(WorkerState.FAILED, "no restarts left")
            return RunResult(WorkerState.FAILED, result.return_values, result.failures)

    async def _initialize_workers(self, group: WorkerGroup) -> None:
        """Rendezvous, assign ranks and start the workers; the group becomes HEALTHY."""
        self._raise_if_stop_requested()
        self._stop_round_watch()
        began = time.monotonic()
        await self._rendezvous(group)
        self._notify("phase_timed", "rendezvous", time.monotonic() - began)
        self._raise_if_stop_requested()
        began = time.monotonic()
        pids = await self._start_workers(group)
        self._notify("phase_timed", "start", time.monotonic() - began)
        for worker in group.workers:
            worker.id = pids.get(worker.local_rank)
        self._healthy_since = time.monotonic()
        self._round_watch = asyncio.create_task(self._watch_round(), name="round-watch")
        self._set_state(WorkerState.HEALTHY, "workers started")

    async def _watch_round(self) -> None:
        """Wake the run loop when the rendezvous round ends elsewhere (no polling)."""
        while True:
            try:
                why = await self.rdzv_handler.round_over()
            except RendezvousClosedError as exc:
                self._round_closed = exc
                self._wakeup.set()
                return
            except AgentdError as exc:  # the store is down: the workers go on meanwhile
                log.warning("Cannot watch the rendezvous (%s); retrying in %gs", exc,
                            _WATCH_RETRY)  # fmt: skip
                await asyncio.sleep(_WATCH_RETRY)
                continue
            self._round_ended = why
            self._wakeup.set()
            return

    def _stop_round_watch(self) -> None:
        if self._round_watch is not None:
            self._round_watch.cancel()
            self._round_watch = None
        self._round_ended = None

    async def _end_round(self, reason: str) -> None:
        """Tell the peers this round is over; a store problem is logged, not fatal (the
        peers' membership leases run out instead)."""
        try:
            await self.rdzv_handler.end_round(reason)
        except AgentdError as exc:
            log.warning("Could not tell the other nodes to restart yet: %s", exc)

    async def _close_rendezvous(self, succeeded: bool, reason: str) -> None:
        try:
            await self.rdzv_handler.set_closed(succeeded, reason)
        except AgentdError as exc:
            log.warning("Could not close the rendezvous: %s", exc)

    async def _restart_workers(
        self, group: WorkerGroup, reason: str, stopped: bool = False
    ) -> None:
        """Stop (unless already stopped) and start the group again after a new rendezvous."""
        if not stopped:
            await self._timed_stop(group)
            self._set_state(WorkerState.STOPPED, reason)
        self._set_state(WorkerState.INIT, f"restart ({reason})")
        await self._initialize_workers(group)

    async def _timed_stop(self, group: WorkerGroup) -> None:
        began = time.monotonic()
        await self._stop_workers(group)
        self._notify("phase_timed", "stop", time.monotonic() - began)

    def _stop_timeout(self) -> float:
        """How long stopping may wait before SIGKILL: the spec's stop timeout, but never
        past the end of our membership lease (the others may reuse our ranks then)."""
        timeout = self._worker_group.spec.stop_timeout
        lease = getattr(self.rdzv_handler, "lease_deadline", None)
        deadline = lease() if lease is not None else None
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        return timeout

    def _membership_lost(self) -> str:
        """Why we are no longer a member of our round ('' while we are, or if the
        rendezvous has no notion of it)."""
        lost = getattr(self.rdzv_handler, "membership_lost", None)
        return lost() if lost is not None else ""

    async def _rendezvous(self, group: WorkerGroup) -> None:
        spec = group.spec
        info: RendezvousInfo = await self.rdzv_handler.next_rendezvous()
        role_infos = info.role_infos or (
            RoleInstanceInfo(spec.role, info.group_rank, spec.local_world_size),
        )
        group.store = info.store
        group.group_rank = info.group_rank
        group.group_world_size = info.group_world_size
        group.master_addr = spec.master_addr or info.master_addr
        group.master_port = spec.master_port or info.master_port
        group.workers = assign_worker_ranks(role_infos, info.group_rank, spec)
        self.generation = info.generation
        log.info(
            "[%s] Rendezvous complete: run_id=%s generation=%d group_rank=%d/%d "
            "master=%s:%s global ranks %s, world size %d",
            spec.role,
            info.run_id,
            info.generation,
            info.group_rank,
            info.group_world_size,
            group.master_addr,
            group.master_port,
            [w.global_rank for w in group.workers],
            group.workers[0].world_size,
        )

    async def _backoff(self, role: str) -> None:
        spec = self._worker_group.spec
        healthy_for = time.monotonic() - (self._healthy_since or time.monotonic())
        if healthy_for >= spec.restart_backoff.maximum:
            self._consecutive_failures = 0
        self._consecutive_failures += 1
        delay = spec.restart_backoff.delay(self._consecutive_failures)
        if delay <= 0:
            return
        log.info("[%s] Waiting %.2fs before restarting (backoff)", role, delay)
        try:  # only a stop request cuts the backoff short, not the stopped workers' exits
            async with asyncio.timeout(delay):
                await self._stop_requested.wait()
        except TimeoutError:
            return
        self._raise_if_stop_requested()

    async def _exit_barrier(self) -> None:
        """Wait (up to ``exit_barrier_timeout``) for the other agents' workers to finish, so
        no agent leaves while its peers may still need it. Skipped on failure."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._exit_barrier_timeout):
                await self.rdzv_handler.exit_barrier()
        except TimeoutError:
            log.warning(
                "Exit barrier timed out after %.0fs; leaving anyway", self._exit_barrier_timeout
            )
            return
        except StoreError as exc:  # our workers succeeded: that is the outcome
            log.warning("Exit barrier: could not wait for the other nodes (%s); our workers "
                        "succeeded, so the job is done here (exit 0)", exc)  # fmt: skip
            return
        log.debug("Exit barrier passed after %.3fs", time.monotonic() - started)

    def _raise_if_stop_requested(self) -> None:
        if self._stop_signal is not None:
            raise AgentStopped(self._stop_signal)

    def _set_state(self, new: WorkerState, reason: str) -> None:
        """The one place state changes: checks the table, logs, tells the observers."""
        group = self._worker_group
        old = group.state
        if old is new:
            return
        check_transition(old, new)
        group.state = new
        log.debug("[%s] Worker group %s -> %s (%s)", group.spec.role, old.value, new.value, reason)
        self._notify("state_changed", old, new, reason)

    # -- the steps subclasses provide --------------------------------------------------------

    async def _startup(self) -> None:
        """Set up what the agent needs before its first rendezvous (nothing, by default)."""

    @abc.abstractmethod
    async def _start_workers(self, group: WorkerGroup) -> dict[int, int]:
        """Start the group's workers; returns their pids by local rank."""

    @abc.abstractmethod
    async def _stop_workers(self, group: WorkerGroup) -> None:
        """Stop every worker of the group with the stop policy."""

    @abc.abstractmethod
    async def _monitor_workers(self, group: WorkerGroup) -> RunResult:
        """Wait until something may have changed (an exit, a stop request), then report."""

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """Release everything the agent holds; runs once, at the end of :meth:`run`."""
