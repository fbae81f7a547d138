"""A node leaves a job run with the default rendezvous settings: how soon do the others run
again at the smaller world?

    python bench/bench_leave.py [--runs 3] [--launchers agentd,torchrun] [--record]
                                [--backend etcd]

Each run starts three launchers as the nodes of one ``--nnodes 2:3`` job on 127.0.0.1, with
torchrun's command line and no ``--rdzv-conf`` (the first launcher hosts the store), one
worker each (``tests/workers/world_loop.py``: it writes its world size and idles). Once the
world of 3 runs, the third node leaves: SIGTERM (a graceful leave), SIGKILL (its guardian
releases it), SIGKILL of the first node, which serves the store (once another candidate
stands by: its guardian releases it through the candidate that takes the store over),
SIGTERM of that first node (it hands the store, with its state, to another candidate,
then counts itself gone there), or SIGSTOP (a lost host: only its lease tells). The
figure is the time from the signal to both other nodes' workers running at world 2; a
run that takes longer than ``--timeout`` counts as not recovered. The restart count the
new workers see is checked too: leaving is a membership change, which spends no restart.

``--backend etcd`` runs agentd's nodes on a real etcd started here (Debian's etcd-server)
instead: nobody hosts the store there, so ``SIGKILL-host`` does not apply, and torchrun is
left out (its etcd backend speaks etcd's v2 API, through python-etcd).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_control import end_run, launchers_parser, marked_env, wait_for

WORKER = str(Path(__file__).resolve().parent.parent / "tests" / "workers" / "world_loop.py")
MARK_ENV = "BENCH_LEAVE_RUN"
HOWS = {
    "SIGTERM": "leave_sigterm",
    "SIGKILL": "leave_sigkill",
    "SIGKILL-host": "leave_store_host",
    "SIGTERM-host": "leave_store_host_sigterm",
    "SIGSTOP": "leave_lost",
}
"""How the node leaves -> the figure it records (``-host``: the node that serves the store)."""
STARTED = "Started 1 worker(s), attempt 0"
WILL = "guardian releases it through the store candidates"
"""The store host's line once another candidate stands by, so its guardian can release it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worlds(out: Path, size: int) -> list[str]:
    return [p.name for p in out.glob(f"w{size}_*")]


def run_once(launcher: str, how: str, timeout: float, etcd: str | None = None) -> float | str:
    """Seconds from the signal to world 2, or why not (``etcd``: its endpoints, where the
    nodes meet on etcd)."""
    env, marker = marked_env(MARK_ENV)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-leave-") as tmp:
        out, port = Path(tmp), free_port()
        stop = out / "stop"
        if launcher == "torchrun":
            base = [sys.executable, "-m", "torch.distributed.run"]
        else:
            base = [sys.executable, "-m", "agentd", "run"]
        argv = [
            *base,
            "--rdzv-backend",
            "etcd" if etcd else "c10d",
            "--rdzv-endpoint",
            etcd or f"127.0.0.1:{port}",
            "--rdzv-id",
            f"job-{marker}" if etcd else "job",
            "--nnodes",
            "2:3",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "3",
            WORKER,
            str(out),
            str(stop),
        ]
        try:
            for i in range(3):
                log_path = out / f"launcher{i}.log"  # the launcher's output, for a look after
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
                        )
                    )
                if i == 0:  # the first hosts the store
                    time.sleep(0.5)
            if not wait_for(lambda: len(worlds(out, 3)) == 3, timeout):
                return f"no world of 3 within {timeout:g}s"
            index = 0 if how.endswith("-host") else 2
            leaver, leaver_log = procs[index], out / f"launcher{index}.log"
            ready = STARTED  # its guardian starts with its workers, just before this line
            if how.endswith("-host"):
                ready = WILL
            if launcher == "agentd" and not wait_for(
                lambda: ready in leaver_log.read_text(), timeout
            ):
                return f"the leaving agent never said {ready!r} within {timeout:g}s"
            began = time.monotonic()
            leaver.send_signal(getattr(signal, how.removesuffix("-host")))
            if not wait_for(lambda: len(worlds(out, 2)) == 2, timeout, interval=0.01):
                codes = [p.poll() for p in procs[:2]]
                return f"no world of 2 within {timeout:g}s (the others: exit {codes})"
            took = time.monotonic() - began
            restarts = {name.rsplit("_", 1)[1] for name in worlds(out, 2)}
            if restarts != {"0"}:
                return f"a restart was spent (restart counts {sorted(restarts)})"
            return took
        finally:
            stop.touch()
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = launchers_parser(__doc__ or "", list(HOWS))
    parser.add_argument("--backend", choices=("c10d", "etcd"), default="c10d")
    parser.add_argument(
        "--record", action="store_true", help="write agentd's medians to docs/figures.json"
    )
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    hows = args.hows.split(",")
    if set(hows) - set(HOWS) or set(launchers) - {"agentd", "torchrun"}:
        sys.exit(f"--hows: {', '.join(HOWS)}; --launchers: agentd, torchrun")
    if args.backend == "etcd":
        if args.record:
            sys.exit("--record: the figures are c10d's; run --backend etcd without it")
        hows = [how for how in hows if not how.endswith("-host")]
        launchers = [launcher for launcher in launchers if launcher == "agentd"]
        with contextlib.ExitStack() as stack:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
            from tests.helpers.etcd_server import EtcdCluster

            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-leave-etcd-"))
            cluster = stack.enter_context(EtcdCluster(Path(folder)))
            measure(args, launchers, hows, cluster.endpoints)
        return
    measure(args, launchers, hows, None)


def measure(
    args: argparse.Namespace, launchers: list[str], hows: list[str], etcd: str | None
) -> None:
    print(
        f"3 nodes, --nnodes 2:3, default rendezvous settings, on {'etcd' if etcd else 'c10d'}; "
        f"the third leaves -> the others run at world 2 ({args.runs} runs, "
        f"{os.cpu_count()} CPUs)"
    )
    for how in hows:
        for launcher in launchers:
            times: list[float] = []
            for run in range(args.runs):
                took = run_once(launcher, how, args.timeout, etcd)
                if isinstance(took, str):
                    print(f"  {how:<8} {launcher:<9} run {run + 1}: {took}", flush=True)
                else:
                    times.append(took)
            line = f"  {how:<8} {launcher:<9} at world 2 {len(times)}/{args.runs}"
            if times:
                median = statistics.median(times)
                line += f"  median {median:6.2f} s  min {min(times):6.2f}  max {max(times):6.2f}"
                if args.record and launcher == "agentd":
                    from figures import record

                    command = f".venv/bin/python bench/bench_leave.py --runs {args.runs} --record"
                    text = f"{median:.1f} s" if median < 10 else f"{median:.0f} s"
                    record(HOWS[how], text, command)
            print(line, flush=True)


if __name__ == "__main__":
    main()
