"""Multi-node rendezvous on one machine: agentd vs torchrun's c10d, measured in the same run.

    python bench/bench_rdzv.py [--runs 3] [--sizes 256,1024] [--procs 4] [--only-scale]

  1. launch: 4 agents (1 worker each) start -> the last worker runs (agentd run vs torchrun);
  2. last join: 3 nodes wait in the rendezvous, the 4th joins -> every node has the result
     (the handlers alone, agentd's DynamicRendezvous vs torch's c10d DynamicRendezvousHandler);
  3. scale: N agentd handlers, spread over --procs processes, rendezvous through an
     `agentd store` process: time to complete, store requests per node, the store's CPU
     per join and RSS, and the fitted exponent of time against N (agentd alone);
  4. crash propagation: a worker on node 0 crashes -> node 1's worker gets SIGTERM.
torch parts run only where torch is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from pathlib import Path
from typing import Any

from report_files import wait_reports

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
    return [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--nnodes",
        str(NODES),
        "--nproc-per-node",
        "1",
        "--max-restarts",
        str(restarts),
    ]


def measure_launch(cmd: list[str], rdzv: list[str] | None = None) -> float:
    """Seconds from starting 4 agents to the last of their workers running; ``rdzv`` are
    the rendezvous flags (default: c10d on a free port, the first agent hosts the store)."""
    rdzv = rdzv or rdzv_args(free_port(), "launch")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, str(i)) for i in range(NODES)]
        for out in outs:
            out.mkdir()
        t0 = time.time()
        procs = []
        for out in outs:
            log_path = out / "launcher.err"
            with open(log_path, "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [*cmd, *rdzv, str(HERE / "worker.py"), "exit", str(out)],
                        env=env(),
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )
        try:
            starts = wait_reports([out / "start_0_0" for out in outs])
            return max(map(float, starts)) - t0
        except TimeoutError:  # say why, from each launcher's last lines, once it ended
            reap(procs)
            for i, out in enumerate(outs):
                lines = (out / "launcher.err").read_text(errors="replace").splitlines()
                print(f"  launcher {i} ({cmd[-1]}), its last lines: {lines[-4:]}", flush=True)
            raise
        finally:
            reap(procs)


def spread(values: list[float]) -> str:
    """``median ms (min-max)``."""
    ms = sorted(v * 1000 for v in values)
    return f"{statistics.median(ms):.0f} ms ({ms[0]:.0f}-{ms[-1]:.0f})"


def many_agents(count: int) -> dict[str, float]:
    """``count`` agentd agents (1 worker each) start at once on this machine and
    rendezvous through the first one's store, with the agents' defaults: seconds from the
    start to the moment every agent is up and waiting in the rendezvous (the last one's
    "joined round 0", from its log), and from then to the moment every agent's worker
    runs; how many agents exited 0, lines of their stderr at WARNING or worse, and the
    agents' peak RSS (MB, each, the guardian apart)."""
    import psutil

    rdzv = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "many",
        "--nnodes",
        str(count),
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "0",
        "--rdzv-conf",
        "join_timeout=600",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, str(i)) for i in range(count)]
        for out in outs:
            out.mkdir()
        logs = [Path(tmp, f"agent{i}.log") for i in range(count)]
        t0 = time.time()
        procs = []
        for out, log in zip(outs, logs, strict=True):
            with log.open("w") as stderr:
                procs.append(
                    subprocess.Popen(
                        [
                            *launchers()["agentd"],
                            *rdzv,
                            str(HERE / "worker.py"),
                            "sleep",
                            str(out),
                            "3",
                        ],
                        env=env(),
                        stdout=subprocess.DEVNULL,
                        stderr=stderr,
                    )
                )
        peak = 0.0
        try:
            starts = wait_reports([out / "start_0_0" for out in outs], timeout=600)
            last_worker = max(map(float, starts))
            for proc in procs:  # every worker sleeps 3 s: the agents are all up
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, psutil.Process(proc.pid).memory_info().rss / 2**20)
            codes = [proc.wait(300) for proc in procs]
        finally:
            reap(procs)
        texts = [log.read_text() for log in logs]
        all_waiting = max(joined_at(text) for text in texts)
        problems = [
            line
            for text in texts
            for line in text.splitlines()
            if re.search(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback", line)
        ]
    for line in problems[:5]:
        print(f"    {line}")
    return {
        "up": all_waiting - t0,
        "seconds": last_worker - all_waiting,
        "ok": codes.count(0),
        "problems": len(problems),
        "rss_mb": peak,
    }


def joined_at(log: str) -> float:
    """When an agent's log says it joined round 0, or completed it (the last to join
    completes it at once): epoch seconds, from the log's local time."""
    found = re.search(
        r"^(\S+ \S+),(\d{3}) INFO agentd\.\S+: .*(joined round 0|Rendezvous "
        r"complete: .* generation=0 )",
        log,
        re.MULTILINE,
    )
    if found is None:
        raise RuntimeError(f"an agent never joined round 0: {log[-2000:]}")
    stamp = time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S"))
    return stamp + int(found[2]) / 1000


def measure_last_join(backend: str) -> float:
    """Seconds from the last node starting to join to every node holding the result."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp, "go")
        outs = [Path(tmp, f"node{i}.json") for i in range(NODES)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "rdzv_node.py"),
                    backend,
                    f"127.0.0.1:{port}",
                    "last",
                    str(NODES),
                    "1" if i == 0 else "0",
                    str(out),
                    str(go) if i == NODES - 1 else "",
                ],
                env=env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i, out in enumerate(outs)
        ]
        try:
            wait_reports([Path(f"{out}.ready") for out in outs])
            time.sleep(1.5)  # the first three are waiting in the rendezvous
            go.touch()
            results = [json.loads(text) for text in wait_reports(outs)]
            return max(r["done"] for r in results) - results[-1]["joined"]
        finally:
            reap(procs)


def start_store(loop: str = "auto") -> tuple[subprocess.Popen[str], str]:
    """An ``agentd store`` process on a free port (on event loop ``loop``: its ``--loop``);
    (process, host:port)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentd", "store", "--port", str(port), "--loop", loop],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    while "Store listening" not in proc.stderr.readline():
        pass
    return proc, f"127.0.0.1:{port}"


def scale(
    n: int,
    procs: int,
    etcd: tuple[list[str], list[int]] | None = None,
    loop: str = "auto",
    steady: float = 0.0,
) -> dict[str, float]:
    """``n`` agentd handlers, spread over ``procs`` processes, rendezvous at once through
    an ``agentd store`` process (or ``etcd``: its members' URLs and pids): seconds to
    complete (go -> the last handler has its result), store requests per node, the
    store's CPU per join and its RSS (summed over etcd's members), and the handler
    processes' CPU and RSS."""
    import psutil

    if etcd is None:
        store, target = start_store(loop)
        kind, pids, started = "store", [store.pid], [store]
    else:
        (urls, pids), kind, started = etcd, "etcd", []
        target = ",".join(urls)
    counts = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    run_id = f"scale{n}-{time.monotonic_ns()}"
    groups = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "rdzv_scale_group.py"),
                kind,
                target,
                run_id,
                str(n),
                str(count),
                f"127.0.0.{2 + i}",  # each process its own ports (rdzv_scale_group.py)
            ],
            env=env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, count in enumerate(counts)
        if count
    ]
    try:
        for group in groups:
            assert group.stdout is not None
            if group.stdout.readline().strip() != "ready":
                raise RuntimeError("a handler group did not start (see its stderr)")
        servers = [psutil.Process(pid) for pid in pids]
        cpu = sum(sum(s.cpu_times()[:2]) for s in servers)
        began = time.time()
        for group in groups:
            send(group, "go")
        reports = [read_line(group) for group in groups]
        elapsed = max(r["done"] for r in reports) - began
        store_cpu = sum(sum(s.cpu_times()[:2]) for s in servers) - cpu
        figures = {
            "seconds": elapsed,
            "requests": sum(r["requests"] for r in reports) / n,
            "store_cpu_us": store_cpu / n * 1e6,
            "store_rss_mb": sum(s.memory_info().rss for s in servers) / 2**20,
            "handler_cpu": sum(r["cpu"] for r in reports),
            "handler_rss_mb": max(r["rss_mb"] for r in reports),
        }
        if steady:  # the job runs: the store's load from every agent meanwhile
            cpu = sum(sum(s.cpu_times()[:2]) for s in servers)
            began = time.monotonic()
            for group in groups:
                send(group, f"steady {steady}")
            requests = sum(read_line(group)["requests"] for group in groups)
            took = time.monotonic() - began
            figures["steady_rps"] = requests / took
            figures["steady_cpu"] = (sum(sum(s.cpu_times()[:2]) for s in servers) - cpu) / took
        for group in groups:
            send(group, "watch")
        for group in groups:
            read_line(group)  # every handler watches its round
        for i, group in enumerate(groups):
            send(group, "crash" if i == 0 else "wait")
        after = [read_line(group) for group in groups]
        crashed_at = after[0]["crashed_at"]
        figures["told"] = max(r["told"] for r in after) - crashed_at
        figures["next_round"] = max(r["done"] for r in after) - crashed_at
        return figures
    finally:
        for group in groups:
            assert group.stdin is not None
            group.stdin.close()
        reap(groups)
        reap(started)


def fan_out(n: int, loop: str = "auto") -> tuple[float, float]:
    """The store's part of telling every node that a round ended: ``n`` clients (in this
    process) long-poll one prefix of an ``agentd store``, one write wakes them all.
    (Seconds until the last had its answer, the store's CPU seconds for it.)"""
    import psutil

    from agentd.store.http_client import HttpStore

    async def measure(endpoint: str, server: psutil.Process) -> tuple[float, float]:
        clients = [HttpStore(endpoint) for _ in range(n)]
        try:
            revision = max([await c.revision() for c in clients])
            watches = [asyncio.ensure_future(c.watch("ctl/", revision, 60)) for c in clients]
            while len(clients) > 1 and not all(c.requests > 1 for c in clients):
                await asyncio.sleep(0.05)  # every long poll is sent
            await asyncio.sleep(0.5)  # ... and waiting in the store
            cpu = sum(server.cpu_times()[:2])
            began = time.perf_counter()
            await clients[0].set("ctl/gen", b"1")
            await asyncio.gather(*watches)
            return time.perf_counter() - began, sum(server.cpu_times()[:2]) - cpu
        finally:
            for client in clients:
                await client.close()

    store, endpoint = start_store(loop)
    try:
        return asyncio.run(measure(endpoint, psutil.Process(store.pid)))
    finally:
        reap([store])


def send(group: subprocess.Popen[str], line: str) -> None:
    assert group.stdin is not None
    group.stdin.write(line + "\n")
    group.stdin.flush()


def read_line(group: subprocess.Popen[str]) -> dict[str, Any]:
    assert group.stdout is not None
    line = group.stdout.readline()
    if not line:
        raise RuntimeError("a handler group exited early (see its stderr)")
    return json.loads(line)


def exponent(sizes: list[int], seconds: list[float]) -> float:
    """The fitted k of seconds ~ sizes**k (least squares on the logs)."""
    import math

    xs, ys = [math.log(x) for x in sizes], [math.log(y) for y in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


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
        procs = [
            subprocess.Popen(
                [*cmd, *args, str(HERE / "crash_worker.py"), str(out)],
                env=env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
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
    parser.add_argument("--sizes", default="256,1024", help="node counts for the scale test")
    parser.add_argument(
        "--procs", type=int, default=4, help="processes the scale test's handlers are spread over"
    )
    parser.add_argument("--scale-runs", type=int, default=2, help="runs per scale size")
    parser.add_argument(
        "--agents", type=int, default=64, help="agents started at once on this machine (0: skip)"
    )
    parser.add_argument(
        "--only-scale",
        action="store_true",
        help="skip the launch, last-join and crash measurements",
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=15.0,
        help="seconds of the scale test's job running (heartbeats, job records, straggler "
        "ticks) after its first round, to measure the store's load (0: skip)",
    )
    parser.add_argument(
        "--store-loop",
        default="auto",
        choices=("auto", "uvloop", "asyncio"),
        help="the scale test's `agentd store --loop` (default auto: uvloop where installed)",
    )
    parser.add_argument(
        "--keepalive",
        type=float,
        default=None,
        help="the scale test's clients keep an idle connection this long (default: the "
        "agents' 8 s; 0: none, so each handler holds one connection to the store, its long "
        "poll's: 16,384 handlers then fit a store whose open-files limit is 20,000)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the figures the docs quote to docs/figures.json",
    )
    args = parser.parse_args()
    if args.keepalive is not None:  # the handler groups read it (rdzv_scale_group.py)
        os.environ["SCALE_KEEPALIVE"] = str(args.keepalive)
    cmds = launchers()
    command = " ".join([".venv/bin/python bench/bench_rdzv.py", *sys.argv[1:]])
    backends = {"agentd": "agentd", **({"torchrun": "torch"} if "torchrun" in cmds else {})}
    print(
        f"{NODES} nodes on {os.cpu_count()} CPUs, {args.runs} runs each"
        + ("" if "torchrun" in cmds else " (torch not installed: agentd alone)")
    )

    figures = {
        "launch": {n: [] for n in cmds},
        "last join": {n: [] for n in cmds},
        "crash": {n: [] for n in cmds},
    }  # type: dict[str, dict[str, list[float]]]
    for _ in range(0 if args.only_scale else args.runs):  # interleaved: drift hits both alike
        for name, cmd in cmds.items():
            figures["launch"][name].append(measure_launch(cmd))
            figures["last join"][name].append(measure_last_join(backends[name]))
            figures["crash"][name].append(measure_crash(cmd))
    titles = {
        "launch": f"launch of {NODES} agents -> the last worker running",
        "last join": "last node joins -> every node has the rendezvous result",
        "crash": "worker crash on node 0 -> node 1's worker gets SIGTERM",
    }
    for key, title in titles.items() if not args.only_scale else ():
        print(f"\n{title}")
        for name, values in figures[key].items():
            print(line(name, values))
        if text := ratio(figures[key]):
            print(text)
    if args.record and not args.only_scale:
        from figures import record

        for key, name in (("last join", "last_join"), ("crash", "crash_propagation")):
            for launcher, suffix in (("agentd", ""), ("torchrun", "_torchrun")):
                if values := figures[key].get(launcher):
                    median = statistics.median(values)
                    text = f"{median * 1000:.0f} ms" if median < 1 else f"{median:.1f} s"
                    record(name + suffix, text, command)
    if args.agents:
        many = many_agents(args.agents)
        print(
            f"\n{args.agents} agent processes start at once on this machine (1 worker each, "
            "the agents' defaults, the first one serving the store)"
        )
        print(
            f"  every agent up and waiting in the rendezvous {many['up']:.1f} s after the "
            f"start; from then, every agent's worker running after "
            f"{many['seconds'] * 1000:.0f} ms; {many['ok']:.0f} of {args.agents} agents "
            f"exited 0; {many['problems']:.0f} warning or error lines; agent RSS "
            f"{many['rss_mb']:.0f} MB at most"
        )
        if args.record:
            from figures import record

            record(
                f"agents_{args.agents}",
                f"{many['seconds']:.1f} s",
                command,
                f"{many['ok']:.0f} of {args.agents} agents exited 0",
            )
    sizes = [int(x) for x in re.split(r"[ ,]+", args.sizes) if x]
    kept = "" if args.keepalive is None else f", but idle connections kept {args.keepalive:g} s"
    print(
        f"\nagentd rendezvous handlers at scale ({args.procs} processes of handlers, the "
        f"agents' defaults{kept}, through one `agentd store` process; median (min-max))"
    )
    times = []
    for n in sizes:
        runs = [
            scale(n, args.procs, loop=args.store_loop, steady=args.steady)
            for _ in range(args.scale_runs)
        ]
        mid = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]  # the median run
        times.append(mid["seconds"])
        if args.record:
            from figures import record

            what = "rendezvous handlers, not agents, through one `agentd store` process" + kept
            for name, key, unit, scale_by in (
                ("", "seconds", "s", 1.0),
                ("_store_cpu", "store_cpu_us", "us", 1.0),
                ("_told", "told", "ms", 1000.0),
                ("_next_round", "next_round", "s", 1.0),
                *(
                    [
                        ("_steady_rps", "steady_rps", "req/s", 1.0),
                        ("_steady_cpu", "steady_cpu", "%", 100.0),
                    ]
                    if args.steady
                    else []
                ),
            ):
                values = sorted(r[key] * scale_by for r in runs)
                digits = 2 if unit == "s" else 0
                text = f"{statistics.median(values):.{digits}f} {unit}"
                note = f"median of {len(runs)} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"
                tag = "" if args.keepalive is None else f"_ka{args.keepalive:g}"
                record(f"scale_{n}{tag}{name}", text, command, f"{note}; {what}")
        print(
            f"  {n:5d} handlers: {spread([r['seconds'] for r in runs])} "
            f"({len(runs)} runs); the median run: {mid['requests']:.1f} store requests "
            f"per node, store CPU {mid['store_cpu_us']:.0f} us per join, store RSS "
            f"{mid['store_rss_mb']:.0f} MB; handler CPU {mid['handler_cpu'] / n * 1e6:.0f} us "
            f"per join, handler RSS {mid['handler_rss_mb']:.0f} MB per process"
        )
        if args.steady:
            rps = statistics.median(r["steady_rps"] for r in runs)
            load = statistics.median(r["steady_cpu"] for r in runs)
            print(
                f"         while the job runs: {rps:.0f} store requests a second (heartbeats, "
                f"job records, straggler ticks), {load * 100:.0f}% of the store's core"
            )
        print(
            f"         a crash: every other node told in "
            f"{spread([r['told'] for r in runs])}, the next round complete in "
            f"{spread([r['next_round'] for r in runs])}"
        )
    if len(sizes) > 1:
        print(f"  time grows as nodes^{exponent(sizes, times):.2f}")
    for n in sizes:
        if n <= 1024:
            seconds, cpu = fan_out(n, args.store_loop)
            print(
                f"  fan-out alone: {n} long polls answered {seconds * 1000:.0f} ms after one "
                f"write, {cpu / n * 1e6:.0f} us of store CPU each"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
