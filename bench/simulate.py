"""The membership protocol under seeded fault schedules (see tests/sim/world.py).

    python bench/simulate.py [--seeds 10000] [--start 0] [--kinds kill,term,...] [--jobs N]
    python bench/simulate.py --seed N
    python bench/simulate.py --failover ...  # agent 0 serves the store, the others stand by
    python bench/simulate.py --closing ...  # jobs that end, with spares (S9)

Runs agentd's rendezvous, membership, release and store code for each seed's agents and
faults on a virtual clock, in one process per CPU (``--jobs``), and ends with one line:
``N seeds, M requests, K seeds with invariant violations`` and the count by invariant
(docs/protocol.md). ``--seed N`` runs one seed and prints its schedule, what happened,
the violations, and the fewest of its faults that still break the first violated
invariant.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sim.world import (
    KINDS,
    MORE_KINDS,
    Schedule,
    closing_schedule_for,
    schedule_for,
    shrink,
    simulate,
)

Draw = Callable[[int], Schedule]
"""A seed's schedule: :func:`schedule_for` with the kinds and failover given, or
:func:`closing_schedule_for` (picklable, for the pool's processes)."""


def _invariants(violations: list[str]) -> list[str]:
    return sorted({line.split(" ")[0] for line in violations})


def one(seed: int, draw: Draw) -> int:
    schedule = draw(seed)
    outcome = simulate(schedule)
    print(schedule.describe())
    print("\n".join(outcome.notes))
    if not outcome.violations:
        print(f"no violation ({outcome.requests} requests, {outcome.rounds} rounds sealed)")
        return 0
    first = _invariants(outcome.violations)[0]

    def fails(candidate: Schedule) -> bool:
        return first in _invariants(simulate(candidate).violations)

    print(f"\nthe fewest faults that still break {first}:")
    print(shrink(schedule, fails).describe())
    return 1


CHUNK = 50
"""Seeds per task handed to a process of the pool."""


def run_chunk(job: tuple[range, Draw]) -> tuple[int, dict[int, list[str]]]:
    """Run the seeds of one chunk: their requests, and the seeds with violations."""
    seeds, draw = job
    requests = 0
    failing: dict[int, list[str]] = {}
    for seed in seeds:
        outcome = simulate(draw(seed))
        requests += outcome.requests
        if outcome.violations:
            failing[seed] = _invariants(outcome.violations)
    return requests, failing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--seed", type=int, help="run this seed alone, and say why it fails")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per CPU)"
    )
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"the faults to draw from (also: {', '.join(MORE_KINDS)})",
    )
    parser.add_argument(
        "--closing",
        action="store_true",
        help="jobs that end, with spares (S9): every node's worker succeeds, among up to two "
        "faults; half of them with --failover",
    )
    parser.add_argument(
        "--failover",
        action="store_true",
        help="the store served by agent 0 as the others stand by (store faults: its host's)",
    )
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - {*KINDS, *MORE_KINDS}
    if unknown:
        known = ", ".join((*KINDS, *MORE_KINDS))
        parser.error(f"--kinds: {sorted(unknown)} are not fault kinds ({known})")
    draw: Draw = (
        closing_schedule_for
        if args.closing
        else partial(schedule_for, kinds=kinds, failover=args.failover)
    )
    if args.seed is not None:
        return one(args.seed, draw)
    began = time.perf_counter()
    seeds = range(args.start, args.start + args.seeds)
    chunks = [(seeds[i : i + CHUNK], draw) for i in range(0, len(seeds), CHUNK)]
    requests = 0
    failing: dict[int, list[str]] = {}
    with concurrent.futures.ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for done_requests, done_failing in pool.map(run_chunk, chunks):
            requests += done_requests
            failing.update(done_failing)
    by_invariant = collections.Counter(i for found in failing.values() for i in found)
    for invariant, count in sorted(by_invariant.items()):
        seeds = [s for s, found in failing.items() if invariant in found]
        shown = ", ".join(map(str, sorted(seeds)[:40])) + (", ..." if len(seeds) > 40 else "")
        print(f"{invariant}: {count} seed(s): {shown}")
    print(
        f"{args.seeds} seeds, {requests} requests, {len(failing)} seeds with invariant "
        f"violations ({time.perf_counter() - began:.0f} s)"
    )
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
