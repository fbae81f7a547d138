"""What a kubelet would see of bench/bench_chaos.py's agents: a liveness probe of each.

:class:`Prober` asks each agent's ``GET /livez`` once a second, as a Kubernetes liveness
probe does (``timeoutSeconds: 1``), while the agent runs and nothing struck it: an agent
frozen, killed or sent SIGTERM is not asked, and an answer whose agent was struck while it
was asked is not counted. ``/livez`` never depends on the store or the other hosts
(docs/health.md), so every other fault (its store's host frozen or lost, its log dir full,
a worker hung, its zygote stopped) must leave it answering 200 within the second. A
kubelet restarts a container after 3 failed probes in a row (``failureThreshold: 3``):
that is the invariant the bench checks; every failure is kept to be said.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

HEALTH = re.compile(r"Health endpoint on (http://\S+)")
EVERY = 1.0
"""Seconds between two rounds of probes (a kubelet's ``periodSeconds`` is 10; one a second
finds a stall ten times as short)."""
TIMEOUT = 1.0
"""A probe that takes longer failed (a kubelet's default ``timeoutSeconds``)."""
IN_A_ROW = 3
"""Failed probes in a row that would have a kubelet restart the container."""


class Probed(Protocol):
    """What the prober reads of one of the bench's agents."""

    index: int
    incarnation: int
    struck: int
    """Bumped by the bench whenever the agent is started, struck or thawed."""

    def probed(self) -> bool:
        """Whether a kubelet's probe should find it live now (running, nothing struck)."""

    def stderr_path(self) -> Path:
        """The current incarnation's log."""


@dataclasses.dataclass
class Failure:
    agent: int
    incarnation: int
    at: float
    why: str

    def __str__(self) -> str:
        return f"agent {self.agent}'s incarnation {self.incarnation} at {self.at:.1f}s: {self.why}"


class Prober(threading.Thread):
    """Probes ``agents`` from its own thread until :meth:`stop`; ``clock`` gives the
    bench's time (the faults' clock) for the failures' ``at``."""

    def __init__(self, agents: Sequence[Probed], clock: Callable[[], float]) -> None:
        super().__init__(daemon=True, name="chaos-prober")
        self.agents, self.clock = agents, clock
        self.sent = 0
        self.worst = 0.0
        self.failures: list[Failure] = []
        self.streaks: dict[tuple[int, int], int] = {}  # (agent, incarnation) -> failed in a row
        self.longest: dict[tuple[int, int], int] = {}
        self._urls: dict[tuple[int, int], str] = {}
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(EVERY):
            for agent in self.agents:
                self._probe(agent)

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(10)

    def _probe(self, agent: Probed) -> None:
        struck, incarnation = agent.struck, agent.incarnation
        url = self._url(agent)
        if url is None or not agent.probed():
            return
        began = time.monotonic()
        try:
            with urllib.request.urlopen(url + "/livez", timeout=TIMEOUT) as answer:
                why = "" if answer.status == 200 else f"answered {answer.status}"
        except urllib.error.HTTPError as error:
            why = f"answered {error.code}"
        except OSError as error:
            why = f"no answer ({error})"
        took = time.monotonic() - began
        if agent.struck != struck or not agent.probed():
            return  # struck meanwhile: what it answered says nothing of the agent
        self.sent += 1
        self.worst = max(self.worst, took)
        if took > TIMEOUT and not why:
            why = f"answered in {took:.2f}s"
        key = (agent.index, incarnation)
        if not why:
            self.streaks[key] = 0
            return
        self.failures.append(Failure(agent.index, incarnation, self.clock(), why))
        self.streaks[key] = self.streaks.get(key, 0) + 1
        self.longest[key] = max(self.longest.get(key, 0), self.streaks[key])

    def _url(self, agent: Probed) -> str | None:
        """The agent's current incarnation's endpoint, once its log has said it."""
        key = (agent.index, agent.incarnation)
        if key not in self._urls:
            try:
                found = HEALTH.search(agent.stderr_path().read_text(errors="replace"))
            except FileNotFoundError:
                found = None
            if found is None:
                return None
            self._urls[key] = found.group(1)
        return self._urls[key]

    def broken(self) -> list[str]:
        """The invariant: no agent failed ``IN_A_ROW`` probes in a row."""
        return [
            f"probes: {self.longest[key]} liveness probes in a row failed, the last "
            + str([f for f in self.failures if (f.agent, f.incarnation) == key][-1])
            for key in sorted(self.longest)
            if self.longest[key] >= IN_A_ROW
        ]
