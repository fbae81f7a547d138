"""The job view as text: a header, and a row per member of the round (``agentd status
--job``). Wide enough for a terminal of 120 columns at 8 ranks a node."""

from __future__ import annotations

import time
from typing import Any


def render_job(doc: dict[str, Any]) -> str:
    """``doc`` (:func:`agentd.jobview.document.job_document`) as a header and a table;
    the slowest node by compute ratio is marked where it is 1.5x the others or more."""
    store = doc.get("store") or {}
    where = store.get("serving") or store.get("where") or "-"
    store_text = f"{where} term {store['term']}" if "term" in store else where
    if store.get("tls"):
        store_text += " (TLS)"
    lines = [
        f"run {doc['run_id']}  round {doc['generation']}  world size {doc['world_size']}  "
        f"nodes {doc['size']} ({doc['min_nodes']}:{doc['max_nodes']})  "
        f"spares waiting {doc['spares']}  store {store_text}",
        "",
        f"{'NODE':>4} {'HOST':<16} {'STATE':<9} {'RANKS':<10} {'ATT':>3} {'RESTARTS':>8} "
        f"{'STEPS':>7} {'STEP/S':>7} {'RATIO':>6} {'AGE':>5}  LAST FAILURE / DRAIN",
    ]
    for row in doc["nodes"]:
        ratio = row.get("ratio")
        restarts = "-" if row["restarts"] is None else f"{row['restarts']}/{row['max_restarts']}"
        note = _failure(row["last_failure"]) if row.get("last_failure") else ""
        if row.get("drain"):
            note = f"draining: {row['drain']}" + (f"; {note}" if note else "")
        lines.append(
            f"{row['group_rank']:>4} {_cut(row['host'] or '-', 16):<16} {row['state']:<9} "
            f"{_ranks(row['ranks']):<10} {_dash(row['attempt']):>3} {restarts:>8} "
            f"{_dash(row['steps']):>7} {_dash(row['step_rate'], '.1f'):>7} "
            f"{_dash(ratio, '.2f'):>6}{'!' if ratio is not None and ratio >= 1.5 else ' '}"
            f"{_age(row['record_age']):>5}  {note}".rstrip()
        )
    for node, reason in (doc.get("excluded") or {}).items():
        lines.append(f"   - {node}: excluded by its node checks ({reason})")
    if doc.get("ended"):
        lines += ["", _ended(doc)]
    return "\n".join(lines) + "\n"


def _ended(doc: dict[str, Any]) -> str:
    """The line under the view of an agent whose run ended: how, and (where it did not
    succeed, so the job may go on without it) another node's agent to ask."""
    own = doc.get("answered_by")
    text = f"The run of node {own}'s agent, which answered, ended: {doc['ended']}."
    if len(doc["nodes"]) > 1:
        text += " The other rows are as it last read them."
    if doc["ended"] != "SUCCEEDED":
        others = [r["health"] for r in doc["nodes"] if r.get("health") and r["group_rank"] != own]
        if others:
            text += f" Another node's: agentd status --job {others[0]}"
    return text


def _ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 6]`` as ``0-3,6``."""
    spans: list[str] = []
    for rank in ranks:
        if spans and rank == int(spans[-1].split("-")[-1]) + 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{rank}"
        else:
            spans.append(str(rank))
    return ",".join(spans) or "-"


def _failure(failure: dict[str, Any]) -> str:
    how = failure.get("signal") or f"exit {failure.get('exitcode')}"
    when = time.strftime("%H:%M:%S", time.localtime(failure["at"])) if failure.get("at") else "?"
    return f"rank {failure.get('rank')} {how} at {when}"


def _dash(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"
