"""Fakes for hang detection's unit tests: a clock the tests move, messages, a monitor."""

from __future__ import annotations

from pathlib import Path

from agentd.heartbeats.monitor import ProgressMonitor, Silence
from agentd.heartbeats.settings import HeartbeatSettings
from agentd.heartbeats.stragglers import StepTimes, Straggler
from agentd.heartbeats.timeouts import LearnedTimeouts
from agentd.wire.progress import ProgressMessage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def msg(kind: str, steps: int, at: float, section: str | None = None) -> ProgressMessage:
    return ProgressMessage(pid=100, kind=kind, steps=steps, at=at, section=section)


def make_monitor(settings: HeartbeatSettings | None = None, path: Path | None = None):
    clock = Clock()
    hangs: list[list[Silence]] = []
    stragglers: list[Straggler] = []
    timeouts = LearnedTimeouts(settings or HeartbeatSettings(), path)
    times = StepTimes(1.5, 3, stragglers.append)
    monitor = ProgressMonitor(timeouts, times, hangs.append, lambda lr: True, clock)
    return monitor, clock, hangs, stragglers
