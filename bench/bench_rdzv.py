"""Multi-node rendezvous on one machine: agentd vs torchrun's c10d, measured in the same run.

    python bench/bench_rdzv.py [--runs 3] [--sizes 64,256]

  1. launch: 4 agents (1 worker each) start -> the last worker runs (agentd run vs torchrun);
  2. last join: 3 nodes wait in the rendezvous, the 4th joins -> every node has the result
     (the handlers alone, agentd's DynamicRendezvous vs torch's c10d DynamicRendezvousHandler);
  3. scale: N agentd handlers in one process rendezvous through an `agentd store` process:
     time to complete and store requests per node (agentd alone);
  4. crash propagation: a worker on node 0 crashes -> node 1's worker gets SIGTERM.
torch parts run only where torch is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from report_files import wait_reports

if TYPE_CHECKING:
    from agentd.store.api import Store

HERE = Path(__file__).parent
NODES = 4


def free_port() -> int:
    from agentd.rendezvous.static import free_port as pick

    return pick("127.0.0.1")


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def launchers() -> dict[str, list[str]]:
    found = {"agentd": [sys.executable, "-m", "agentd", "run"]}
    if importlib.util.find_spec("torch") is not None:
        found["torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    return found


def reap(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rdzv_args(port: int, run_id: str, restarts: int = 0) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            run_id, "--nnodes", str(NODES), "--nproc-per-node", "1",
            "--max-restarts", str(restarts)]  # fmt: skip


def measure_launch(cmd: list[str], rdzv: list[str] | None = None) -> float:
    """Seconds from starting 4 agents to the last of their workers running; ``rdzv`` are
    the rendezvous flags (default: c10d on a free port, the first agent hosts the store)."""
    rdzv = rdzv or rdzv_args(free_port(), "launch")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, str(i)) for i in range(NODES)]
        for out in outs:
            out.mkdir()
        t0 = time.time()
        procs = [subprocess.Popen([*cmd, *rdzv, str(HERE / "worker.py"),
                                   "exit", str(out)], env=env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for out in outs]  # fmt: skip
        try:
            starts = wait_reports([out / "start_0_0" for out in outs])
            return max(map(float, starts)) - t0
        finally:
            reap(procs)


def measure_last_join(backend: str) -> float:
    """Seconds from the last node starting to join to every node holding the result."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp, "go")
        outs = [Path(tmp, f"node{i}.json") for i in range(NODES)]
        procs = [subprocess.Popen(
            [sys.executable, str(HERE / "rdzv_node.py"), backend, f"127.0.0.1:{port}", "last",
             str(NODES), "1" if i == 0 else "0", str(out), str(go) if i == NODES - 1 else ""],
            env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i, out in enumerate(outs)]  # fmt: skip
        try:
            wait_reports([Path(f"{out}.ready") for out in outs])
            time.sleep(1.5)  # the first three are waiting in the rendezvous
            go.touch()
            results = [json.loads(text) for text in wait_reports(outs)]
            return max(r["done"] for r in results) - results[-1]["joined"]
        finally:
            reap(procs)


def start_store() -> tuple[subprocess.Popen[str], str]:
    """An ``agentd store`` process on a free port; (process, host:port)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentd", "store", "--port", str(port)],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stderr is not None
    while "Store listening" not in proc.stderr.readline():
        pass
    return proc, f"127.0.0.1:{port}"


async def rendezvous_at_once(new_store: Callable[[], Store], n: int) -> tuple[float, float]:
    """(seconds, store requests per node) for ``n`` agentd handlers, each with its own
    client from ``new_store``, rendezvousing at once."""
    from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
    from agentd.store.connect import OpenedStore

    clients = [new_store() for _ in range(n)]

    def opener(client: Store) -> Callable[[], Awaitable[OpenedStore]]:
        async def open_store() -> OpenedStore:
            return OpenedStore(client, client.close)

        return open_store

    settings = RendezvousSettings(min_nodes=n, max_nodes=n)
    handlers = [DynamicRendezvous(f"scale{n}", opener(c), settings) for c in clients]
    try:
        for handler in handlers:
            await handler._open()
            await handler.store.revision()  # connected before the clock starts
        for client in clients:
            client.requests = 0  # type: ignore[attr-defined]
        began = time.perf_counter()
        infos = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        elapsed = time.perf_counter() - began
        assert sorted(i.group_rank for i in infos) == list(range(n))
        return elapsed, sum(c.requests for c in clients) / n  # type: ignore[attr-defined]
    finally:
        for handler in handlers:
            await handler.shutdown()


async def scale(n: int) -> tuple[float, float]:
    """:func:`rendezvous_at_once` through an ``agentd store`` process."""
    from agentd.store.http_client import HttpStore

    store, endpoint = start_store()
    try:
        return await rendezvous_at_once(lambda: HttpStore(endpoint), n)
    finally:
        reap([store])


def measure_crash(cmd: list[str]) -> float:
    """Seconds from a worker crash on node 0 to SIGTERM reaching node 1's worker."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        args = [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "crash",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "1",
        ]
        procs = [subprocess.Popen([*cmd, *args, str(HERE / "crash_worker.py"), str(out)],
                                  env=env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(2)]  # fmt: skip
        try:
            crash, stopped = map(float, wait_reports([out / "crash", out / "stopped_1"]))
            return stopped - crash
        finally:
            reap(procs)


def line(
    name: str, values: list[float], unit: str = "ms", scale_by: float = 1000, width: int = 9
) -> str:
    v = [x * scale_by for x in values]
    mid = statistics.median(v)
    return f"  {name:{width}s} median {mid:9.1f} {unit}  min {min(v):9.1f}  max {max(v):9.1f}"


def ratio(results: dict[str, list[float]]) -> str:
    if "torchrun" not in results or "agentd" not in results:
        return ""
    value = statistics.median(results["torchrun"]) / statistics.median(results["agentd"])
    return f"  ratio     torchrun/agentd = {value:.1f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="64,256", help="handler counts for the scale test")
    args = parser.parse_args()
    cmds = launchers()
    backends = {"agentd": "agentd", **({"torchrun": "torch"} if "torchrun" in cmds else {})}
    print(f"{NODES} nodes on {os.cpu_count()} CPUs, {args.runs} runs each"
          + ("" if "torchrun" in cmds else " (torch not installed: agentd alone)"))  # fmt: skip

    figures = {
        "launch": {n: [] for n in cmds},
        "last join": {n: [] for n in cmds},
        "crash": {n: [] for n in cmds},
    }  # type: dict[str, dict[str, list[float]]]
    for _ in range(args.runs):  # interleaved, so drift hits both alike
        for name, cmd in cmds.items():
            figures["launch"][name].append(measure_launch(cmd))
            figures["last join"][name].append(measure_last_join(backends[name]))
            figures["crash"][name].append(measure_crash(cmd))
    titles = {
        "launch": f"launch of {NODES} agents -> the last worker running",
        "last join": "last node joins -> every node has the rendezvous result",
        "crash": "worker crash on node 0 -> node 1's worker gets SIGTERM",
    }
    for key, title in titles.items():
        print(f"\n{title}")
        for name, values in figures[key].items():
            print(line(name, values))
        if text := ratio(figures[key]):
            print(text)
    print("\nagentd rendezvous at scale (handlers in one process, one `agentd store`)")
    for n in (int(s) for s in re.split(r"[ ,]+", args.sizes) if s):
        elapsed, per_node = asyncio.run(scale(n))
        print(f"  {n:4d} nodes: {elapsed * 1000:8.1f} ms, {per_node:.1f} store requests per node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
