"""A node of a running gloo job is lost while a spare waits: how soon is the job training
at full world again, and do the other node's workers keep their process?

    python bench/bench_node_loss.py [--runs 3] [--launchers agentd-inprocess,agentd,torchrun]

Each run starts a store (``agentd store``; torchrun: its c10d rendezvous in the first
launcher) and three launchers as nodes of one ``--nnodes 2`` job, 2 gloo workers each
(``node_loss_worker.py``): two form the job, the third waits as a spare. Once the job
trains, a node that does not host the store is SIGKILLed. The figure is the time from the
kill to every worker of the new world of 4 past its first all-reduce; the survivors'
pids are compared. The launchers:

* ``agentd-inprocess``: ``--preload torch``, the workers wrapped in ``agentd.inprocess.run``
  (the kept node's workers restart in process, the spare's are forked);
* ``agentd``: ``--preload torch``, the training function called plainly: every worker is
  a new process;
* ``torchrun``: its c10d rendezvous (needs torch).

All use a heartbeat TTL of 2 s (``keep_alive_interval=0.5,keep_alive_max_attempt=4``):
the node's loss is seen when its lease runs out, so the target is TTL + 100 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from run_control import end_run, free_port, listening, wait_for

WORKER = str(Path(__file__).with_name("node_loss_worker.py"))
CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"
TTL = 2.0
TOKEN = "bench-secret"
MARK_ENV = "BENCH_NODE_LOSS_RUN"
SPARE_SETTLE = 4.0
"""Seconds the spare gets to start (its interpreter and zygote: torch) and wait in the store."""


def rounds(out: Path) -> list[dict]:
    found = []
    for path in glob.glob(str(out / "round_*.json")):  # renamed into place: always whole
        port, rank = Path(path).stem.split("_")[1:]
        found.append({**json.loads(Path(path).read_text()), "port": port, "rank": int(rank)})
    return found


def node_of(launcher: psutil.Process) -> set[int]:
    """The pids of a launcher's workers (its descendants that run the worker script)."""
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in launcher.children(recursive=True) if WORKER in p.cmdline()}
    return set()


def run_once(launcher: str, timeout: float) -> tuple[float | None, bool | None]:
    """(seconds from the kill to world 4 past its first all-reduce, or None; whether the
    surviving node's workers kept their pids)."""
    marker = os.urandom(6).hex()
    with tempfile.TemporaryDirectory(prefix="bench-node-loss-") as tmp:
        out, port = Path(tmp), free_port()
        stop = out / "stop"
        env = {
            **os.environ,
            "AGENTD_STORE_TOKEN": TOKEN,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            MARK_ENV: marker,
            "PYTHONPATH": str(Path(__file__).parent),
        }
        procs: list[subprocess.Popen[bytes]] = []
        quiet = {
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "stderr": subprocess.DEVNULL,
            "env": env,
        }
        try:
            if launcher == "torchrun":
                base = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                ]
            else:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "agentd", "store", "--port", str(port)], **quiet
                    )
                )
                if not wait_for(lambda: listening(port), timeout):  # else an agent hosts it
                    return None, None
                base = [
                    sys.executable,
                    "-m",
                    "agentd",
                    "run",
                    "--preload",
                    "torch",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    f"127.0.0.1:{port}",
                ]
            argv = [
                *base,
                "--rdzv-conf",
                CONF,
                "--rdzv-id",
                "bench",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "3",
                WORKER,
                tmp,
                str(stop),
                *(["plain"] if launcher == "agentd" else []),
            ]
            nodes = [subprocess.Popen(argv, **quiet) for _ in range(2)]
            procs += nodes
            if not wait_for(lambda: len(rounds(out)) >= 4, timeout):
                return None, None
            nodes.append(subprocess.Popen(argv, **quiet))  # the spare: waits for a place
            procs.append(nodes[-1])
            time.sleep(SPARE_SETTLE)
            first = rounds(out)
            victim_pids = {r["pid"] for r in first}
            by_node = {n.pid: node_of(psutil.Process(n.pid)) for n in nodes}
            members = [n for n in nodes if by_node[n.pid] & victim_pids]
            victim = members[-1]  # torchrun's first launcher hosts its store: never that one
            kept_node = next(n for n in members if n is not victim)
            kept_pids = by_node[kept_node.pid]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed = time.time()

            def again() -> list[dict]:
                return [r for r in rounds(out) if r["at"] > killed and r["world"] == 4]

            if not wait_for(lambda: len({r["rank"] for r in again()}) == 4, timeout):
                return None, None
            took = max(r["at"] for r in again()) - killed
            kept = bool(kept_pids) and kept_pids <= {r["pid"] for r in again()}
            stop.touch()
            return took, kept
        finally:
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launchers", default="agentd-inprocess,agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        sys.exit("bench_node_loss needs torch (pip install torch==2.13.0)")
    print(
        f"a node of 2 lost, a spare waiting: kill -> world 4 past its first all-reduce "
        f"(2 gloo workers a node, TTL {TTL:g} s, {args.runs} runs, {os.cpu_count()} CPUs)"
    )
    for name in args.launchers.split(","):
        results = [run_once(name, args.timeout) for _ in range(args.runs)]
        ok = [took for took, _ in results if took is not None]
        kept = sum(1 for _, k in results if k)
        line = f"  {name:<17} recovered {len(ok)}/{args.runs}, survivors kept their pids {kept}"
        if ok:
            line += (
                f"  median {statistics.median(ok) * 1000:6.0f} ms  min "
                f"{min(ok) * 1000:6.0f}  max {max(ok) * 1000:6.0f}"
                f"  (TTL + {(statistics.median(ok) - TTL) * 1000:.0f} ms)"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
