"""The one place the local agent's services are built: from :class:`AgentSettings` and
the agent's :class:`AgentHooks` to the :class:`LocalServices` it runs.

``agentd run`` (:mod:`agentd.config.build`), torch's ``elastic_launch``
(:mod:`agentd.launcher`) and a Python caller's ``LocalElasticAgent(spec)`` all come
here. A service that only an option asks for is imported only then (the health
endpoint, node checks), in-process restarts only where the group can restart at all
(:func:`can_restart`), and the drain and OOM watch are built on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentd.assembly.settings import AgentSettings
from agentd.assembly.standins import HeartbeatsOnDemand, NoGpus, NoInProcessRestarts
from agentd.hygiene.service import ProcessHygiene
from agentd.preload.service import PreloadService
from agentd.rendezvous.api import LeasedMembership, ShowsJob
from agentd.rendezvous.workers_store import WorkerStoreService
from agentd.reports.result_service import ResultFileService
from agentd.timer.service import Watchdog
from agentd.timer.settings import WatchdogSettings

if TYPE_CHECKING:
    from agentd.assembly.ports import (
        DrainPort,
        GpusPort,
        HealthPort,
        HeartbeatsPort,
        HygienePort,
        InProcessPort,
        NodeChecksPort,
        OomPort,
        PreloadPort,
        ResultPort,
        SlowNodesPort,
        WatchdogPort,
        WorkerStorePort,
    )
    from agentd.drain.settings import DrainSettings
    from agentd.health.settings import HealthSettings
    from agentd.rendezvous.api import ComparesNodes
    from agentd.rendezvous.drains import Drains
    from agentd.slownodes.settings import SlowNodeSettings
    from agentd.view import AgentObserver, AgentView, Service
    from agentd.workers.processes import WorkerProcess


class AgentHooks:
    """What the services may call back on the agent that runs them: ``view`` (the agent
    as an :class:`~agentd.view.AgentView`), ``procs()`` (the running workers by local
    rank), ``wakeup()`` (something changed: the agent looks at its workers again),
    ``notify(hook, *args)`` (tell the agent's observers), ``leave(why, exit_code=None,
    alone=False)`` (leave the job) and ``add_observer``.

    This module's records are plain classes: a ``NamedTuple`` compiles each string
    annotation into a ``ForwardRef`` when it is defined (with ``AgentSettings``, about 1 ms
    on every launch for the three).
    """

    __slots__ = ("add_observer", "leave", "notify", "procs", "view", "wakeup")

    def __init__(
        self,
        view: AgentView,
        procs: Callable[[], Mapping[int, WorkerProcess]],
        wakeup: Callable[[], None],
        notify: Callable[..., None],
        leave: Callable[..., None],
        add_observer: Callable[[AgentObserver], None],
    ) -> None:
        self.view = view
        self.procs = procs
        self.wakeup = wakeup
        self.notify = notify
        self.leave = leave
        self.add_observer = add_observer


class LocalServices:
    """The local agent's services, each known by what the agent calls on it."""

    __slots__ = (
        "events",
        "gpus",
        "health",
        "heartbeats",
        "hygiene",
        "inprocess",
        "job_records",
        "node_checks",
        "preload",
        "result",
        "watchdog",
        "workers_store",
    )

    def __init__(
        self,
        *,
        result: ResultPort,
        events: Service | None,
        watchdog: WatchdogPort,
        heartbeats: HeartbeatsPort,
        health: HealthPort | None,
        workers_store: WorkerStorePort,
        hygiene: HygienePort,
        preload: PreloadPort,
        inprocess: InProcessPort,
        gpus: GpusPort,
        node_checks: NodeChecksPort | None,
        job_records: Service | None = None,
    ) -> None:
        self.result = result
        self.events = events
        self.watchdog = watchdog
        self.heartbeats = heartbeats
        self.health = health
        self.workers_store = workers_store
        self.hygiene = hygiene
        self.preload = preload
        self.inprocess = inprocess
        self.gpus = gpus
        self.node_checks = node_checks
        self.job_records = job_records

    def in_order(self) -> list[Service]:
        """Started in this order before the first rendezvous, stopped in reverse."""
        ordered: list[Any] = [
            self.result,
            self.events,
            self.watchdog,
            self.heartbeats,
            self.health,
            self.workers_store,
            self.hygiene,
            self.preload,
            self.inprocess,
            self.job_records,
        ]
        return [s for s in ordered if s is not None]


ServicesFactory = Callable[[AgentHooks, AgentSettings], LocalServices]


def can_restart(agent: AgentView) -> bool:
    """Whether the agent's group may ever be restarted: it has restarts to spend, or its
    membership can change (a leased rendezvous restarts without spending one)."""
    spec = agent.get_worker_group().spec
    return spec.max_restarts > 0 or isinstance(agent.rdzv_handler, LeasedMembership)


def standby_count(agent: AgentView) -> int:
    """The standby workers the zygote keeps: as the spec says, else one per local rank
    where the group may restart (a lost rank's replacement then costs no fork). None for a
    group of one node with no restarts, which nothing restarts: they would only hold
    memory (with ``standby_cuda``, a CUDA context each), so standbys asked for there are
    said not to be forked. (A static job of several nodes re-forms when a node leaves and
    comes back, restarts or not.)"""
    from agentd.rendezvous.solo import SoloRendezvous

    spec = agent.get_worker_group().spec
    restarts = can_restart(agent)
    if spec.standby_workers and not restarts and isinstance(agent.rdzv_handler, SoloRendezvous):
        logging.getLogger(__name__).warning(
            "standby_workers %d ignored: a group of one node with max_restarts 0 is never "
            "restarted, so no standby worker is forked",
            spec.standby_workers,
        )
        return 0
    if spec.standby_workers is not None:
        return spec.standby_workers
    return spec.local_world_size if restarts else 0


def in_process_restarts(
    agent: AgentView, settings: AgentSettings, hooks: AgentHooks
) -> InProcessPort:
    """The in-process port: the real one where the group may restart."""
    if not can_restart(agent):
        return NoInProcessRestarts()
    from agentd.inprocess.service import InProcessRestarts

    return InProcessRestarts(settings.inprocess, hooks.wakeup)


def build_services(hooks: AgentHooks, settings: AgentSettings) -> LocalServices:
    """Every service of the agent behind ``hooks``, from ``settings`` (torch's environment
    switches stand in for a watchdog or health endpoint the settings leave unset)."""
    agent = hooks.view
    health, watchdog_settings = settings.health, settings.watchdog
    if settings.torch_env and (health is None or watchdog_settings is None):
        health, watchdog_settings = _from_torch_env(health, watchdog_settings)
    mark = agent.owner_mark
    hygiene = ProcessHygiene(
        mark,
        agent.run_id,
        enabled=settings.process_hygiene,
        fresh_run_id=settings.fresh_run_id,
    )
    watchdog = Watchdog(
        watchdog_settings or WatchdogSettings(),
        hooks.procs,
        mark,
        hooks.wakeup,
        max_overdue=health.timeout if health is not None else None,
        rank_of=lambda local_rank: _global_rank(agent, local_rank),
    )
    heartbeats = heartbeat_service(agent, settings, hooks, watchdog, hygiene)
    health_service = None
    if health is not None:
        from agentd.health.service import HealthService

        health_service = HealthService(agent, health)
    node_checks = None
    gate = settings.node_checks
    if gate is not None and gate.enabled:
        from agentd.nodecheck.service import NodeCheckService

        node_checks = NodeCheckService(gate, agent.rdzv_handler, hooks.leave, hooks.notify, hygiene)
    if isinstance(agent.rdzv_handler, LeasedMembership):
        agent.rdzv_handler.on_lease(hygiene.on_lease)
        agent.rdzv_handler.on_will(hygiene.set_will)
    spec = agent.get_worker_group().spec
    return LocalServices(
        result=ResultFileService(agent),
        events=event_log(settings, hooks),
        watchdog=watchdog,
        heartbeats=heartbeats,
        health=health_service,
        workers_store=WorkerStoreService(agent),
        hygiene=hygiene,
        preload=PreloadService(spec, hygiene, spares=standby_count(agent)),
        inprocess=in_process_restarts(agent, settings, hooks),
        gpus=gpu_release(settings.gpu_release_timeout, hygiene),
        node_checks=node_checks,
        job_records=job_record_publisher(hooks, health_service),
    )


def _from_torch_env(
    health: HealthSettings | None, watchdog: WatchdogSettings | None
) -> tuple[HealthSettings | None, WatchdogSettings]:
    """The health endpoint and watchdog torch's environment switches ask for, where the
    settings leave them unset."""
    import os

    from agentd.assembly.torch_env import HEALTH_PORT_ENV, health_from_env, watchdog_from_env

    if health is None and os.environ.get(HEALTH_PORT_ENV):
        health = health_from_env()
    return health, watchdog or watchdog_from_env()


def heartbeat_service(
    agent: AgentView,
    settings: AgentSettings,
    hooks: AgentHooks,
    watchdog: Watchdog,
    hygiene: ProcessHygiene,
) -> HeartbeatsPort:
    """Hang detection: built now where heartbeat options were given or an earlier agent of
    the run may have learned timeouts (its run id was given), so they hold workers that
    never heartbeat; else with the workers' first heartbeat (:class:`HeartbeatsOnDemand`)."""

    def build() -> HeartbeatsPort:
        from agentd.heartbeats.service import HeartbeatService
        from agentd.heartbeats.settings import HeartbeatSettings

        return HeartbeatService(
            agent,
            watchdog,
            settings.heartbeats or HeartbeatSettings(),
            hooks.notify,
            dump_wait=max(1.0, watchdog.dump_grace),
            helpers=hygiene,
        )

    if settings.heartbeats is not None or not settings.fresh_run_id:
        return build()
    return HeartbeatsOnDemand(build)


def event_log(settings: AgentSettings, hooks: AgentHooks) -> Service | None:
    """The run's event log, where its events go somewhere: a file (``--event-log``) or
    DEBUG records (see :class:`~agentd.telemetry.event_log.EventLog`). Else none is
    built, and the events' modules are not loaded."""
    debug = logging.getLogger("agentd.telemetry.event_log").isEnabledFor(logging.DEBUG)
    if not settings.event_log and not debug:
        return None
    from agentd.telemetry.event_log import EventLog

    agent = hooks.view
    role = agent.get_worker_group().spec.role
    return EventLog(agent.run_id, role, agent.hostname, settings.event_log, hooks.add_observer)


def gpu_release(timeout: float, helpers: ProcessHygiene) -> GpusPort:
    """The bounded wait for a stop's GPU memory (:class:`~agentd.gpus.release.GpuRelease`)
    on a node that may have NVIDIA GPUs; elsewhere, or with ``timeout`` 0, no wait.
    ``helpers``: the process hygiene that must leave nvidia-smi's exit status alone."""
    from agentd.gpus import may_have_gpus

    if not timeout or not may_have_gpus():
        return NoGpus()
    from agentd.gpus.release import GpuRelease

    return GpuRelease(timeout, helpers)


def drain_service(
    settings: DrainSettings | None,
    drains: Drains,
    hooks: AgentHooks,
    heartbeats: HeartbeatsPort,
) -> DrainPort:
    """The drain's service, built when the first attempt with a control file starts;
    ``heartbeats``: the hang detection, held while a drain pauses the workers, and which
    says how long the workers that heartbeat take to report their step."""
    from agentd.drain.service import DrainService
    from agentd.drain.settings import DrainSettings

    return DrainService(
        settings or DrainSettings(),
        drains,
        hooks.procs,
        hooks.leave,
        hooks.notify,
        heartbeats.hold,
        heartbeats.beats_due_in,
    )


def slow_node_service(
    settings: SlowNodeSettings | None,
    handler: ComparesNodes,
    heartbeats: HeartbeatsPort,
    hooks: AgentHooks,
) -> SlowNodesPort:
    """The job-wide straggler comparison, built when the first attempt's workers start."""
    from agentd.slownodes.service import SlowNodeService
    from agentd.slownodes.settings import SlowNodeSettings

    service = SlowNodeService(
        settings or SlowNodeSettings(),
        handler.timings,
        handler.node_id,
        hooks.view,
        heartbeats.node_sections,
        handler.num_nodes_waiting,
        hooks.notify,
    )
    hooks.add_observer(service)  # a straggler's drain names it on agents yet to read it
    return service


def job_record_publisher(hooks: AgentHooks, health: HealthPort | None) -> Service | None:
    """This node's record for the job view, where the rendezvous has a store to keep it
    (:mod:`agentd.jobview.publisher`); an observer of the worker group's state. It names
    ``health``'s URL, where ``agentd logs`` reads the node's lines."""
    handler = hooks.view.rdzv_handler
    if not isinstance(handler, ShowsJob):
        return None
    from agentd.jobview.publisher import JobRecordPublisher

    publisher = JobRecordPublisher(hooks.view, handler, lambda: health.url if health else None)
    hooks.add_observer(publisher)
    return publisher


def oom_watch() -> OomPort:
    """The OOM watch, built after the first workers are spawned (off the launch path)."""
    from agentd.reports.oom import OomWatch

    return OomWatch()


def _global_rank(agent: AgentView, local_rank: int) -> int | None:
    """The global rank of ``agent``'s worker at ``local_rank`` this attempt (None: none)."""
    workers = agent.get_worker_group().workers
    return next((w.global_rank for w in workers if w.local_rank == local_rank), None)
