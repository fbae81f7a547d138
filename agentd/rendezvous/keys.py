"""Where a run's rendezvous keeps its state in the store (one prefix per run).

Keys, under ``agentd/<run_id>/``::

    ctl/gen             the current round (generation); any agent ends a round by moving it
                        on with compare_set, so stale agents never end a newer round
    ctl/closed          JSON {"outcome", "node", "reason"}: no more rounds
    ctl/hb/<node>       each agent's heartbeat, a TTL key refreshed without a change
    ctl/forgotten       JSON {"generation", "size"}: the last round a store that restarted
                        or failed over forgot (a TTL key; see rendezvous/forgotten.py)
    ctl/rollcall        JSON {"id", "gen", "by"}: who of round gen still answers? (TTL key)
    rollcall/<id>/<node> that member's answer (TTL key; see rendezvous/roll_call.py)
    round/<g>/join      the arrival counter (add): an agent's arrival index is its group rank
    round/<g>/node/<i>  arrival i's JSON: node id, role, worker count, address, master port
    round/<g>/sealed    the member count n, set once: arrivals < n are the round's members;
                        "0" when the round ended before it was sealed
    round/<g>/done/<i>  member i's workers succeeded (the exit barrier)
    round/<g>/back/<G>, round/<G>/gone, round/<G>/gone/<node>, round/<G>/done
                        the count of a round against the last sealed one (see
                        rendezvous/accounting.py)
    round/<G>/out/<node> that member of round G stopped its workers and joined a later
                        round (a round sealed without it need not fence it: sealing.py)
    excluded/<node>     JSON: why that agent's node checks keep it out of the job (a TTL
                        key, deleted when it joins again)
    timings/<g>/<i>     JSON: member i's compute times in round g (a TTL key; see
                        rendezvous/timings.py)
    timings/<g>/verdict JSON: the job's comparison of round g's nodes, by group rank 0
    job/<g>/<i>         JSON: member i's status record in round g (a TTL key; see
                        rendezvous/job_records.py)
"""

from __future__ import annotations

SHARED_RUN_ID = "none"
"""torchrun's ``--rdzv-id`` default: every agent that reaches the store without one is of
this run."""


class RunKeys:
    """The keys of run ``run_id`` (see the module docstring)."""

    def __init__(self, run_id: str) -> None:
        self.prefix = f"agentd/{run_id}/"
        self.ctl = self.prefix + "ctl/"
        self.gen = self.ctl + "gen"
        self.closed = self.ctl + "closed"
        self.heartbeats = self.ctl + "hb/"
        self.rollcall = self.ctl + "rollcall"
        self.forgotten = self.ctl + "forgotten"

    def heartbeat(self, node: str) -> str:
        return self.heartbeats + node

    def roll_answer(self, call: str, node: str) -> str:
        return f"{self.prefix}rollcall/{call}/{node}"

    def excluded(self, node: str) -> str:
        return f"{self.prefix}excluded/{node}"

    def timings(self, generation: int, name: str) -> str:
        return f"{self.prefix}timings/{generation}/{name}"

    def job(self, generation: int, rank: int) -> str:
        return f"{self.prefix}job/{generation}/{rank}"

    def round(self, generation: int, name: str = "") -> str:
        """A key of round ``generation`` (its prefix, without ``name``)."""
        return f"{self.prefix}round/{generation}/{name}"
