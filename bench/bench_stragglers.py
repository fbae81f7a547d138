"""A slow node in a synchronous job: how soon is it named, and swapped for a spare?

    python bench/bench_stragglers.py [--runs 5] [--interval 5] [--record]
    python bench/bench_stragglers.py --soak 600       # no slow node: false namings
    python bench/bench_stragglers.py --store-load 256 # the store's cost at 256 nodes

**Swap runs.** Three agents run one job, ``--nnodes 3:3``, with the default
``--straggler-interval`` and ``--replace-stragglers``. One worker per node runs
``tests/drain/train_steps.py``: steps in lockstep, each computing 20 ms in
``agentd.section("compute")``. The third node computes twice as long. Once the world of 3
has been at it 5 s (steady training), a spare agent starts.

The figures:
* steady training -> the slow node named by group rank 0's agent, and by every member;
* named -> the spare's world of 3 running from the checkpoint step (drain included);
* steps lost: the step the spare's world resumed at, against every rank's checkpoint step;
* steps a second, over 2 s before the spare comes (at the slow node's pace) and after
  the swap (a fast node's pace is 1 / (20 ms + the lockstep's overhead)).

torchrun has no such thing (its job runs at the slow node's pace until it ends).

**Soak.** The same job with no slow node, for ``--soak`` seconds. It reports the namings
(0 is right) and each agent's store requests per 5 s (from ``/status``).

**Store load.** An ``agentd store`` process serves the comparison's traffic of N simulated
agents at their rate: each of N-1 members alternates between writing its times and reading
the verdict every interval; one leader alternates between reading all N and writing the
verdict. The interval is the agents' own in a job of N nodes (it stretches beyond 40), or
``--interval`` itself with ``--unpaced``. The figure is the store process's CPU over 60 s,
as a share of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import psutil
from report_files import reports as finished_reports
from run_control import end_run, free_port, wait_for

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "tests" / "drain" / "train_steps.py")
TOKEN = "bench-secret"
MARK_ENV = "BENCH_STRAGGLER_RUN"
NAMED = re.compile(r"^(\S+ \S+) WARNING agentd\.slownodes\.service: Straggler node (\S+):", re.M)
STEADY = 5.0
"""Seconds the world of 3 trains before the clock starts (and before the spare comes)."""
RATE_WINDOW = 2.0
"""Seconds over which a round's steps a second are counted."""


def notes(out: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in finished_reports(out, pattern)]


def stamp(text: str) -> float:
    """A log line's time (the agents' default format) as a Unix time."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def start_agent(
    out: Path, index: int, port: int, env: dict[str, str], *extra: str
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "job",
        "--nnodes",
        "3:3",
        "--nproc-per-node",
        "1",
        *extra,
        WORKER,
        str(out),
        str(out / "stop"),
    ]
    log_path = out / f"agent{index}.log"  # read while it runs, and after
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)


def step_rate(out: Path) -> float:
    """Steps a second of the newest round, over :data:`RATE_WINDOW` (rank 0's lockstep
    file: the step it finished, replaced whole at each step)."""
    newest = max(out.glob("steps_*"), key=lambda p: p.stat().st_mtime) / "0"
    first, began = int(newest.read_text()), time.monotonic()
    time.sleep(RATE_WINDOW)
    return (int(newest.read_text()) - first) / (time.monotonic() - began)


def base_env(marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTD_", "PET_"))}
    env.update(
        PYTHONWARNINGS="ignore",
        AGENTD_STORE_TOKEN=TOKEN,
        TEST_AGENTD_COMPUTE="0.02",
        PYTHONPATH=str(REPO),
        **{MARK_ENV: marker},
    )
    return env


def swap_once(interval: float, timeout: float) -> dict[str, float] | str:
    marker = os.urandom(6).hex()
    env = base_env(marker)
    procs: list[subprocess.Popen[bytes]] = []
    flags = ("--straggler-interval", str(interval), "--replace-stragglers")
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-") as tmp:
        out, port = Path(tmp), free_port()
        try:
            for i in range(3):
                slow = {"TEST_AGENTD_SLOW": "2"} if i == 2 else {}
                procs.append(start_agent(out, i, port, {**env, **slow}, *flags))
                if i == 0:
                    time.sleep(0.5)  # the first hosts the store
            if not wait_for(lambda: len(notes(out, "start_0_*")) == 3, timeout):
                return f"no world of 3 within {timeout:g}s"
            time.sleep(STEADY - RATE_WINDOW)
            before = step_rate(out)
            steady = time.time()
            procs.append(start_agent(out, 3, port, env, *flags))
            logs = [out / f"agent{i}.log" for i in range(3)]

            def names() -> list[list[tuple[str, str]]]:
                return [NAMED.findall(log.read_text()) for log in logs]

            if not wait_for(lambda: all(names()), timeout, interval=0.1):
                return f"not named by every member within {timeout:g}s: {names()}"
            found = names()
            wrong = {node for found_by in found for _, node in found_by}
            if len(wrong) != 1 or f"_{procs[2].pid}_" not in wrong.pop():
                return f"named the wrong node(s): {found}"
            first = min(stamp(at) for found_by in found for at, _ in found_by)
            every = max(stamp(found_by[0][0]) for found_by in found)
            if not wait_for(lambda: bool(notes(out, "ckpt_0_*")), timeout, interval=0.05):
                return f"no drain within {timeout:g}s"
            wait_for(lambda: len(notes(out, "ckpt_0_*")) == 3, 5)
            steps = {c["step"] for c in notes(out, "ckpt_0_*")}
            if len(steps) != 1:
                return f"the ranks checkpointed at different steps: {sorted(steps)}"
            at = steps.pop()

            def resumed() -> list[dict]:
                return [
                    s for s in notes(out, "start_*") if s["world"] == 3 and s["resumed_at"] == at
                ]

            if not wait_for(lambda: len(resumed()) == 3, timeout, interval=0.01):
                return f"the spare's world did not resume at step {at} within {timeout:g}s"
            swapped = time.time()
            lost = at - min(s["resumed_at"] for s in resumed())
            return {
                "named": first - steady,
                "named_everywhere": every - steady,
                "swapped": swapped - first,
                "steps_lost": float(lost),
                "rate_before": before,
                "rate_after": step_rate(out),
            }
        finally:
            (out / "stop").touch()
            end_run(procs, MARK_ENV, marker)


def soak(seconds: float, interval: float) -> None:
    marker = os.urandom(6).hex()
    env = base_env(marker)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-soak-") as tmp:
        out, port = Path(tmp), free_port()
        health = [free_port() for _ in range(3)]
        try:
            for i in range(3):
                flags = ("--straggler-interval", str(interval), "--health-port", str(health[i]))
                procs.append(start_agent(out, i, port, env, *flags))
                if i == 0:
                    time.sleep(0.5)
            if not wait_for(lambda: len(notes(out, "start_0_*")) == 3, 60):
                sys.exit("no world of 3 within 60 s")
            began = time.monotonic()
            time.sleep(seconds)
            took = time.monotonic() - began
            requests = []
            for port_ in health:
                with urllib.request.urlopen(f"http://127.0.0.1:{port_}/status", timeout=5) as a:
                    requests.append(json.load(a)["nodes"]["store_requests"])
            named = sum(len(NAMED.findall((out / f"agent{i}.log").read_text())) for i in range(3))
            per5 = [r / took * 5 for r in requests]
            print(
                f"  soak {took:.0f} s, 3 nodes, none slow: {named} namings; store requests per "
                f"agent per 5 s: {', '.join(f'{r:.2f}' for r in per5)}",
                flush=True,
            )
        finally:
            (out / "stop").touch()
            end_run(procs, MARK_ENV, marker)


async def store_traffic(endpoint: str, nodes: int, interval: float, seconds: float) -> int:
    """Every simulated agent's requests for ``seconds``; returns how many were made."""
    from agentd.store.http_client import HttpStore

    keys = [f"agentd/job/timings/0/{i}" for i in range(nodes)]
    doc = json.dumps({"node": "x" * 20, "sections": {"forward": 0.1, "backward": 0.2}}).encode()
    done = 0
    end = time.monotonic() + seconds

    async def member(index: int) -> None:
        nonlocal done
        store = HttpStore(endpoint, TOKEN)
        await asyncio.sleep(interval * index / nodes)  # spread, as independent agents are
        tick = 0
        try:
            while time.monotonic() < end:
                tick += 1
                if index == 0:
                    if tick % 2:
                        await store.multi_get(keys)
                    else:
                        await store.set("agentd/job/timings/0/verdict", doc)
                elif tick % 2:
                    await store.set(keys[index], doc, ttl=4 * interval)
                else:
                    await store.get("agentd/job/timings/0/verdict")
                done += 1
                await asyncio.sleep(interval)
        finally:
            await store.close()

    await asyncio.gather(*(member(i) for i in range(nodes)))
    return done


def store_load(nodes: int, interval: float, unpaced: bool, seconds: float = 60.0) -> None:
    from agentd.slownodes.settings import SlowNodeSettings

    if not unpaced:  # as the agents pace themselves in a job of this size
        interval = SlowNodeSettings(interval=interval).paced(nodes)
    port = free_port()
    env = {**os.environ, "AGENTD_STORE_TOKEN": TOKEN}
    server = subprocess.Popen(
        [sys.executable, "-m", "agentd", "store", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"127.0.0.1:{port}"
        if not wait_for(lambda: _answers(port), 30):
            sys.exit("the store did not start")
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        requests = asyncio.run(store_traffic(endpoint, nodes, interval, seconds))
        after = process.cpu_times()
        cpu = (after.user + after.system) - (before.user + before.system)
        print(
            f"  store load: {nodes} simulated agents, one request each per {interval:g} s, "
            f"{seconds:.0f} s: {requests} requests, the store used {cpu:.2f} s of CPU = "
            f"{100 * cpu / seconds:.2f} % of one core",
            flush=True,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--interval", type=float, default=5.0, help="--straggler-interval")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--soak", type=float, default=0.0, help="seconds, no slow node")
    parser.add_argument("--store-load", type=int, default=0, help="simulated agents")
    parser.add_argument(
        "--unpaced", action="store_true", help="store load at --interval, not as agents pace"
    )
    parser.add_argument("--record", action="store_true", help="write the medians to figures.json")
    args = parser.parse_args()
    if args.store_load:
        store_load(args.store_load, args.interval, args.unpaced)
        return
    if args.soak:
        soak(args.soak, args.interval)
        return
    print(
        f"3 nodes (the third computes 2x as long), --straggler-interval {args.interval:g}, "
        f"--replace-stragglers, a spare after {STEADY:g} s of training ({args.runs} runs, "
        f"{os.cpu_count()} CPUs)",
        flush=True,
    )
    results = []
    for run in range(args.runs):
        result = swap_once(args.interval, args.timeout)
        if isinstance(result, str):
            print(f"  run {run + 1}: {result}", flush=True)
            continue
        results.append(result)
        print(
            f"  run {run + 1}: named {result['named']:.1f} s (every member "
            f"{result['named_everywhere']:.1f} s), swapped {result['swapped']:.1f} s later, "
            f"{result['steps_lost']:.0f} steps lost; {result['rate_before']:.1f} steps/s "
            f"before, {result['rate_after']:.1f} after",
            flush=True,
        )
    if not results:
        return
    named = statistics.median(r["named"] for r in results)
    everywhere = statistics.median(r["named_everywhere"] for r in results)
    swapped = statistics.median(r["swapped"] for r in results)
    lost = max(r["steps_lost"] for r in results)
    before = statistics.median(r["rate_before"] for r in results)
    after = statistics.median(r["rate_after"] for r in results)
    print(
        f"  {len(results)}/{args.runs} swapped: named {named:.1f} s (every member "
        f"{everywhere:.1f} s), swapped {swapped:.1f} s later (medians), at most {lost:.0f} "
        f"steps lost; {before:.1f} steps/s with the slow node, {after:.1f} after the swap",
        flush=True,
    )
    if args.record:
        from figures import record

        command = f".venv/bin/python bench/bench_stragglers.py --runs {args.runs} --record"
        record("straggler_named", f"{everywhere:.0f} s", command)
        record("straggler_swapped", f"{swapped:.1f} s", command)


if __name__ == "__main__":
    main()
