"""The defaults, together (issue 48): what a new user with torch and torchrun's flags meets.

    python bench/bench_defaults.py [--runs 10] [--record]

Three measurements, each with the default ``--preload auto`` (the scripts import torch,
so their workers are forked from the zygote):

- **torch's watchdog.** ``TORCHELASTIC_ENABLE_FILE_TIMER=1 agentd run --standalone
  --nproc-per-node 2 --max-restarts 1`` of a script whose local rank 0 configures torch's
  ``FileTimerClient`` and hangs in ``expires(after=1)`` on its first attempt: the runs
  where the worker was reaped and the job restarted and exited 0, and the lines of the
  agent that dropped a request as untrusted.
- **The first heartbeat.** Four workers call ``agentd.heartbeat()`` as their first act:
  the runs in which the agent dropped one as untrusted.
- **A stop while waiting for peers.** ``--nnodes 2`` with no second node: SIGTERM once the
  agent waits in the rendezvous; seconds to its exit and its exit status, against
  torchrun's in the same run.
- **A job stopped whole.** Two nodes of ``--nnodes 2`` (``c10d``, one endpoint: the
  first one serves the store), one worker each: SIGTERM to both at once once both
  workers run (``scancel``, ``kubectl delete``); seconds until both have exited, and
  their exit statuses, against torchrun's in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from report_files import write_report
from run_control import free_port, listening, wait_for

TIMER_JOB = """\
import os, time
import torch  # noqa: F401
from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
if os.environ["LOCAL_RANK"] == "0" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    with expires(after=1):
        time.sleep(60)
"""
HEARTBEAT_JOB = """\
import torch  # noqa: F401
import agentd

for _ in range(3):
    agentd.heartbeat()
"""
UNTRUSTED = "dropped (untrusted"
COMMAND = ".venv/bin/python bench/bench_defaults.py --runs 10 --record"


def agentd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentd", "run", *args]


def run(argv: list[str], folder: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        argv, cwd=folder, env={**os.environ, **(env or {})}, capture_output=True, timeout=120
    )
    return done.returncode, done.stderr.decode(errors="replace")


def torch_timer(folder: Path, runs: int) -> tuple[int, int]:
    """(runs reaped, restarted and exit 0; untrusted lines in all runs)."""
    script = folder / "timer_job.py"
    write_report(script, TIMER_JOB)
    good = untrusted = 0
    env = {"TORCHELASTIC_ENABLE_FILE_TIMER": "1"}
    for _ in range(runs):
        argv = agentd("--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(script))
        code, err = run(argv, folder, env)
        good += code == 0 and "expired: sent SIGKILL" in err and "restart 1 of 1" in err
        untrusted += err.count(UNTRUSTED)
    return good, untrusted


def first_heartbeat(folder: Path, runs: int) -> int:
    """The runs in which a first heartbeat was dropped as untrusted."""
    script = folder / "heartbeat_job.py"
    write_report(script, HEARTBEAT_JOB)
    dropped = 0
    for _ in range(runs):
        code, err = run(agentd("--standalone", "--nproc-per-node", "4", str(script)), folder)
        if code != 0:
            raise SystemExit(f"the heartbeat job failed ({code}):\n{err[-2000:]}")
        dropped += UNTRUSTED in err
    return dropped


def timed_runs(
    what: str,
    measure: Callable[[Path, str], tuple[float, list[int]]],
    folder: Path,
    runs: int,
    launchers: tuple[str, ...] = ("agentd", "torchrun"),
) -> dict[str, float]:
    """``measure`` ``runs`` times for each launcher, in turns: the median seconds of each
    (printed with the slowest and the exit statuses seen)."""
    found: dict[str, list[tuple[float, list[int]]]] = {launcher: [] for launcher in launchers}
    for _ in range(runs):
        for launcher, results in found.items():
            results.append(measure(folder, launcher))
    medians = {}
    for launcher, results in found.items():
        medians[launcher] = statistics.median(s for s, _ in results)
        codes = sorted({c for _, cs in results for c in cs})
        slowest = max(s for s, _ in results)
        median = medians[launcher]
        print(f"{what}, {launcher}: median {median:.2f}s (slowest {slowest:.2f}), exit {codes}")
    return medians


def stop_while_waiting(folder: Path, launcher: str) -> tuple[float, list[int]]:
    """Seconds from SIGTERM to the exit of a launcher waiting for its peer, and its status."""
    script = folder / "ok.py"
    write_report(script, "print('never runs')\n")
    port = free_port()
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    flags += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", str(script)]
    base = [sys.executable, "-m", "torch.distributed.run"] if launcher == "torchrun" else agentd()
    err = folder / f"{launcher}.err"
    with open(err, "wb") as out:
        proc = subprocess.Popen([*base, *flags], cwd=folder, stderr=out, stdout=out)
    try:
        if not wait_for(lambda: listening(port), 60):  # it hosts the rendezvous store
            raise SystemExit(f"{launcher} never served its store:\n{err.read_text()}")
        time.sleep(1.0)  # joined, and waiting for the peer
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            return float("inf"), []
        return time.monotonic() - began, [code]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


READY_JOB = """\
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], "ready_" + os.environ["RANK"]).touch()
time.sleep(120)
"""


def stop_whole(folder: Path, launcher: str) -> tuple[float, list[int]]:
    """Seconds from SIGTERM to both nodes of a running two-node job to the exit of the
    last, and their statuses."""
    script, ready = folder / "ready_job.py", folder / f"ready-{launcher}"
    write_report(script, READY_JOB)
    shutil.rmtree(ready, ignore_errors=True)
    ready.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    flags += ["--rdzv-endpoint", endpoint, "--rdzv-id", "whole", str(script), str(ready)]
    base = [sys.executable, "-m", "torch.distributed.run"] if launcher == "torchrun" else agentd()
    procs = []
    try:
        for node in range(2):
            err = folder / f"{launcher}-{node}.err"
            with open(err, "wb") as out:
                procs.append(subprocess.Popen([*base, *flags], cwd=folder, stderr=out, stdout=out))
        if not wait_for(lambda: len(list(ready.iterdir())) == 2, 60):
            raise SystemExit(f"{launcher}'s two-node job never ran")
        began = time.monotonic()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        try:
            codes = [proc.wait(timeout=60) for proc in procs]
        except subprocess.TimeoutExpired:
            return float("inf"), []
        return time.monotonic() - began, codes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-defaults-") as tmp:
        folder = Path(tmp)
        good, untrusted = torch_timer(folder, args.runs)
        print(
            f"torch's watchdog: {good}/{args.runs} reaped and restarted, exit 0; "
            f"{untrusted} untrusted line(s)"
        )
        dropped = first_heartbeat(folder, args.runs)
        print(f"first heartbeat of 4 forked workers: dropped in {dropped}/{args.runs} runs")
        runs = max(3, args.runs // 2)
        medians = timed_runs("SIGTERM while waiting for a peer", stop_while_waiting, folder, runs)
        ends = timed_runs("SIGTERM to both nodes of a running job", stop_whole, folder, runs)
    if args.record:
        sys.path.insert(0, str(Path(__file__).parent))
        from figures import record

        record(
            "defaults_torch_timer",
            f"{good} of {args.runs}",
            COMMAND,
            f"reaped and restarted under the default preload; {untrusted} untrusted lines",
        )
        record(
            "defaults_first_heartbeat",
            f"{dropped} of {args.runs}",
            COMMAND,
            "runs in which a forked worker's first heartbeat was dropped as untrusted",
        )
        record(
            "stop_waiting",
            f"{medians['agentd']:.2f} s",
            COMMAND,
            "median seconds from SIGTERM to the exit of an agent waiting for its peer",
        )
        record(
            "stop_waiting_torchrun",
            f"{medians['torchrun']:.2f} s",
            COMMAND,
            "the same, torchrun, in the same run",
        )
        record(
            "stop_whole_job",
            f"{ends['agentd']:.2f} s",
            COMMAND,
            "median seconds from SIGTERM to both nodes of a running two-node job to both exits",
        )
        record(
            "stop_whole_job_torchrun",
            f"{ends['torchrun']:.2f} s",
            COMMAND,
            "the same, torchrun, in the same run",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
