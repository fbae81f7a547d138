"""Which rank hung first, from what the monitor saw and what the stack dumps show.

All ranks of a data-parallel job go silent when one hangs: the others wait for it in
their next collective. Their last heartbeats are often a few milliseconds apart, so the
order of silence alone names the culprit at random. The dumps decide: a rank that is not
waiting in a collective (or in backward, where DDP's all_reduce waits), or has no dump,
is a suspect; among suspects the one silent the longest is named. When every local rank
waits, the culprit is on another node: the report says so (and names the local rank
silent longest, as the one this node reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentd.heartbeats.monitor import Silence
from agentd.heartbeats.stacks import StackDump
from agentd.heartbeats.timeouts import key_name


@dataclass(frozen=True)
class Verdict:
    """The hang's culprit, the one-line reason, and the details for ``result.json``."""

    culprit: Silence
    why: str
    details: dict[str, Any]


def judge(
    silences: list[Silence], dumps: dict[int, StackDump], ranks: dict[int, int], stacks_glob: str
) -> Verdict:
    """The verdict on ``silences`` (one per running watched worker; at least one overdue).

    ``ranks`` maps local to global ranks; ``stacks_glob`` names where the dumps are.
    """
    pool = list(silences)
    dumped = [s for s in pool if s.local_rank in dumps and dumps[s.local_rank].ok]
    waiting = {s.local_rank for s in dumped if dumps[s.local_rank].waiting_in}
    suspects = [s for s in pool if s.local_rank not in waiting] or pool
    culprit = max(suspects, key=lambda s: (s.silent_for, -s.local_rank))
    rank = ranks.get(culprit.local_rank, culprit.local_rank)
    if culprit.last_progress is None:
        since = "it resumed in process" if culprit.resumed else "it started"
        progress = f"sent no heartbeat since {since}"
    else:
        progress = f"no progress for {culprit.silent_for:.2f}s in the {key_name(culprit.section)}"
    parts = [f"hang: rank {rank} stopped first ({progress}; timeout {culprit.timeout.describe()})"]
    dump = dumps.get(culprit.local_rank)
    if dump is not None and dump.ok:
        inside = f", in {dump.waiting_in}" if dump.waiting_in else ""
        parts.append(f"it was at {dump.where}{inside}")
    waiting_in: dict[str, list[int]] = {}
    for s in dumped:
        if s is not culprit and (what := dumps[s.local_rank].waiting_in):
            waiting_in.setdefault(what, []).append(ranks.get(s.local_rank, s.local_rank))
    for what, who in waiting_in.items():
        listed = ", ".join(str(r) for r in sorted(who))
        parts.append(f"rank{'s' if len(who) > 1 else ''} {listed} waiting in {what}")
    elsewhere = len(waiting) == len(pool)
    if elsewhere:
        parts.append(
            "every local rank waits in a collective: the rank they wait for is on "
            "another node, whose agent names it"
        )
    parts.append(f"stacks in {stacks_glob}")
    details = {
        "rank": rank,
        "local_rank": culprit.local_rank,
        "section": culprit.section or None,
        "silent_for": round(culprit.silent_for, 3),
        "timeout": round(culprit.timeout.seconds, 3),
        "timeout_source": culprit.timeout.source,
        "learned_interval": round(culprit.timeout.observed, 6) or None,
        "waiting_on_another_node": elsewhere,
        "ranks": [
            _rank_entry(s, dumps.get(s.local_rank), ranks)
            for s in sorted(pool, key=lambda s: s.local_rank)
        ],
    }
    return Verdict(culprit, "; ".join(parts), details)


def _rank_entry(s: Silence, dump: StackDump | None, ranks: dict[int, int]) -> dict[str, Any]:
    return {
        "rank": ranks.get(s.local_rank, s.local_rank),
        "local_rank": s.local_rank,
        "pid": s.pid,
        "section": s.section or None,
        "steps": s.steps,
        "silent_for": round(s.silent_for, 3),
        "heartbeated": s.last_progress is not None,
        "resumed": s.resumed,
        "stack": dump.to_dict() if dump is not None else None,
    }
