"""/livez under load, while the agent supervises 4 workers: throughput, latency, cost.

    python bench/bench_health.py [--seconds 10] [--connections 8]

The load comes from a second process on loopback: wrk (``apt-get install wrk``) when it is
installed, else a bounded aiohttp client (which, on a small machine, measures itself as
much as the agent). Mid-way, a worker is SIGKILLed: the agent must still notice within
milliseconds. Prints requests/s, p50/p99 latency, the agent's CPU, and that detection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil
from run_control import free_port

WORKER = str(Path(__file__).parents[1] / "tests" / "workers" / "worker.py")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_healthy(url: str, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the agent exited")
        try:
            doc = get_json(url + "/status")
            if doc["state"] == "HEALTHY" and len(doc["workers"]) == 4:
                return doc
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError("the agent did not become HEALTHY")


def run_wrk(url: str, seconds: float, connections: int) -> dict:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p: str) -> float:
        value, unit = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "tool": "wrk",
        "rps": rps,
        "p50": pct("50"),
        "p99": pct("99"),
        "errors": int(errors.group(1)) if errors else 0,
    }


def run_python_client(url: str, seconds: float, connections: int) -> dict:
    import aiohttp

    latencies: list[float] = []
    errors = 0

    async def one_connection(session: aiohttp.ClientSession, stop: float) -> None:
        nonlocal errors
        while time.monotonic() < stop:
            began = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
                errors += response.status != 200
            latencies.append((time.perf_counter() - began) * 1000)

    async def main() -> float:
        stop = time.monotonic() + seconds
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as session:
            began = time.monotonic()
            await asyncio.gather(*(one_connection(session, stop) for _ in range(connections)))
            return time.monotonic() - began

    elapsed = asyncio.run(main())
    latencies.sort()
    return {
        "tool": "python aiohttp client",
        "rps": len(latencies) / elapsed,
        "p50": statistics.median(latencies),
        "p99": latencies[int(0.99 * len(latencies))],
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        env["TEST_AGENTD_OUT"] = tmp
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentd",
                "run",
                "--health-port",
                str(port),
                "--nproc-per-node",
                "4",
                "--max-restarts",
                "1",
                "--log-dir",
                tmp,
                WORKER,
                "sleep",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        try:
            before = wait_healthy(base, proc)
            victim = before["workers"][1]["pid"]
            agent = psutil.Process(proc.pid)
            cpu0 = sum(agent.cpu_times()[:2])
            killed_at: list[float] = []

            def kill_midway() -> None:
                time.sleep(args.seconds / 2)
                killed_at.append(time.time())
                os.kill(victim, signal.SIGKILL)

            threading.Thread(target=kill_midway, daemon=True).start()
            load = (run_wrk if shutil.which("wrk") else run_python_client)(
                base + "/livez", args.seconds, args.connections
            )
            cpu = sum(agent.cpu_times()[:2]) - cpu0
            after = wait_healthy(base, proc)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    failure = after["last_failure"] or {}
    detect_ms = (failure.get("timestamp", float("nan")) - killed_at[0]) * 1000
    print(
        f"/livez under load from {load['tool']}: {args.connections} connections, "
        f"{args.seconds:g}s, 4 workers supervised, {os.cpu_count()} CPUs"
    )
    print(f"  throughput   {load['rps']:8.0f} req/s   (target >= 5000)")
    print(f"  latency      p50 {load['p50']:.2f} ms   p99 {load['p99']:.2f} ms   (target p99 <= 5)")
    print(f"  non-200      {load['errors']}")
    print(f"  agent CPU    {cpu:.2f} s over {args.seconds:g} s = {cpu / args.seconds:.2f} cores")
    print(
        f"  a worker SIGKILLed mid-load was seen by the agent {detect_ms:.2f} ms later "
        f"(exit {failure.get('exitcode')}); the group restarted (restarts: "
        f"{after['restart_count']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
