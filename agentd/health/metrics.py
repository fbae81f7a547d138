"""Metrics: one agent's Prometheus registry (the seed's ``put_metric`` is in
:mod:`agentd.telemetry.metrics_api`; its values show here as ``agentd_custom_metric``).

Every agent has its own registry (no global one). What changes as events happen is
counted by :class:`AgentMetrics`, an observer; what is a reading (worker CPU and memory,
timer counts, watchdog liveness) is read at scrape time, so nothing polls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from agentd.group import WorkerFailure, WorkerState
from agentd.view import AgentObserver

if TYPE_CHECKING:
    from agentd.view import AgentView

log = logging.getLogger(__name__)

PHASE_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class AgentMetrics(AgentObserver):
    """The Prometheus metrics of one local agent."""

    def __init__(self, agent: AgentView) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.state = Gauge(
            "agentd_worker_group_state",
            "1 for the worker group's current state, 0 for the others",
            ["state"],
            registry=r,
        )
        for state in WorkerState:
            self.state.labels(state.value).set(1 if state is WorkerState.INIT else 0)
        self.transitions = Counter(
            "agentd_state_transitions",
            "Worker group state changes",
            ["from_state", "to_state"],
            registry=r,
        )
        self.restarts = Counter(
            "agentd_restarts", "Worker group restarts by reason", ["reason"], registry=r
        )
        self.failures = Counter(
            "agentd_worker_failures", "Worker failures by kind", ["kind"], registry=r
        )
        self.phases = Histogram(
            "agentd_recovery_phase_seconds",
            "Duration of each recovery phase: detect, stop, rendezvous, start",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.loop_lag = Gauge(
            "agentd_event_loop_lag_seconds",
            "How late the event loop ran a callback it had scheduled, at the last check",
            registry=r,
        )
        self.store_latency = Histogram(
            "agentd_store_request_seconds",
            "Latency of rendezvous store requests (long polls excluded)",
            ["op"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.drains = Counter(
            "agentd_drains",
            "Drains this node led, by outcome (complete: every node confirmed its checkpoints, "
            "the store reachable throughout)",
            ["outcome"],
            registry=r,
        )
        self.drain_seconds = Histogram(
            "agentd_drain_seconds",
            "A drain from its request to every checkpoint confirmed",
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.custom = Gauge(
            "agentd_custom_metric", "Values given to put_metric", ["group", "name"], registry=r
        )
        r.register(_Readings(agent))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def state_changed(self, old: WorkerState, new: WorkerState, reason: str) -> None:
        self.state.labels(old.value).set(0)
        self.state.labels(new.value).set(1)
        self.transitions.labels(old.value, new.value).inc()

    def phase_timed(self, phase: str, seconds: float) -> None:
        self.phases.labels(phase).observe(seconds)

    def restarted(self, reason: str, restart_count: int) -> None:
        self.restarts.labels(reason).inc()

    def worker_failed(self, failure: WorkerFailure) -> None:
        kind = "signal" if failure.exitcode < 0 else "exit"
        if failure.message.startswith("timer expired"):
            kind = "timer"
        self.failures.labels(kind).inc()

    def drain_done(self, outcome: dict[str, Any]) -> None:
        complete = not outcome["missing"] and not outcome.get("store_lost")
        self.drains.labels("complete" if complete else "incomplete").inc()
        self.drain_seconds.observe(outcome["seconds"])

    def store_request(self, op: str, seconds: float) -> None:
        self.store_latency.labels(op).observe(seconds)

    def put_metric(self, name: str, value: float, group: str) -> None:
        self.custom.labels(group, name).set(value)


class _Readings:
    """Values read at scrape time: workers' CPU and memory, the watchdog's counts."""

    def __init__(self, agent: AgentView) -> None:
        self._agent = agent

    def describe(self) -> list[Metric]:
        return []  # dynamic: nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        timers = agent.timer_server
        alive = GaugeMetricFamily("agentd_watchdog_alive", "1 while the watchdog is alive")
        alive.add_metric([], 1 if timers.alive() else 0)
        yield alive
        active = GaugeMetricFamily("agentd_timers_active", "Timers the watchdog holds")
        active.add_metric([], len(timers))
        yield active
        requests = CounterMetricFamily(
            "agentd_timer_requests",
            "Timer requests by outcome (reaped: a worker was signalled)",
            labels=["outcome"],
        )
        for outcome in (
            "acquired",
            "released",
            "expired",
            "reaped",
            "invalid",
            "oversized",
            "untrusted",
            "capped",
        ):
            requests.add_metric([outcome], timers.stats[outcome])
        yield requests
        checks = agent.node_check_status()
        if checks is not None:
            failures = CounterMetricFamily(
                "agentd_node_check_failures", "Failed runs of each --node-check", labels=["check"]
            )
            for check in checks["checks"]:
                failures.add_metric([check["name"]], checks["failures"].get(check["name"], 0))
            yield failures
            excluded = GaugeMetricFamily(
                "agentd_node_excluded", "1 while this node's checks keep it out of the job"
            )
            excluded.add_metric([], 1 if checks["excluded"] else 0)
            yield excluded
        restarts = GaugeMetricFamily("agentd_restart_count", "TORCHELASTIC_RESTART_COUNT now")
        restarts.add_metric([], agent.restart_count)
        yield restarts
        kinds = CounterMetricFamily(
            "agentd_restarts_by_kind",
            "In-process restarts (the "
            "survivors kept their process) and their fallbacks to new "
            "processes",
            labels=["kind"],
        )
        for kind, count in agent.restart_kinds.items():
            kinds.add_metric([kind], count)
        yield kinds
        fallbacks = CounterMetricFamily(
            "agentd_inprocess_fallbacks",
            "Restarts that replaced a surviving rank with a new process instead of keeping it "
            "in process, by reason",
            labels=["reason"],
        )
        for reason, count in agent.inprocess_status()["fallbacks"].items():
            fallbacks.add_metric([reason], count)
        yield fallbacks
        cpu = CounterMetricFamily(
            "agentd_worker_cpu_seconds",
            "CPU time of each worker and its children",
            labels=["local_rank", "rank"],
        )
        rss = GaugeMetricFamily(
            "agentd_worker_rss_bytes",
            "Resident memory of each worker and its children",
            labels=["local_rank", "rank"],
        )
        for worker in agent.worker_readings():
            labels = [str(worker["local_rank"]), str(worker["rank"])]
            cpu.add_metric(labels, worker["cpu_seconds"])
            rss.add_metric(labels, worker["rss_bytes"])
        yield cpu
        yield rss
        yield from _progress_metrics(agent)
        yield from _node_metrics(agent)
        yield from _store_metrics(agent)


def _store_metrics(agent: AgentView) -> Iterator[Metric]:
    """With store candidates: the serving candidate's term and this client's failovers."""
    from agentd.rendezvous.api import ReportsStore

    handler = agent.rdzv_handler
    status = handler.store_status() if isinstance(handler, ReportsStore) else None
    if not status or "failovers" not in status:
        return
    failovers = CounterMetricFamily(
        "agentd_store_failovers", "Times this agent's store client moved to another candidate"
    )
    failovers.add_metric([], status["failovers"])
    yield failovers
    term = GaugeMetricFamily("agentd_store_term", "The serving store candidate's term")
    term.add_metric([], status["term"])
    yield term


def _progress_metrics(agent: AgentView) -> Iterator[Metric]:
    """Step and section times per rank, heartbeat timeouts, hangs and stragglers."""
    from agentd.heartbeats.stragglers import BUCKETS

    steps = HistogramMetricFamily(
        "agentd_worker_step_seconds",
        "Time per step of each rank, from its heartbeats",
        labels=["local_rank", "rank"],
    )
    sections = HistogramMetricFamily(
        "agentd_worker_section_seconds",
        "Time in each named section, per rank",
        labels=["local_rank", "rank", "section"],
    )
    for local_rank, rank, name, counts, total, count in agent.step_times.histograms():
        cumulative, running = [], 0
        for bound, n in zip(BUCKETS, counts, strict=True):
            running += n
            cumulative.append((str(bound), running))
        cumulative.append(("+Inf", count))
        labels = [str(local_rank), str(rank)]
        if name == "step":
            steps.add_metric(labels, cumulative, total)
        else:
            sections.add_metric([*labels, name], cumulative, total)
    yield steps
    yield sections
    status = agent.heartbeat_status()
    timeouts = GaugeMetricFamily(
        "agentd_heartbeat_timeout_seconds",
        "The timeout the workers are held to, per step or section, and where it came from",
        labels=["of", "source"],
    )
    for name, timeout in status["timeouts"].items():
        timeouts.add_metric([name, timeout["source"]], timeout["seconds"])
    yield timeouts
    for name, text in (
        ("hangs", "Hangs found (workers silent past their timeout)"),
        ("stragglers", "Ranks found slower than the others' median"),
    ):
        counter = CounterMetricFamily(f"agentd_{name}", text)
        counter.add_metric([], status[name])
        yield counter
    messages = CounterMetricFamily(
        "agentd_progress_messages", "Heartbeat and section messages by outcome", labels=["outcome"]
    )
    for outcome, count in status["messages"].items():
        messages.add_metric([outcome], count)
    yield messages


def _node_metrics(agent: AgentView) -> Iterator[Metric]:
    """The job-wide comparison's last verdict: each node's ratio, and which are slow."""
    status = agent.slow_node_status()
    if status is None:
        return
    ratio = GaugeMetricFamily(
        "agentd_node_compute_ratio",
        "Each node's compute time over the other nodes' median (the job-wide comparison)",
        labels=["node"],
    )
    slow = GaugeMetricFamily(
        "agentd_node_straggler", "1 for a node named slower than the others", labels=["node"]
    )
    for node, value in status["ratios"].items():
        ratio.add_metric([node], value)
        slow.add_metric([node], 1 if node in status["slow"] else 0)
    yield ratio
    yield slow
