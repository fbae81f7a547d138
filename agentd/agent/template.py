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
import sys
import time
from typing import Any

from agentd.agent.restart_steps import RestartSteps, what_failed
from agentd.agent.torch_internals import TorchInternals, fq_hostname
from agentd.exceptions import AgentdError, AgentStopped, ConfigError
from agentd.group import (  # Worker: torch's agent module exports it
    RunResult,
    Worker,  # noqa: F401
    WorkerFailure,
    WorkerGroup,
    WorkerState,
    check_transition,
)
from agentd.rendezvous.api import (
    BindsWorkerSpec,
    RendezvousClosedError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RoleInstanceInfo,
    is_agentd_handler,
)
from agentd.spec import DEFAULT_ROLE, WorkerSpec
from agentd.support.aio import run_shielded
from agentd.support.sync_bridge import agent_step, call_step, is_agentd_step, run_blocking
from agentd.view import AgentObserver

log = logging.getLogger(__name__)


def put_metric(metric_name: str, metric_value: float, metric_group: str = "torchelastic") -> None:
    """torch's ``put_metric`` (:func:`agentd.telemetry.metrics_api.put_metric`), here where
    torch's users patch it in its agent module. Until something in this process loads the
    metrics module (to configure a handler, subscribe a ``/metrics`` sink or patch
    ``getStream``), no one can hear a value: it is dropped without loading it."""
    metrics_api = sys.modules.get("agentd.telemetry.metrics_api")
    if metrics_api is not None:
        metrics_api.put_metric(metric_name, metric_value, metric_group)


class ElasticAgent(abc.ABC):
    """An agent that runs and supervises one role's worker group on this host."""

    @abc.abstractmethod
    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the workers until they succeed or fail for good (blocks)."""

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        """The worker group of ``role`` (its state is live)."""


class SimpleElasticAgent(RestartSteps, TorchInternals, ElasticAgent):
    """The template of an elastic agent; subclasses implement how workers are handled.

    :meth:`run` blocks until the job is done, on an event loop of its own; code already on
    a loop awaits :meth:`run_async` instead. The steps a subclass provides
    (``_start_workers``, ``_stop_workers``, ``_monitor_workers``, ``_shutdown``, and
    ``_restart_workers`` if it wants) may be ``async def`` or, as in torch, plain methods,
    which run in a worker thread (:mod:`agentd.support.sync_bridge`). A plain ``_monitor_workers``
    is called every ``spec.monitor_interval`` seconds, as torch polls; agentd's own is
    event-driven and returns only when something happened.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        exit_barrier_timeout: float = 300.0,
        shutdown_timeout: float | None = None,
    ) -> None:
        if shutdown_timeout is not None:  # torch's name for the workers' stop timeout
            if not 0 <= shutdown_timeout < float("inf"):
                raise ConfigError(f"shutdown_timeout: {shutdown_timeout!r} must be >= 0, finite")
            spec.stop_timeout = float(shutdown_timeout)
        self._rdzv_handler: RendezvousHandler | None = None
        self.fresh_run_id = spec.rdzv_handler is None
        """No rendezvous was given: the group runs alone here, under a new run id."""
        if spec.rdzv_handler is None:
            import os

            from agentd.rendezvous.solo import SoloRendezvous

            run_id = os.urandom(6).hex()
            addr = spec.local_addr or "127.0.0.1"
            spec.rdzv_handler = SoloRendezvous(
                run_id, addr, backend="static", addr_flag="local_addr"
            )
        elif not is_agentd_handler(spec.rdzv_handler):  # torch's kind: drive it adapted
            from agentd.rendezvous.registry import as_agentd_handler

            self._rdzv_handler = as_agentd_handler(spec.rdzv_handler)  # the spec keeps it
        handler = self._rdzv_handler or spec.rdzv_handler
        if isinstance(handler, BindsWorkerSpec):
            handler.bind_worker_spec(spec.role, spec.local_world_size)
        if not exit_barrier_timeout >= 0:  # nan too
            raise ConfigError(f"exit_barrier_timeout: {exit_barrier_timeout!r} must be >= 0")
        self._worker_group = WorkerGroup(spec)
        self._remaining_restarts = spec.max_restarts
        self._total_execution_time = 0
        self._exit_barrier_timeout = exit_barrier_timeout
        self._observers: list[AgentObserver] = []
        self._wakeup = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._stop_signal: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consecutive_failures = 0
        self._healthy_since: float | None = None
        self._round_watch: asyncio.Task[None] | None = None
        self._round_ended: str | None = None
        self._round_closed: RendezvousClosedError | None = None
        """Why the rendezvous round ended elsewhere, once :meth:`_watch_round` saw it."""
        self._stepping_out: str | None = None
        """Why this host must leave the job (its node checks failed), until it has left."""
        self.generation = -1
        self.restart_count = 0
        self.last_result: RunResult | None = None
        self.last_failure: WorkerFailure | None = None
        """The root cause of the latest failure, even one that a restart recovered from."""
        self.exit_error: BaseException | None = None
        """What ended :meth:`run` when it did not return a result (a stop signal, ...)."""

    def _put_metric(self, name: str, value: float) -> None:
        put_metric(name, value)  # looked up here, where torch's users patch it

    @property
    def remaining_restarts(self) -> int:
        """Restarts left before a failure is final."""
        return self._remaining_restarts

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

        Safe to call from a signal handler callback and from any thread (a run on another
        thread's loop gets the request through that loop); a second request, or ``force``,
        skips the stop signal's grace period and kills the workers at once.
        """
        loop = self._loop
        if loop is not None and not loop.is_closed() and not _on_loop(loop):
            loop.call_soon_threadsafe(self.request_stop, signum, force)
            return
        if self._stop_signal is not None or force:
            self._force.set()
        if self._stop_signal is None:
            self._stop_signal = signum
        self._stop_requested.set()
        self._wakeup.set()

    # -- the template ----------------------------------------------------------------------

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Run the workers until they succeed or fail for good, on a new event loop.

        Raises RuntimeError when called from inside a running event loop: await
        :meth:`run_async` there."""
        return run_blocking(self.run_async(role), "agent.run_async()")

    async def run_async(self, role: str = DEFAULT_ROLE) -> RunResult:
        """:meth:`run`, on the running loop. As torch's: the end-of-run metrics and worker
        events are recorded, a graceful exit from the rendezvous ends the run without an
        error, and ``_shutdown`` gets the stop signal that ended it."""
        self._loop = asyncio.get_running_loop()
        started = time.monotonic()
        death_sig: tuple[signal.Signals, ...] = ()  # torch passes one only for a signal
        try:
            await self._startup()
            result = await call_step(self._invoke_run, role)
            self._total_execution_time = int(time.monotonic() - started)
            self.last_result = result
            self._record_metrics(result)
            self._record_worker_events(result)
            log.info(
                "[%s] Worker group %s after %.2fs",
                role,
                result.state.value,
                time.monotonic() - started,
            )
            return result
        except RendezvousGracefulExitError as exc:
            log.info("[%s] Left the rendezvous: %s", role, exc)
            return RunResult(self._worker_group.state)
        except BaseException as exc:
            self.exit_error = exc
            if isinstance(exc, AgentStopped):
                death_sig = (signal.Signals(exc.signum),)
            self._settle_state(exc)
            raise
        finally:
            self._total_execution_time = int(time.monotonic() - started)
            self._stop_round_watch()
            await run_shielded(call_step(self._shutdown, *death_sig))  # a cancelled run too

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
            "[%s] Starting agent: %d worker(s) of %s, max_restarts=%d, rendezvous %s, %s",
            role,
            spec.local_world_size,
            spec.get_entrypoint_name(),
            spec.max_restarts,
            self.rdzv_handler.get_backend(),
            spec.how_started(),
        )
        await self._initialize_workers(group)
        from agentd.agent.decide import Action, Situation, decide  # off the launch path

        event_driven = is_agentd_step(self._monitor_workers)
        while True:
            if not event_driven:
                await self._pace(spec.monitor_interval)
            result = await call_step(self._monitor_workers, group)
            if not isinstance(result, RunResult):
                raise TypeError(
                    f"{type(self).__name__}._monitor_workers() returned "
                    f"{result!r}; it must return a RunResult"
                )
            self._raise_if_stop_requested()
            state = result.state
            # Our workers may have died because we lost our membership (its lease ended while
            # we were frozen) or a peer: a membership change, which spends no restart.
            lost = self._membership_lost() if state != WorkerState.SUCCEEDED else ""
            lost = lost or await self._lost_peer(group, state)
            below_min = state is WorkerState.HEALTHY and await self._lost_below_min(group)
            root = result.root_cause
            action = decide(
                Situation(
                    state,
                    peer_failed=self._round_closed is not None,
                    membership_lost=bool(lost),
                    round_ended=self._round_ended is not None,
                    stepping_out=self._stepping_out is not None,
                    remaining_restarts=self._remaining_restarts,
                    retryable=root is None or spec.restart_policy.is_retryable(root.exitcode),
                    lost_below_min=below_min,
                )
            )
            if action is Action.WATCH:
                continue
            closed = self._round_closed
            if action is Action.FAIL_PEER and closed is not None:
                log.error("[%s] %s; stopping the workers", role, closed)
                await self._timed_stop(group)
                self._set_state(WorkerState.FAILED, "a peer failed for good")
                raise closed
            if action is Action.STEP_OUT:
                await self._step_out(group, self._stepping_out or "")
                continue
            if action is Action.REJOIN:
                why = lost or self._round_ended
                log.info(
                    "[%s] Rendezvous round over (%s); restarting the group without "
                    "spending a restart",
                    role,
                    why,
                )
                self._notify("restarted", "membership", self.restart_count)
                await self._restart_group(group, reason="membership")
                continue
            if action is Action.ABORT:
                self._set_state(WorkerState.UNKNOWN, "the monitor could not tell")
                raise AgentdError(f"[{role}] worker group in UNKNOWN state; not restarting")
            if action is Action.SUCCEED:
                self._set_state(WorkerState.SUCCEEDED, "all workers exited 0")
                self._stop_round_watch()
                await self._exit_barrier()
                await self._close_rendezvous(True, "the workers succeeded")
                return result
            # FAILED or UNHEALTHY: RESTART or GIVE_UP
            reason = "failure" if state == WorkerState.FAILED else "unhealthy"
            if below_min:
                reason = "failure (a node was lost, leaving fewer than MIN)"
            self._set_state(state, reason)
            if root is not None:
                self.last_failure = root
                self._notify("phase_timed", "detect", max(0.0, time.time() - root.timestamp))
            for failure in sorted(result.failures.values(), key=lambda f: f.timestamp):
                self._notify("worker_failed", failure)
            failed = what_failed(root, reason)
            if action is Action.RESTART and not await self._no_round_to_restart_in(group, failed):
                log.info(
                    "[%s] %s; restarting the group (restart %d of %d)",
                    role,
                    failed,
                    self.restart_count + 1,
                    spec.max_restarts,
                )
                await self._restart_after(group, reason)
                continue
            return await self._give_up(group, result, reason)

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
    @agent_step
    async def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start the group's workers; returns their ids (pids) by local rank."""

    @abc.abstractmethod
    @agent_step
    async def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """Stop every worker of the group with the stop policy."""

    @abc.abstractmethod
    @agent_step
    async def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        """Report the group's state (agentd's own waits until something may have changed)."""

    @abc.abstractmethod
    @agent_step
    async def _shutdown(
        self, death_sig: signal.Signals = signal.SIGTERM, is_restart: bool = False
    ) -> None:
        """Release everything the agent holds; runs once, at the end of :meth:`run`."""


_RoleInstanceInfo = RoleInstanceInfo  # torch's private names, used by its tests and users
_get_fq_hostname = fq_hostname


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs on ``loop`` (its thread, while it runs)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
