"""A node leaves on purpose (a preemption notice): what does the job lose?

    python bench/bench_drain.py [--runs 3] [--every 200] [--launchers agentd,torchrun] [--static]

Each run starts three launchers on this machine as three nodes of one ``--nnodes 2:3`` job
(2 gloo workers each, ``drain_worker.py``: one all-reduce per step, a periodic checkpoint
every ``--every`` steps), lets it run at world 6 for 2 s, then signals the third node:

* ``agentd``: SIGUSR1 with ``--drain-on SIGUSR1``: every rank checkpoints at the step the
  agents choose, the job re-forms without the node;
* ``torchrun``: SIGTERM, as a preemption sends it: the node's workers stop, the others'
  collectives fail, and they restart from the last periodic checkpoint.

With ``--static``, the job is torchrun's default instead: ``--rdzv-backend static``, two
nodes that know their ranks (node 0's launcher serves the store), and the second node is
signalled the same way; once it has exited, a launcher is started in its place (a node
replaced, a pod made again), which the job waits for.

Figures: the signal -> every rank's checkpoint callback entered (agentd), whether every
rank saved at one step, steps lost (the step reached when the signal was sent minus the
step the re-formed world resumed at: work done before the node was asked to leave and done
again) and the signal -> the re-formed world's last worker started. Needs torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_files import reports as finished_reports
from run_control import end_run, wait_for

WORKER = str(Path(__file__).with_name("drain_worker.py"))
CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60"
TOKEN = "bench-secret"
MARK_ENV = "BENCH_DRAIN_RUN"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def notes(out: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in finished_reports(out, pattern)]


def command(launcher: str, port: int, node_rank: int | None) -> list[str]:
    """The launcher's command line: a node of the elastic job, or (``node_rank``) of the
    static one."""
    module = "torch.distributed.run" if launcher == "torchrun" else "agentd"
    run = [] if launcher == "torchrun" else ["run", "--drain-on", "SIGUSR1"]
    shape = ["--nproc-per-node", "2", "--max-restarts", "3"]
    if node_rank is not None:
        static = ["--nnodes", "2", "--node-rank", str(node_rank), "--master-port", str(port)]
        return [sys.executable, "-m", module, *run, *static, *shape]
    elastic = [
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
        *("--rdzv-conf", CONF, "--rdzv-id", "bench", "--nnodes", "2:3"),
    ]
    return [sys.executable, "-m", module, *run, *elastic, *shape]


def run_once(launcher: str, every: int, timeout: float, static: bool) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as tmp:
        out, port = Path(tmp), free_port()
        stop = out / "stop"
        marker = os.urandom(8).hex()
        env = {
            **os.environ,
            "AGENTD_STORE_TOKEN": TOKEN,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            MARK_ENV: marker,
        }
        nodes = 2 if static else 3
        procs: list[subprocess.Popen[bytes]] = []

        def start(node: int) -> subprocess.Popen[bytes]:
            argv = command(launcher, port, node if static else None)
            return subprocess.Popen(
                [*argv, WORKER, tmp, str(stop), str(every)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )

        try:
            for node in range(nodes):  # one after the other: the first serves the store
                procs.append(start(node))
                time.sleep(0.5)
            first = "start_0_*.json"
            if not wait_for(lambda: len(notes(out, first)) == 2 * nodes, timeout):
                return None
            time.sleep(2.0)
            at_signal = max(p["step"] for p in notes(out, "progress_0_*.json"))
            sent = time.time()
            procs[-1].send_signal(signal.SIGUSR1 if launcher == "agentd" else signal.SIGTERM)
            if static:  # the job waits for a node in its place
                with contextlib.suppress(subprocess.TimeoutExpired):
                    procs[-1].wait(timeout)
                procs.append(start(nodes - 1))

            def reformed() -> list[dict]:
                return [s for s in notes(out, "start_*.json") if s["world"] == 4 and s["at"] > sent]

            if not wait_for(lambda: len(reformed()) == 4, timeout):
                return None
            drained = notes(out, "ckpt_drain_0_*.json")
            resumed = min(s["resumed_at"] for s in reformed())
            result = {
                "callbacks": max(c["entered"] for c in drained) - sent
                if len(drained) == 2 * nodes
                else None,
                "one_step": len({c["step"] for c in drained}) == 1 if drained else None,
                "lost": max(0, at_signal - resumed),
                "reformed": max(s["at"] for s in reformed()) - sent,
            }
            stop.touch()
            for proc in procs[:2] if not static else (procs[0], procs[-1]):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout)
            return result
        finally:
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--every", type=int, default=200, help="periodic checkpoint, steps")
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--static", action="store_true", help="a static job of two nodes")
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed: the benchmark needs it")
        return
    job = "static 2-node gloo job (4 ranks" if args.static else "3-node gloo job (6 ranks"
    print(
        f"a node of a {job}, 5 ms steps, a checkpoint every {args.every} steps) signalled "
        f"to leave{', then replaced' if args.static else ''}; {args.runs} runs, "
        f"{os.cpu_count()} CPUs"
    )
    for name in args.launchers.split(","):
        results = [
            r
            for r in (
                run_once(name, args.every, args.timeout, args.static) for _ in range(args.runs)
            )
            if r is not None
        ]
        line = f"  {name:<9} went on {len(results)}/{args.runs}"
        if results:
            calls = [r["callbacks"] for r in results if r["callbacks"] is not None]
            if calls:
                line += (
                    f"; signal -> every callback entered: median "
                    f"{statistics.median(calls) * 1000:.0f} ms (max {max(calls) * 1000:.0f})"
                    f"; one step on every rank {sum(bool(r['one_step']) for r in results)}"
                    f"/{len(results)}"
                )
            line += (
                f"; steps lost: {', '.join(str(r['lost']) for r in results)}"
                f"; re-formed world running after "
                f"{statistics.median(r['reformed'] for r in results):.2f} s"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
