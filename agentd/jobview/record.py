"""This node's status record: what its row in the job view shows, read off the agent.

A record is a small JSON object (a few hundred bytes for 8 workers)::

    node, host        the rendezvous node id and the address its workers are reached at
    state             the worker group's state (INIT, HEALTHY, ...)
    ranks             the global ranks of this node's workers this attempt
    attempt, restarts, max_restarts
    steps             the fewest steps any of its ranks reported (None: no heartbeats)
    step_rate         steps a second since the previous record (None: not known yet)
    step_time         the median over its ranks of the recent step time (seconds), else
                      one over the step rate
    compute           the recent compute time of a step, the sum of its sections' times
                      (the straggler comparison's measure; None: no sections timed)
    last_failure      {rank, exitcode, signal, at} of this node's last failed worker
    drain             the reason of the drain under way here: this node's own, or a
                      peer's its workers follow (None once they restarted without it)
    gpu_memory_mib    the GPU memory its workers hold, where NVML answers (else None)
    health            its agent's health endpoint (URL; None: it serves none), where
                      ``agentd logs`` asks for its lines
    at                when the record was taken (wall clock, seconds)
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentd.view import AgentView


class StepRate:
    """Steps a second between two readings of a step count."""

    def __init__(self) -> None:
        self._last: tuple[float, int] | None = None

    def reading(self, steps: int | None, now: float) -> float | None:
        """The rate since the previous reading (None: the first, or the count went back,
        as it does when the workers restart)."""
        last, self._last = self._last, (None if steps is None else (now, steps))
        if steps is None or last is None or now <= last[0] or steps < last[1]:
            return None
        return round((steps - last[1]) / (now - last[0]), 3)


def node_record(
    view: AgentView, node: str, host: str, rate: StepRate, gpu_memory_mib: int | None = None
) -> dict[str, Any]:
    """``view``'s record now (see the module docstring); ``rate`` keeps the last reading."""
    group = view.get_worker_group()
    watched = (view.heartbeat_status() or {}).get("workers") or []
    reporting = [w for w in watched if w.get("heartbeating") or w.get("steps")]
    steps = min((int(w["steps"]) for w in reporting), default=None)
    step_times = [
        float(w["times"]["step"]["seconds"]) for w in watched if "step" in (w.get("times") or {})
    ]
    sections = view.step_times.node_summary()
    failure = view.last_failure
    drain = _drain_under_way(view, node)
    now, rate_now = time.time(), rate.reading(steps, time.monotonic())
    if not step_times and rate_now:
        step_times = [1.0 / rate_now]
    return {
        "node": node,
        "host": host,
        "state": group.state.value,
        "ranks": sorted(w.global_rank for w in group.workers),
        "attempt": view.attempt,
        "restarts": view.restart_count,
        "max_restarts": group.spec.max_restarts,
        "steps": steps,
        "step_rate": rate_now,
        "step_time": round(statistics.median(step_times), 6) if step_times else None,
        "compute": round(sum(sections.values()), 6) if sections else None,
        "last_failure": None
        if failure is None
        else {
            "rank": failure.global_rank,
            "exitcode": failure.exitcode,
            "signal": failure.signal_name() or None,
            "at": failure.timestamp,
        },
        "drain": drain,
        "gpu_memory_mib": gpu_memory_mib,
        "at": now,
    }


def _drain_under_way(view: AgentView, node: str) -> str | None:
    """The reason of the drain under way here: this node's own until it ends, or a peer's
    requested since these workers started (once they restarted, the round re-formed
    without the peer: its drain is over here, though it is still the last one followed)."""
    drain = view.drain_status()
    if not drain or "outcome" in drain:
        return None
    if drain.get("node") != node:
        started = min((p.started_at for p in view.worker_processes().values()), default=None)
        if started is None or float(drain.get("requested_at") or 0.0) < started:
            return None
    return str(drain["reason"])
