"""A node leaves on purpose (a preemption notice): what does the job lose?

    python bench/bench_drain.py [--runs 3] [--every 200] [--launchers agentd,torchrun]

Each run starts three launchers on this machine as three nodes of one ``--nnodes 2:3`` job
(2 gloo workers each, ``drain_worker.py``: one all-reduce per step, a periodic checkpoint
every ``--every`` steps), lets it run at world 6 for 2 s, then signals the third node:

* ``agentd``: SIGUSR1 with ``--drain-on SIGUSR1``: every rank checkpoints at the step the
  agents choose, the job re-forms without the node;
* ``torchrun``: SIGTERM, as a preemption sends it: the node's workers stop, the others'
  collectives fail, and they restart from the last periodic checkpoint.

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


def command(launcher: str, port: int) -> list[str]:
    module = "torch.distributed.run" if launcher == "torchrun" else "agentd"
    run = [] if launcher == "torchrun" else ["run", "--drain-on", "SIGUSR1"]
    return [
        sys.executable,
        "-m",
        module,
        *run,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-conf",
        CONF,
        "--rdzv-id",
        "bench",
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
    ]


def run_once(launcher: str, every: int, timeout: float) -> dict | None:
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
        argv = [*command(launcher, port), WORKER, tmp, str(stop), str(every)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(3):  # one after the other: the first serves the store
                procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=env,
                    )
                )
                time.sleep(0.5)
            first = "start_0_*.json"
            if not wait_for(lambda: len(notes(out, first)) == 6, timeout):
                return None
            time.sleep(2.0)
            at_signal = max(p["step"] for p in notes(out, "progress_0_*.json"))
            sent = time.time()
            procs[2].send_signal(signal.SIGUSR1 if launcher == "agentd" else signal.SIGTERM)

            def reformed() -> list[dict]:
                return [s for s in notes(out, "start_*.json") if s["world"] == 4 and s["at"] > sent]

            if not wait_for(lambda: len(reformed()) == 4, timeout):
                return None
            drained = notes(out, "ckpt_drain_0_*.json")
            resumed = min(s["resumed_at"] for s in reformed())
            result = {
                "callbacks": max(c["entered"] for c in drained) - sent
                if len(drained) == 6
                else None,
                "one_step": len({c["step"] for c in drained}) == 1 if drained else None,
                "lost": max(0, at_signal - resumed),
                "reformed": max(s["at"] for s in reformed()) - sent,
            }
            stop.touch()
            for proc in procs[:2]:
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
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed: the benchmark needs it")
        return
    print(
        f"a node of a 3-node gloo job (6 ranks, 5 ms steps, a checkpoint every {args.every} "
        f"steps) signalled to leave; {args.runs} runs, {os.cpu_count()} CPUs"
    )
    for name in args.launchers.split(","):
        results = [
            r
            for r in (run_once(name, args.every, args.timeout) for _ in range(args.runs))
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
