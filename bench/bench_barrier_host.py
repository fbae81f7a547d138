"""The store's host is lost while it waits in its exit barrier: does the others' work go on?

    python bench/bench_barrier_host.py [--runs 3] [--hows SIGKILL,lost,SIGTERM]
                                       [--launchers agentd,torchrun] [--record]

Each run starts three launchers on 127.0.0.1 as the nodes of one ``--nnodes 2:3`` job,
with torchrun's command line and the default rendezvous settings (the first launcher
hosts the store; agentd's others stand by to take it over). The first node's worker
succeeds at once, so its launcher waits in its exit barrier; the other two nodes' workers
work on (rank 0's final save, say) until a stop file appears. Three seconds after the
first node entered its barrier, it is SIGKILLed (``SIGKILL``: the launcher alone), its
host is lost whole (``lost``: the launcher and everything it started frozen, then
killed), or it is SIGTERMed (``SIGTERM``). Ten seconds after that the stop file is made.

A run **keeps the work** when the two working nodes' workers were never stopped (each
started once, attempt 0) and both launchers exit 0. agentd's store host hands the store,
state and all, to a working node's candidate as it enters its barrier
(agentd/store/succession.py): the figure ``hold`` is how long it held requests to do so
(from its log). Before that change, the store went with its host and both working
nodes' workers were stopped mid-work.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from report_files import write_report
from run_control import end_run, free_port, launchers_parser, marked_env, wait_for

MARK_ENV = "BENCH_BARRIER_HOST_RUN"
HOWS = ("SIGKILL", "lost", "SIGTERM")
BARRIER = "waiting for those of the other 2 node(s) (exit barrier)"
HANDED = re.compile(
    r"handed the store, its (\d+) keys, to \S+ \(term \d+\), holding requests for ([\d.]+) ms"
)
WORKER = """import os, pathlib, sys, time
out, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
(out / f"started-{os.environ['GROUP_RANK']}-{os.getpid()}-{attempt}").touch()
if os.environ.get("WORKS_ON"):
    while not stop.exists():
        time.sleep(0.05)
"""


def lose(pid: int) -> None:
    """The launcher's host lost whole: it and everything it started frozen, then killed."""
    try:
        tree = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        tree = [pid]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for each in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, sig)


def run_once(launcher: str, how: str, timeout: float) -> tuple[bool, str, float | None]:
    """Whether the run kept the work, what happened, and agentd's hold in ms (if handed)."""
    env, marker = marked_env(MARK_ENV)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-barrier-host-") as tmp:
        out, port = Path(tmp), free_port()
        stop, script = out / "stop", out / "worker.py"
        write_report(script, WORKER)
        if launcher == "torchrun":
            base = [sys.executable, "-m", "torch.distributed.run"]
        else:
            base = [sys.executable, "-m", "agentd", "run"]
        argv = [
            *base,
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
            *("--rdzv-id", "job", "--nnodes", "2:3", "--nproc-per-node", "1"),
            *("--max-restarts", "3", str(script), str(out), str(stop)),
        ]
        logs = [out / f"launcher{i}.log" for i in range(3)]
        try:
            for i in range(3):
                node_env = env if i == 0 else {**env, "WORKS_ON": "1"}
                with open(logs[i], "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=node_env
                        )
                    )
                if i == 0:  # the first hosts the store
                    time.sleep(0.5)
            if not wait_for(lambda: len(list(out.glob("started-*"))) >= 3, timeout):
                return False, f"no three workers within {timeout:g}s", None
            if launcher == "agentd" and not wait_for(
                lambda: BARRIER in logs[0].read_text(), timeout
            ):
                return False, "the first node never entered its exit barrier", None
            time.sleep(3.0)  # (torchrun's first node is in its barrier by then too)
            handed = HANDED.search(logs[0].read_text())
            hold = float(handed.group(2)) if handed else None
            if how == "SIGKILL":
                procs[0].kill()
            elif how == "lost":
                lose(procs[0].pid)
            else:
                procs[0].send_signal(signal.SIGTERM)
            time.sleep(10.0)
            stop.touch()
            codes = []
            for proc in procs[1:]:
                try:
                    codes.append(proc.wait(timeout))
                except subprocess.TimeoutExpired:
                    codes.append(None)
            starts = sorted(p.name for p in out.glob("started-*"))
            working = [s for s in starts if not s.startswith("started-0-")]
            kept = codes == [0, 0] and len(working) == 2 and all(s.endswith("-0") for s in working)
            said = f"exit {codes}, working nodes' workers started {len(working)} time(s)"
            return kept, said, hold
        finally:
            stop.touch()
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = launchers_parser(__doc__ or "", HOWS)
    parser.add_argument("--record", action="store_true", help="write agentd's figures")
    args = parser.parse_args()
    hows, launchers = args.hows.split(","), args.launchers.split(",")
    if set(hows) - set(HOWS) or set(launchers) - {"agentd", "torchrun"}:
        sys.exit(f"--hows: {', '.join(HOWS)}; --launchers: agentd, torchrun")
    print(
        f"3 nodes, --nnodes 2:3, default settings; the store's host lost in its exit barrier "
        f"while the other two work ({args.runs} runs, {os.cpu_count()} CPUs)"
    )
    holds: list[float] = []
    kept_all = {}
    for how in hows:
        for launcher in launchers:
            kept = 0
            for run in range(args.runs):
                ok, said, hold = run_once(launcher, how, args.timeout)
                kept += ok
                if hold is not None:
                    holds.append(hold)
                print(f"  {how:<8} {launcher:<9} run {run + 1}: {'kept' if ok else 'LOST'}: {said}")
            kept_all[(how, launcher)] = kept
            print(f"  {how:<8} {launcher:<9} kept the work in {kept}/{args.runs} runs", flush=True)
    if holds:
        print(
            f"  agentd's hand-down held requests for median {statistics.median(holds):.1f} ms "
            f"(min {min(holds):.1f}, max {max(holds):.1f}, {len(holds)} hand-downs)"
        )
    if args.record and holds:
        from figures import record

        command = f".venv/bin/python bench/bench_barrier_host.py --runs {args.runs} --record"
        agentd = [kept_all[(h, "agentd")] for h in hows if (h, "agentd") in kept_all]
        record("barrier_host_hold", f"{statistics.median(holds):.1f} ms", command)
        record("barrier_host_kept", f"{sum(agentd)}/{len(agentd) * args.runs}", command)


if __name__ == "__main__":
    main()
