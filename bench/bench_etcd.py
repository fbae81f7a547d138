"""Rendezvous on etcd vs on agentd's embedded store, and torchrun's etcd-v2, in the same run.

    python bench/bench_etcd.py [--runs 3] [--sizes 64,256] [--members 3] [--procs 4]
                               [--ops 400] [--etcd-endpoint URL]

  1. launch: 4 agents (1 worker each) start -> the last worker runs: agentd on etcd,
     agentd on its embedded store, and torchrun --rdzv-backend etcd-v2 on the same etcd
     (needs torch and python-etcd: ``pip install python-etcd``; skipped without them);
  2. rendezvous: N agentd handlers spread over --procs processes, each with its own client,
     rendezvous at once: time to complete and requests per node, on etcd (a cluster of
     --members) and on an `agentd store` (bench_rdzv.scale);
  3. store operations: latency p50/p99 of each Store operation, one client, on both, and
     a watch's wake-up (a set -> the watcher returns).

etcd is started here (Debian's etcd-server, --members members on loopback, v2 API on for
torch) unless ``--etcd-endpoint`` names a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests.helpers.etcd_server starts etcd for us

from bench_rdzv import (  # noqa: E402
    NODES,
    launchers,
    line,
    measure_launch,
    reap,
    scale,
    start_store,
)

from agentd.store.api import Store  # noqa: E402


def etcd_flags(endpoint: str, backend: str = "etcd") -> list[str]:
    return [
        "--rdzv-backend",
        backend,
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        f"launch-{time.monotonic_ns()}",
        "--nnodes",
        str(NODES),
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "0",
    ]


def store_factory(kind: str, target: str) -> Callable[[], Store]:
    from agentd.store.etcd.store import EtcdStore
    from agentd.store.http_client import HttpStore

    if kind == "etcd":
        prefix = f"/bench/{time.monotonic_ns()}/"
        return lambda: EtcdStore([target], prefix=prefix)
    return lambda: HttpStore(target)


def previous(i: int) -> bytes | None:
    """What the compare_set benchmark key holds before call ``i``."""
    return None if i == 0 else str(i - 1).encode()


async def op_latencies(store: Store, count: int) -> dict[str, list[float]]:
    """Seconds per call of each operation, ``count`` calls each, one after another."""
    await store.set("hb", b"alive", ttl=30)
    keys = [f"m/{i}" for i in range(8)]
    await store.multi_set({k: b"v" for k in keys})
    ops: dict[str, Callable[[int], Awaitable[object]]] = {
        "set": lambda i: store.set("k", str(i).encode()),
        "get": lambda i: store.get("k"),
        "add": lambda i: store.add("n", 1),
        "compare_set": lambda i: store.compare_set("c", previous(i), str(i).encode()),
        "refresh": lambda i: store.refresh("hb", 30),
        "multi_get(8)": lambda i: store.multi_get(keys),
    }
    times: dict[str, list[float]] = {}
    for name, call in ops.items():
        times[name] = []
        for i in range(count):
            began = time.perf_counter()
            await call(i)
            times[name].append(time.perf_counter() - began)
    times["watch wake-up"] = await watch_wakeups(store, max(20, count // 4))
    return times


async def watch_wakeups(store: Store, count: int) -> list[float]:
    """Seconds from a set (its call starting) to a watcher on its key returning."""
    wakeups = []
    for i in range(count):
        revision = await store.revision()
        watcher = asyncio.ensure_future(store.watch("w/", revision, 10))
        await asyncio.sleep(0.005)  # the watch is open
        began = time.perf_counter()
        await store.set("w/k", str(i).encode())
        result = await watcher
        wakeups.append(time.perf_counter() - began)
        assert result.events, "the watch missed the set"
    return wakeups


async def latencies(new_store: Callable[[], Store], count: int) -> dict[str, list[float]]:
    store = new_store()
    try:
        return await op_latencies(store, count)
    finally:
        await store.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    from tests.helpers.etcd_server import EtcdCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="64,256", help="node counts for the rendezvous")
    parser.add_argument("--members", type=int, default=3, help="etcd members we start")
    parser.add_argument("--procs", type=int, default=4, help="processes for the handlers")
    parser.add_argument("--ops", type=int, default=400, help="calls per store operation")
    parser.add_argument("--etcd-endpoint", help="a running etcd (host:port) instead of ours")
    args = parser.parse_args()
    sizes = [int(s) for s in re.split(r"[ ,]+", args.sizes) if s]

    with tempfile.TemporaryDirectory() as tmp:
        cluster = None
        if args.etcd_endpoint:
            endpoint = args.etcd_endpoint
        else:
            cluster = EtcdCluster(
                Path(tmp), size=args.members, extra_args=("--enable-v2=true",)
            ).start()
            endpoint = cluster.members[0].endpoint
            args.etcd_pids = [m.proc.pid for m in cluster.members if m.proc is not None]
            args.etcd_urls = cluster.urls
        store_proc, store_endpoint = start_store()
        try:
            report(args, sizes, endpoint, store_endpoint)
        finally:
            reap([store_proc])
            if cluster is not None:
                cluster.stop()
    return 0


def report(args: argparse.Namespace, sizes: list[int], etcd: str, embedded: str) -> None:
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
    print(f"etcd {version.split()[2] if version else '?'} on 127.0.0.1; {args.runs} runs each")
    cmds = launchers()
    launch: dict[str, list[float]] = {"agentd etcd": [], "agentd store": []}
    torch_etcd = "torchrun" in cmds and importlib.util.find_spec("etcd") is not None
    if torch_etcd:
        launch["torchrun etcd-v2"] = []
    for _ in range(args.runs):
        launch["agentd etcd"].append(measure_launch(cmds["agentd"], etcd_flags(etcd)))
        launch["agentd store"].append(measure_launch(cmds["agentd"]))
        if torch_etcd:
            flags = etcd_flags(etcd, "etcd-v2")
            launch["torchrun etcd-v2"].append(measure_launch(cmds["torchrun"], flags))
    print(f"\nlaunch of {NODES} agents -> the last worker running")
    for name, values in launch.items():
        print(line(name, values, width=17))
    if torch_etcd:
        value = statistics.median(launch["torchrun etcd-v2"]) / statistics.median(
            launch["agentd etcd"]
        )
        print(f"  ratio     torchrun etcd-v2 / agentd etcd = {value:.1f}x")
    else:
        print("  (torchrun etcd-v2 skipped: needs torch and python-etcd)")

    members = len(getattr(args, "etcd_urls", [])) or 1
    print(
        f"\nrendezvous of N handlers ({args.procs} processes, a client each): median time, "
        f"requests per node, server CPU per join (etcd: {members} member(s), summed)"
    )
    urls = getattr(args, "etcd_urls", [f"http://{etcd}"])
    pids = getattr(args, "etcd_pids", [])
    for n in sizes:
        for kind in ("etcd", "store"):
            if kind == "etcd" and not pids:
                print("  (etcd's CPU is measured only for the etcd started here)")
            on = (urls, pids) if kind == "etcd" else None
            runs = [scale(n, args.procs, on) for _ in range(args.runs)]
            elapsed = statistics.median(r["seconds"] for r in runs) * 1000
            cpu = statistics.median(r["store_cpu_us"] for r in runs)
            print(
                f"  {n:4d} nodes on {kind:5s}: {elapsed:8.1f} ms, "
                f"{runs[0]['requests']:.1f} requests per node, {cpu:.0f} us CPU per join"
            )

    print(f"\nstore operation latency, one client, {args.ops} calls each (ms)")
    print(
        f"  {'operation':15s} {'etcd p50':>9s} {'etcd p99':>9s} {'store p50':>10s} "
        f"{'store p99':>10s}"
    )
    on_etcd = asyncio.run(latencies(store_factory("etcd", f"http://{etcd}"), args.ops))
    on_store = asyncio.run(latencies(store_factory("store", embedded), args.ops))
    for op in on_etcd:
        a, b = on_etcd[op], on_store[op]
        print(
            f"  {op:15s} {pct(a, 0.5):9.2f} {pct(a, 0.99):9.2f} {pct(b, 0.5):10.2f} "
            f"{pct(b, 0.99):10.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
