"""Where a restart's time goes: one agent, 4 trivial workers, a crash, traced in process.

    python bench/trace_restart.py [--runs 5]

Runs ``agentd run --standalone --nproc-per-node 4 --max-restarts 1 bench/worker.py crash``
in a child interpreter that stamps the moments of the restart (wrapping agentd's own
functions: a measuring aid, not an API), ``--runs`` times, and prints the median of each
moment in ms after the crashing worker's last line, with the first worker of the next
attempt running last. Byte-code caching on, as for an installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

TRACER = r"""
import functools, json, os, sys, time
stamps = {}

def stamp(name):
    stamps.setdefault(name, []).append(time.time())

def around(owner, attr, before, after=None):
    original = getattr(owner, attr)
    if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # coroutine
        @functools.wraps(original)
        async def wrapped(*args, **kwargs):
            stamp(before)
            result = await original(*args, **kwargs)
            if after:
                stamp(after)
            return result
    else:
        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            stamp(before)
            result = original(*args, **kwargs)
            if after:
                stamp(after)
            return result
    setattr(owner, attr, wrapped)

import agentd.agent.lifecycle as lifecycle
import agentd.preload.client as client
import agentd.preload.forked as forked
import agentd.workers.processes as processes
import agentd.agent.rendezvous_steps as steps

crashed = {"seen": False}
exited = processes.WorkerProcess.process_exited
def process_exited(self):
    if not crashed["seen"]:
        crashed["seen"] = True
        stamp("exit seen")
    return exited(self)
processes.WorkerProcess.process_exited = process_exited
around(processes, "signal_groups", "stop signal sent")
around(lifecycle, "stop_workers", "stop begins", "workers stopped")
around(steps.RendezvousSteps, "_rendezvous", "rendezvous begins", "rendezvous done")
around(lifecycle, "plan_workers", "plans begin", "plans done")
around(client.Zygote, "fork", "first request", "first worker known")
around(forked.ZygoteWorker, "release", "first worker let go")
import atexit
atexit.register(lambda: open(os.environ["TRACE_OUT"], "w").write(json.dumps(stamps)))
from agentd.cli import main
sys.argv = ["agentd", *sys.argv[1:]]
sys.exit(main())
"""


def one_restart() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=f"{BENCH}{os.pathsep}{ROOT}", TRACE_OUT=str(out / "trace.json"))
        cmd = [sys.executable, "-c", TRACER, "run", "--standalone", "--nproc-per-node", "4"]
        cmd += ["--max-restarts", "1", str(BENCH / "worker.py"), "crash", str(out)]
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=60)
        stamps = json.loads((out / "trace.json").read_text())
        crash = float((out / "crash_0").read_text())
        stamps["first worker running"] = [float(p.read_text()) for p in out.glob("start_1_*")]
        after = {name: [t for t in times if t >= crash] for name, times in stamps.items()}
        return {name: (min(times) - crash) * 1000 for name, times in after.items() if times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    one_restart()  # warm-up: byte-code caches
    runs = [one_restart() for _ in range(args.runs)]
    names = sorted(
        {n for run in runs for n in run},
        key=lambda n: statistics.median(run[n] for run in runs if n in run),
    )
    print(f"ms after the crashing worker's last line, median of {args.runs} restarts")
    for name in names:
        values = [run[name] for run in runs if name in run]
        print(f"  {statistics.median(values):6.2f}  {name}  ({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
