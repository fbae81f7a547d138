"""What one ``/status`` costs the agent on a host with many processes.

    python bench/bench_status.py [--processes 1000] [--workers 8] [--requests 200]
        [--every 0]

Starts ``--processes`` idle processes (a busy host: other jobs, their data loaders), then
an agent supervising ``--workers`` sleeping workers, and asks its ``/status`` (which reads
each worker's CPU and memory, with their children) ``--requests`` times, ``--every``
seconds apart (0: back to back, as a watcher polling in a loop). Prints the latency's
median and p99 and the agent's CPU per request. The agent's loop does nothing else while
it reads: the per-request CPU is how long every other task of the agent waited.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from run_control import free_port, wait_for

WORKER = str(Path(__file__).parents[1] / "tests" / "workers" / "worker.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.0)
    args = parser.parse_args()
    idle = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.processes)]
    port = free_port()
    url = f"http://127.0.0.1:{port}/status"
    agent = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            agent = subprocess.Popen(
                [
                    *(sys.executable, "-m", "agentd", "run", "--health-port", str(port)),
                    *("--nproc-per-node", str(args.workers), "--log-dir", tmp, WORKER, "sleep"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "TEST_AGENTD_OUT": tmp},
            )

            def healthy() -> bool:
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        return json.loads(response.read())["state"] == "HEALTHY"
                except OSError:
                    return False

            if not wait_for(healthy, 60):
                print("the agent did not become healthy in 60 s", file=sys.stderr)
                return 1
            me = psutil.Process(agent.pid)
            began = me.cpu_times()
            latencies = []
            for _ in range(args.requests):
                start = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as response:
                    doc = json.loads(response.read())
                latencies.append((time.perf_counter() - start) * 1000)
                time.sleep(args.every)
            ended = me.cpu_times()
            assert len(doc["workers"]) == args.workers and all(
                w["rss_bytes"] > 0 for w in doc["workers"]
            ), doc["workers"]
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(30)
        for proc in idle:
            proc.kill()
        for proc in idle:
            proc.wait()
    cpu = (ended.user + ended.system - began.user - began.system) / args.requests * 1000
    latencies.sort()
    median, p99 = statistics.median(latencies), latencies[int(0.99 * len(latencies))]
    print(
        f"/status with {args.workers} workers beside {args.processes} idle processes, "
        f"{args.requests} requests {args.every} s apart: median {median:.2f} ms, "
        f"p99 {p99:.2f} ms, the agent's CPU "
        f"{cpu:.2f} ms a request"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
