"""Every feature's settings for one local agent, in one record (``agentd run``'s flags, or
a Python caller's choices); each service gets its own part, never the whole record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.drain.settings import DrainSettings
    from agentd.health.settings import HealthSettings
    from agentd.heartbeats.settings import HeartbeatSettings
    from agentd.inprocess.settings import InProcessSettings
    from agentd.nodecheck.gate import NodeGate
    from agentd.slownodes.settings import SlowNodeSettings
    from agentd.timer.settings import WatchdogSettings


class AgentSettings:
    """What the local agent runs beside its workers, and how.

    ``process_hygiene`` (the default): the agent becomes a child subreaper, reaps orphans,
    runs a guardian that kills the workers if the agent is killed, and kills workers left
    over by a dead agent of the same run id (``fresh_run_id`` says the id was just
    generated, so there can be none and the look for them is skipped). ``run_folder``
    names the run's folder under the log directory (None: the run id; ``agentd run``
    gives a run under torchrun's default id a folder of its own, ``none_<random>``, as
    torch's log specs do, so successive jobs never share one). ``watchdog`` adds
    torch's named-pipe timers and D-state detection (None: torch's environment switches
    decide); ``health`` serves ``/livez``, ``/readyz``, ``/status`` and ``/metrics`` (None:
    ``TORCHELASTIC_HEALTH_CHECK_PORT`` decides); ``event_log`` appends the run's events as
    JSON lines; the first attempt's log directory and the last ``keep_attempts`` are kept
    (0: all); ``heartbeats`` tunes hang detection, ``node_checks`` gates each join,
    ``drain`` the coordinated drain, ``inprocess`` in-process restarts,
    ``slow_nodes`` the job-wide straggler comparison (None: its defaults), and
    ``gpu_release_timeout`` bounds the wait for stopped workers' GPU memory. ``torch_env``:
    torch's environment switches decide a ``watchdog`` or ``health`` left None, as torch's
    agent reads them whoever builds it (``agentd run`` resolves them as its flags' defaults,
    and turns this off).

    A plain class, not a ``NamedTuple``: a ``NamedTuple`` compiles each of its string
    annotations into a ``ForwardRef`` when it is defined, 0.4 ms for these eleven on every
    launch (a fresh process, measured), against 0.02 ms for a class.
    """

    __slots__ = (
        "drain",
        "event_log",
        "fresh_run_id",
        "gpu_release_timeout",
        "health",
        "heartbeats",
        "inprocess",
        "keep_attempts",
        "node_checks",
        "process_hygiene",
        "run_folder",
        "slow_nodes",
        "torch_env",
        "watchdog",
    )

    def __init__(
        self,
        *,
        process_hygiene: bool = True,
        fresh_run_id: bool = False,
        watchdog: WatchdogSettings | None = None,
        health: HealthSettings | None = None,
        event_log: str | None = None,
        keep_attempts: int = 10,
        heartbeats: HeartbeatSettings | None = None,
        node_checks: NodeGate | None = None,
        drain: DrainSettings | None = None,
        inprocess: InProcessSettings | None = None,
        gpu_release_timeout: float = 30.0,
        slow_nodes: SlowNodeSettings | None = None,
        torch_env: bool = True,
        run_folder: str | None = None,
    ) -> None:
        self.process_hygiene = process_hygiene
        self.fresh_run_id = fresh_run_id
        self.watchdog = watchdog
        self.health = health
        self.event_log = event_log
        self.keep_attempts = keep_attempts
        self.heartbeats = heartbeats
        self.node_checks = node_checks
        self.drain = drain
        self.inprocess = inprocess
        self.gpu_release_timeout = gpu_release_timeout
        self.slow_nodes = slow_nodes
        self.torch_env = torch_env
        self.run_folder = run_folder

    def replace(self, **changes: Any) -> AgentSettings:
        """A copy, with ``changes`` (field names and their new values)."""
        values = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return AgentSettings(**values)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"AgentSettings({fields})"
