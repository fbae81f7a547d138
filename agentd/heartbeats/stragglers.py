"""Step times per rank, from heartbeats: histograms, each rank against the others, stragglers.

A *series* is the step (time per heartbeat outside sections) or a section (time from its
entry to its exit). For each local rank and series the agent keeps a histogram (for
``/metrics``) and a recent value: the median of its last :data:`RECENT_SAMPLES` times, so
one long step or section (a GC pause, a node frozen for seconds) moves it not at all,
where a slowdown that lasts moves it within half as many. A rank whose step takes at
least ``factor`` times the median of the other local ranks' recent values, for
``steps`` steps in a row, is a straggler: reported once, until it catches up.

In synchronous data-parallel training every rank waits for the slowest in each step's
collective, so their step times match; time a section around the compute to compare
what each rank does on its own.
"""

from __future__ import annotations

import collections
import logging
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BUCKETS = (
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
    300.0,
)
RECENT_SAMPLES = 9
"""The times a rank's recent value is the median of. An exponential average (a new time
weighing 0.3) took one section of a node frozen for 5 s to 33x its 50 ms, and 9 more
to come back under 1.5x: long enough for the job-wide comparison to name, and swap, a
node that was not slow (``bench/bench_chaos.py --place tls --inprocess --stragglers``
seed 23, 2026-12-04)."""
STEP_SERIES = "step"
"""The series of whole steps (between two heartbeats); the others are sections."""
MAX_SERIES = 17
"""Series per rank (the step and 16 sections); more sections are not timed."""


@dataclass
class _Series:
    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    count: int = 0
    recent: float | None = None
    """The median of :attr:`last`."""
    last: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_SAMPLES)
    )
    slow_for: int = 0
    flagged: bool = False


@dataclass(frozen=True)
class Straggler:
    """Local rank ``local_rank`` (global ``rank``) ran ``series`` at ``ratio`` times the
    other ranks' median for ``steps`` steps."""

    local_rank: int
    rank: int
    series: str
    seconds: float
    median: float
    ratio: float
    steps: int


class StepTimes:
    """The series of every local rank; ``on_straggler`` hears of each straggler once."""

    def __init__(
        self, factor: float, steps: int, on_straggler: Callable[[Straggler], None]
    ) -> None:
        self.factor = factor
        self.steps = steps
        self._on_straggler = on_straggler
        self._series: dict[tuple[int, int, str], _Series] = {}
        self._ranks: dict[int, int] = {}
        """The global rank of each local rank in the current attempt."""

    def new_attempt(self, ranks: dict[int, int]) -> None:
        """A new attempt with these global ranks by local rank: recent values start over
        (the histograms keep counting: Prometheus counters never go back)."""
        self._ranks = dict(ranks)
        for series in self._series.values():
            series.recent, series.slow_for, series.flagged = None, 0, False
            series.last.clear()

    def observe(self, local_rank: int, name: str, seconds: float, steps: int = 1) -> None:
        """``steps`` occurrences of series ``name`` took ``seconds`` each, on average."""
        rank = self._ranks.get(local_rank, -1)
        key = (local_rank, rank, name)
        series = self._series.get(key)
        if series is None:
            if sum(1 for k in self._series if k[0] == local_rank) >= MAX_SERIES:
                return
            series = self._series[key] = _Series()
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                series.buckets[i] += steps
                break
        series.total += seconds * steps
        series.count += steps
        series.last.append(seconds)
        series.recent = statistics.median(series.last)
        self._judge(local_rank, rank, name, series, seconds, steps)

    def _judge(
        self, local_rank: int, rank: int, name: str, series: _Series, seconds: float, steps: int
    ) -> None:
        median = self._median_of_others(local_rank, name)
        if median is None or median <= 0:
            return
        if seconds < self.factor * median:
            if series.flagged:
                log.info(
                    "Rank %d caught up: %s %.3fs, the others' median %.3fs",
                    rank,
                    name,
                    seconds,
                    median,
                )
            series.slow_for, series.flagged = 0, False
            return
        series.slow_for += steps
        if series.slow_for >= self.steps and not series.flagged:
            series.flagged = True
            straggler = Straggler(
                local_rank, rank, name, seconds, median, seconds / median, series.slow_for
            )
            log.warning(
                "Straggler: rank %d (local %d) took %.3fs per %s, %.1fx the other "
                "ranks' median %.3fs, for %d steps",
                rank,
                local_rank,
                seconds,
                name,
                straggler.ratio,
                median,
                series.slow_for,
            )
            self._on_straggler(straggler)

    def _median_of_others(self, local_rank: int, name: str) -> float | None:
        others = [
            s.recent
            for (lr, r, n), s in self._series.items()
            if n == name and lr != local_rank and s.recent is not None and self._ranks.get(lr) == r
        ]
        return statistics.median(others) if others else None

    def status(self, local_rank: int) -> dict[str, Any]:
        """``local_rank``'s recent time per series, and its ratio to the others' median."""
        out: dict[str, Any] = {}
        rank = self._ranks.get(local_rank, -1)
        for (lr, r, name), series in self._series.items():
            if lr != local_rank or r != rank or series.recent is None:
                continue
            median = self._median_of_others(local_rank, name)
            out[name] = {
                "seconds": round(series.recent, 6),
                "vs_median": round(series.recent / median, 3) if median else None,
                "straggler": series.flagged,
            }
        return out

    def node_summary(self) -> dict[str, float]:
        """This node's recent time per section (not the step), the median over its ranks
        of the current attempt: what the job-wide comparison publishes."""
        per_section: dict[str, list[float]] = {}
        for (local_rank, rank, name), series in self._series.items():
            if name == STEP_SERIES or series.recent is None or self._ranks.get(local_rank) != rank:
                continue
            per_section.setdefault(name, []).append(series.recent)
        return {name: round(statistics.median(v), 6) for name, v in per_section.items()}

    def histograms(self) -> Iterator[tuple[int, int, str, list[int], float, int]]:
        """(local rank, rank, series, per-bucket counts, sum, count) of every series."""
        for (local_rank, rank, name), s in self._series.items():
            yield local_rank, rank, name, s.buckets, s.total, s.count
