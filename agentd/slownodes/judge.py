"""The job-wide comparison: each node's compute time against the other nodes', sustained.

Each node reports, per section, its local ranks' median recent time (the compute sections:
the step, which includes waiting in collectives, is the same on every node of a
synchronous job). For each section two or more nodes report, a node's ratio is its time
over the median of the *other* nodes' times (one sort per section, then a binary search
per node: :mod:`agentd.support.medians`); its ratio is the median of those. A node whose
ratio stays at or above ``factor`` for ``window`` seconds is slow: named once, until its
ratio falls below the factor again.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentd.support.medians import median_of_others


@dataclass
class NodeJudge:
    """Judges the summaries of one round's nodes over time."""

    factor: float
    window: float
    _over_since: dict[str, float] = field(default_factory=dict)
    slow: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The nodes named slow, with what named them."""

    def judge(self, times: Mapping[str, Mapping[str, float]], now: float) -> dict[str, Any]:
        """``times``: each node's seconds per section. Returns the verdict: the job's median
        per section, each node's ratio and the nodes named slow (by name, sorted)."""
        sections = _shared_sections(times)
        ordered = {s: sorted(t[s] for t in times.values() if s in t) for s in sections}
        medians = {s: statistics.median(values) for s, values in ordered.items()}
        ratios: dict[str, float] = {}
        for node, mine in times.items():
            per_section = []
            for section in sections:
                if section not in mine:
                    continue
                others = median_of_others(ordered[section], mine[section])
                if others is not None and others > 0:
                    per_section.append(mine[section] / others)
            if per_section:
                ratios[node] = statistics.median(per_section)
        for node in list(self._over_since):
            if node not in ratios:
                del self._over_since[node]
        for node, ratio in ratios.items():
            if ratio < self.factor:
                self._over_since.pop(node, None)
                self.slow.pop(node, None)
                continue
            since = self._over_since.setdefault(node, now)
            if node not in self.slow and now - since >= self.window:
                self.slow[node] = {"ratio": round(ratio, 3), "since": since}
        return {
            "median": {s: round(m, 6) for s, m in medians.items()},
            "nodes": {n: round(r, 3) for n, r in ratios.items()},
            "slow": sorted(n for n in self.slow if n in ratios),
        }


def _shared_sections(times: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The sections at least two nodes report."""
    counts: dict[str, int] = {}
    for sections in times.values():
        for section in sections:
            counts[section] = counts.get(section, 0) + 1
    return sorted(s for s, n in counts.items() if n >= 2)
