"""What agentd imports to run a trivial standalone job: its modules and their own time.

    python bench/import_cost.py [--runs 5]

Runs ``agentd run --standalone --nproc-per-node 1`` of a script that does nothing, with
``-X importtime`` and byte-code caching on (as an installed package has), and counts the
agentd modules it imports over the whole run, and their self import time (what each
module's own body costs, not what it imports from elsewhere). The count is exact and
checked by ``tests/test_startup_budget.py``; the time is a median, for the docs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from bench_agent import interpreter_start
from report_files import write_report

_LINE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \|\s*(agentd(?:\.[\w.]+)?)\s*$")


class ImportCost(NamedTuple):
    modules: list[str]
    """The agentd modules imported, in import order."""
    self_us: int
    """Their self import time, in microseconds."""


def import_cost(standalone: bool = True) -> ImportCost:
    """One run of a job that does nothing: ``--standalone``, or torchrun's default (the
    static rendezvous of one node)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        write_report(Path(tmp, "w.py"), "pass\n")
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "agentd", "run"]
            + (["--standalone"] if standalone else [])
            + ["--nproc-per-node", "1", "w.py"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the job failed (exit {done.returncode}): {done.stderr[-2000:]}")
    found = [m for m in map(_LINE.match, done.stderr.splitlines()) if m]
    return ImportCost([m[2] for m in found], sum(int(m[1]) for m in found))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--record", action="store_true", help="write the figures to docs/figures.json"
    )
    args = parser.parse_args()
    import_cost()  # the first run writes the byte-code caches
    costs = [import_cost() for _ in range(args.runs)]
    times = [c.self_us / 1000 for c in costs]
    floor = interpreter_start() * 1000
    print(
        f"standalone job: {len(costs[0].modules)} agentd modules, self import time median "
        f"{statistics.median(times):.1f} ms (min {min(times):.1f}, max {max(times):.1f}); "
        f"python -c pass takes {floor:.1f} ms here"
    )
    if args.record:
        from figures import record

        command = f".venv/bin/python bench/import_cost.py --runs {args.runs} --record"
        record(
            "standalone_modules",
            str(len(costs[0].modules)),
            command,
            "agentd modules a standalone job that does nothing imports, over its whole run",
        )
        record(
            "standalone_import_ms",
            f"{statistics.median(times):.0f} ms",
            command,
            f"their self import time (-X importtime), median of {args.runs} "
            f"({min(times):.0f}-{max(times):.0f} ms), byte code cached, on a machine where "
            f"python -c pass took {floor:.1f} ms",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
