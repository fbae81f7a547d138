"""The job view: one agent's account of its round, from every member's record.

``/job`` answers it, and ``agentd status --job`` draws it. A row per member of the
round, by group rank: its record (:mod:`agentd.jobview.record`), how old that record is,
and its compute ratio, its compute time over the median of the *other* members' (1.0:
like the others; the straggler comparison names a node at 1.5). A member whose record is
missing (it has just joined, or stopped writing) is a row with state ``UNKNOWN``.
"""

from __future__ import annotations

from typing import Any

from agentd.support.medians import median_of_others

COLUMNS = (
    "node",
    "host",
    "state",
    "ranks",
    "attempt",
    "restarts",
    "max_restarts",
    "steps",
    "step_rate",
    "step_time",
    "compute",
    "last_failure",
    "drain",
    "gpu_memory_mib",
    "health",
    "at",
)


def job_document(
    header: dict[str, Any], records: dict[int, dict[str, Any]], size: int, now: float
) -> dict[str, Any]:
    """The view of a round of ``size`` members from their ``records`` (by group rank),
    under ``header`` (run, round, world size, nodes, spares, store), at wall time ``now``."""
    rows: list[dict[str, Any]] = []
    for rank in range(size):
        record = records.get(rank)
        row: dict[str, Any] = {"group_rank": rank, **dict.fromkeys(COLUMNS)}
        if record is None:
            row.update(state="UNKNOWN", ranks=[])
        else:
            row.update({k: record.get(k) for k in COLUMNS})
        row["record_age"] = None if record is None else round(max(0.0, now - record["at"]), 3)
        rows.append(row)
    _add_ratios(rows)
    return {**header, "nodes": rows}


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's ``ratio``: its compute time (or step time, where no sections are timed
    anywhere) over the others' median."""
    measure = "compute" if any(r["compute"] is not None for r in rows) else "step_time"
    ordered = sorted(float(r[measure]) for r in rows if r[measure] is not None)
    for row in rows:
        mine = row[measure]
        others = None if mine is None else median_of_others(ordered, float(mine))
        row["ratio"] = round(float(mine) / others, 3) if others else None
