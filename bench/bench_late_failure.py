"""A node's workers fail after the other node's succeeded (a crash in a final save, after
the last collective): how long until both launchers have exited, and with what codes?

    python bench/bench_late_failure.py [--runs 3] [--launchers agentd,torchrun] [--record]

Each run starts two launchers as the nodes of one ``--nnodes 2`` job on 127.0.0.1, with
torchrun's command line (``c10d``, the first launcher hosts the store) and
``--max-restarts 3``, one worker each. Node 0's worker exits 0 at once; node 1's waits
until node 0's launcher says it waits in its exit barrier, then exits 1. The figure is
the time from that failure to both launchers' exits. agentd asks the store, before it
restarts, which members are done: none can run again, no round of 2 can form, so node 1
gives up and closes the run, which ends node 0's wait. torchrun restarts node 1, which
waits for node 0 while node 0 waits in its barrier (300 s, which torchrun's command line
does not set).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_files import write_report
from run_control import end_run, free_port, marked_env, wait_for

MARK_ENV = "BENCH_LATE_FAILURE_RUN"
IN_BARRIER = {
    "agentd": "waiting for those of the other 1 node(s) (exit barrier)",
    "torchrun": "Waiting 300 seconds for other agents to finish",
}
"""What each launcher logs once its workers succeeded and it waits for the other node."""
SCRIPT = """\
import os, pathlib, sys, time
if os.environ["GROUP_RANK"] == "1":
    go = pathlib.Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.01)
    sys.exit(1)
"""


def run_once(launcher: str, timeout: float) -> tuple[float, list[int | None]] | str:
    """Seconds from node 1's failure to both exits, and the exit codes; or why not."""
    env, marker = marked_env(MARK_ENV)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-late-") as tmp:
        out, port = Path(tmp), free_port()
        script, go = out / "late.py", out / "go"
        write_report(script, SCRIPT)
        base = [sys.executable, "-m", "torch.distributed.run"]
        if launcher == "agentd":
            base = [sys.executable, "-m", "agentd", "run"]
        else:
            env["LOGLEVEL"] = "INFO"  # torchrun says it waits in its barrier at INFO only
        argv = [
            *base,
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"),
            *("--rdzv-id", "job", "--nnodes", "2", "--nproc-per-node", "1"),
            *("--max-restarts", "3", str(script), str(go)),
        ]
        logs = [out / f"launcher{i}.log" for i in range(2)]
        try:
            for log_path in logs:
                with open(log_path, "wb") as log:
                    procs.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
                        )
                    )
                time.sleep(0.5)  # the first hosts the store
            said = IN_BARRIER[launcher]
            if not wait_for(lambda: any(said in p.read_text() for p in logs), timeout):
                return f"no launcher said {said!r} within {timeout:g}s"
            go.touch()
            began = time.monotonic()
            if not wait_for(lambda: all(p.poll() is not None for p in procs), timeout, 0.01):
                return f"still running {timeout:g}s after the failure"
            return time.monotonic() - began, sorted(p.returncode for p in procs)
        finally:
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=420.0)
    parser.add_argument("--record", action="store_true", help="write the medians to figures")
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    if set(launchers) - {"agentd", "torchrun"}:
        sys.exit("--launchers: agentd, torchrun")
    print(
        f"2 nodes, --max-restarts 3; node 1's worker fails after node 0's succeeded -> both "
        f"launchers exit ({args.runs} runs, {os.cpu_count()} CPUs)"
    )
    for launcher in launchers:
        times: list[float] = []
        codes: set[str] = set()
        for run in range(args.runs):
            took = run_once(launcher, args.timeout)
            if isinstance(took, str):
                print(f"  {launcher:<9} run {run + 1}: {took}", flush=True)
                continue
            times.append(took[0])
            codes.add(" and ".join(map(str, took[1])))
        line = f"  {launcher:<9} both exited {len(times)}/{args.runs}"
        if times:
            median = statistics.median(times)
            shown = f"{median:.1f} s" if median < 10 else f"{median:.0f} s"
            line += f"  median {median:7.2f} s  max {max(times):7.2f}  exit codes {sorted(codes)}"
            if args.record and len(codes) == 1:
                from figures import record

                command = (
                    f".venv/bin/python bench/bench_late_failure.py --runs {args.runs} "
                    f"--launchers {launcher} --record"
                )
                runs = f"median of {args.runs}" if args.runs > 1 else "one run"
                text = f"{shown} (exit {codes.pop()}, {runs})"
                record(f"late_failure_{launcher}", text, command)
        print(line, flush=True)


if __name__ == "__main__":
    main()
