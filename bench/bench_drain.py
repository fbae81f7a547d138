"""A node leaves on purpose (a preemption notice): what does the job lose?

    python bench/bench_drain.py [--runs 3] [--every 200] [--launchers agentd,torchrun]
                                [--static | --everyone]

Each run starts three launchers on this machine as three nodes of one ``--nnodes 2:3`` job
(2 gloo workers each, ``drain_worker.py``: one all-reduce per step, a periodic checkpoint
every ``--every`` steps), lets it run at world 6 for 2 s, then signals the third node:

* ``agentd``: SIGUSR1 with ``--drain-on SIGUSR1``: every rank checkpoints at the step the
  agents choose, the job re-forms without the node;
* ``torchrun``: SIGTERM, as a preemption sends it: the node's workers stop, the others'
  collectives fail, and they restart from the last periodic checkpoint.

With ``--everyone``, every node of the 3-node job is signalled at once (Slurm's
time-limit warning, a Job deleted under Kubernetes): each launcher must exit, and steps
lost count from the checkpoint every rank holds (the drain's, else the last periodic one).

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


class Job:
    """One run's job: its folder, its launchers (:meth:`start` one per node) and stop file;
    every process of the run is ended with it."""

    def __init__(self, launcher: str, every: int, static: bool) -> None:
        self.launcher, self.every, self.static = launcher, every, static
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-drain-")
        self.out, self.port = Path(self._tmp.name), free_port()
        self.stop = self.out / "stop"
        self.marker = os.urandom(8).hex()
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, node: int) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "AGENTD_STORE_TOKEN": TOKEN,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
            MARK_ENV: self.marker,
        }
        argv = command(self.launcher, self.port, node if self.static else None)
        proc = subprocess.Popen(
            [*argv, WORKER, str(self.out), str(self.stop), str(self.every)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.procs.append(proc)
        return proc

    def running(self, nodes: int, timeout: float) -> int | None:
        """Start ``nodes`` nodes (one after the other: the first serves the store), let
        them train 2 s; the furthest step reached (None: they never all started)."""
        for node in range(nodes):
            self.start(node)
            time.sleep(0.5)
        first = "start_0_*.json"
        if not wait_for(lambda: len(notes(self.out, first)) == 2 * nodes, timeout):
            return None
        time.sleep(2.0)
        return max(p["step"] for p in notes(self.out, "progress_0_*.json"))

    def signal(self, proc: subprocess.Popen[bytes]) -> None:
        """What a preemption sends: the drain signal to agentd, SIGTERM to torchrun."""
        proc.send_signal(signal.SIGUSR1 if self.launcher == "agentd" else signal.SIGTERM)

    def drained(self, ranks: int, sent: float) -> dict:
        """The drain's checkpoints: when the last callback was entered after ``sent``
        (None: not every rank's), and whether all ranks saved at one step."""
        drained = notes(self.out, "ckpt_drain_0_*.json")
        return {
            "callbacks": max(c["entered"] for c in drained) - sent
            if len(drained) == ranks
            else None,
            "one_step": len({c["step"] for c in drained}) == 1 if drained else None,
        }

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        end_run(self.procs, MARK_ENV, self.marker)
        self._tmp.cleanup()


def run_once(launcher: str, every: int, timeout: float, static: bool) -> dict | None:
    """One node of the job signalled (and, ``static``, replaced); None: the job did not go
    on within ``timeout``."""
    with Job(launcher, every, static) as job:
        nodes = 2 if static else 3
        at_signal = job.running(nodes, timeout)
        if at_signal is None:
            return None
        sent = time.time()
        leaving = job.procs[-1]
        job.signal(leaving)
        if static:  # the job waits for a node in its place
            with contextlib.suppress(subprocess.TimeoutExpired):
                leaving.wait(timeout)
            job.start(nodes - 1)

        def reformed() -> list[dict]:
            return [s for s in notes(job.out, "start_*.json") if s["world"] == 4 and s["at"] > sent]

        if not wait_for(lambda: len(reformed()) == 4, timeout):
            return None
        result = {
            **job.drained(2 * nodes, sent),
            "lost": max(0, at_signal - min(s["resumed_at"] for s in reformed())),
            "reformed": max(s["at"] for s in reformed()) - sent,
        }
        job.stop.touch()
        for proc in job.procs:
            if proc is not leaving:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout)
        return result


def run_everyone(launcher: str, every: int, timeout: float) -> dict | None:
    """Every node of the 3-node job signalled at once (a time limit's warning, a Job
    deleted); None: not every launcher exited within ``timeout``."""
    with Job(launcher, every, static=False) as job:
        at_signal = job.running(3, timeout)
        if at_signal is None:
            return None
        sent = time.time()
        for proc in job.procs:
            job.signal(proc)
        for proc in job.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, sent + timeout - time.time()))
        if any(proc.returncode is None for proc in job.procs):
            return None
        exited = time.time() - sent
        result = job.drained(6, sent)
        if result["one_step"]:
            saved = notes(job.out, "ckpt_drain_0_*.json")[0]["step"]
        else:  # the last periodic checkpoint every rank wrote
            periodic = notes(job.out, "ckpt_every_*.json")
            saved = min((c["step"] for c in periodic), default=0) if len(periodic) == 6 else 0
        return {**result, "lost": max(0, at_signal - saved), "exited": exited}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--every", type=int, default=200, help="periodic checkpoint, steps")
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0)
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--static", action="store_true", help="a static job of two nodes")
    shape.add_argument("--everyone", action="store_true", help="signal every node at once")
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print("torch is not installed: the benchmark needs it")
        return
    job = "static 2-node gloo job (4 ranks" if args.static else "3-node gloo job (6 ranks"
    who = "every node" if args.everyone else "a node"
    print(
        f"{who} of a {job}, 5 ms steps, a checkpoint every {args.every} steps) signalled "
        f"to leave{', then replaced' if args.static else ''}; {args.runs} runs, "
        f"{os.cpu_count()} CPUs"
    )
    for name in args.launchers.split(","):
        if args.everyone:
            runs = (run_everyone(name, args.every, args.timeout) for _ in range(args.runs))
        else:
            runs = (run_once(name, args.every, args.timeout, args.static) for _ in range(args.runs))
        results = [r for r in runs if r is not None]
        done = "exited" if args.everyone else "went on"
        line = f"  {name:<9} {done} {len(results)}/{args.runs}"
        if results:
            calls = [r["callbacks"] for r in results if r["callbacks"] is not None]
            if calls:
                line += (
                    f"; signal -> every callback entered: median "
                    f"{statistics.median(calls) * 1000:.0f} ms (max {max(calls) * 1000:.0f})"
                    f"; one step on every rank {sum(bool(r['one_step']) for r in results)}"
                    f"/{len(results)}"
                )
            line += f"; steps lost: {', '.join(str(r['lost']) for r in results)}"
            if args.everyone:
                times = [r["exited"] for r in results]
                line += (
                    f"; every launcher exited after {statistics.median(times):.2f} s"
                    f" (max {max(times):.2f})"
                )
            else:
                times = [r["reformed"] for r in results]
                line += f"; re-formed world running after {statistics.median(times):.2f} s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
