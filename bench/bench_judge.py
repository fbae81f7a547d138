"""The straggler judgement's cost on the judging agent's loop, at job sizes to 16,384.

    python bench/bench_judge.py [--sizes 1024,2048,16384] [--runs 3] [--record]

Group rank 0's agent judges every node's compute times each interval
(:class:`agentd.slownodes.judge.NodeJudge`): for each of 3 sections, each node's time
against the median of the other nodes'. One judgement of N nodes is timed (the median of
``--runs``), beside the same judgement done the way it was before (a median of the
others' list per node: O(N^2 log N)) where that takes under a minute, and the growth
exponent between the two largest sizes is printed (1 is linear).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentd.slownodes.judge import NodeJudge

SECTIONS = ("compute", "forward", "backward")
NAIVE_MAX = 2048
"""The largest size the old way is timed at (16,384 would take minutes)."""


def job(nodes: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """Each node's seconds per section; one node in a hundred twice as slow."""
    rng = random.Random(seed)
    return {
        f"node{i:05d}": {s: rng.uniform(0.09, 0.11) * (2 if i % 100 == 7 else 1) for s in SECTIONS}
        for i in range(nodes)
    }


def naive(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """The judgement's ratios as computed before: a median of the others' list per node."""
    ratios = {}
    for node, mine in times.items():
        per = [
            mine[s] / statistics.median([t[s] for n, t in times.items() if n != node])
            for s in SECTIONS
        ]
        ratios[node] = statistics.median(per)
    return ratios


def timed(call, runs: int) -> float:
    took = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        took.append(time.perf_counter() - began)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1024,2048,16384")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--record", action="store_true", help="write docs/figures.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    seconds: dict[int, float] = {}
    old: dict[int, float] = {}
    for nodes in sizes:
        times = job(nodes)
        verdict = NodeJudge(1.5, 0.0).judge(times, 0.0)
        seconds[nodes] = timed(lambda t=times: NodeJudge(1.5, 0.0).judge(t, 0.0), args.runs)
        line = f"{nodes:6d} nodes x {len(SECTIONS)} sections: {seconds[nodes] * 1000:8.1f} ms"
        if nodes <= NAIVE_MAX:
            before = old[nodes] = timed(lambda t=times: naive(t), 1)
            same = all(
                math.isclose(verdict["nodes"][n], round(r, 3), abs_tol=1e-3)
                for n, r in naive(times).items()
            )
            line += f"   (the old way {before * 1000:8.1f} ms, same ratios: {same})"
        print(line, f"  {len(verdict['slow'])} named slow", flush=True)
    if len(sizes) >= 2:
        small, large = sizes[-2], sizes[-1]
        exponent = math.log(seconds[large] / seconds[small]) / math.log(large / small)
        print(f"growth exponent {small} -> {large}: {exponent:.2f}")
    if args.record:
        from figures import record

        largest = sizes[-1]
        record(
            "straggler_judgement",
            f"{seconds[largest] * 1000:.0f} ms",
            f".venv/bin/python bench/bench_judge.py --sizes {args.sizes} --runs {args.runs} "
            "--record",
            f"one judgement of {largest:,} nodes x {len(SECTIONS)} sections on the judging "
            f"agent's loop (median of {args.runs}); in the same run the old way (a median of "
            "the others' list per node) took "
            + ", ".join(f"{s * 1000:.0f} ms at {n:,}" for n, s in sorted(old.items())),
        )


if __name__ == "__main__":
    main()
