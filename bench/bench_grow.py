"""A node that joins a running elastic job below its MAX: how soon does it work in the
larger world?

    python bench/bench_grow.py [--runs 3] [--most 4] [--launchers agentd,torchrun] [--record]
    python bench/bench_grow.py --replace [--runs 3] [--most 4] [--record]

Two nodes of ``--nnodes 2:MOST`` (``c10d``, one endpoint: the first one serves the
store), one worker each, run; then a third node starts. The figure is the time from its
start to the start of a worker of rank 2 (a world of 3), against torchrun's in the same
run. With ``--most 3`` the third node takes the round's last place; below that, the
world of 3 is whatever the round holds when it is sealed. A launcher whose third node is
not at work within 120 s counts as never (torchrun 2.13 on one host: its agents' next
round timed out on its store's keys after 60 s, with ``--most`` 3 and 4).

``--replace``: the two run, the second is SIGKILLed, and a new node starts in its place
(``--max-restarts 3``, so the one left waits for it): the time from the new node's start
to its worker of rank 1 in a world of 2. The round after the loss lacks only its minimum
once the lost node is accounted for; the replacement's arrival completes it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_defaults import READY_JOB, agentd, timed_runs
from report_files import write_report
from run_control import end_run, free_port, wait_for

COMMAND = ".venv/bin/python bench/bench_grow.py --runs 3 --record"
MARK_ENV = "BENCH_GROW_RUN"
"""Marks the processes of one run (see run_control.kill_marked)."""
ADMIT_WITHIN = 120.0
"""Seconds a third node is given to work in a world of 3."""


class TwoNodes:
    """A job of ``2:MOST`` nodes on 127.0.0.1 started by ``launcher`` in ``folder``, one
    worker each (``READY_JOB``: ``ready-<launcher>/ready_<RANK>`` once it runs); every
    process it starts is marked (:data:`MARK_ENV`), so :meth:`end` kills what a killed
    torchrun left behind too."""

    def __init__(self, folder: Path, launcher: str, most: int, *flags: str) -> None:
        script, self.ready = folder / "ready_job.py", folder / f"ready-{launcher}"
        write_report(script, READY_JOB)
        shutil.rmtree(self.ready, ignore_errors=True)
        self.ready.mkdir()
        self.folder, self.launcher = folder, launcher
        endpoint = f"127.0.0.1:{free_port()}"
        self.flags = ["--nnodes", f"2:{most}", "--nproc-per-node", "1", "--rdzv-backend"]
        self.flags += ["c10d", *flags, "--rdzv-endpoint", endpoint, str(script), str(self.ready)]
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
        self.base = torchrun if launcher == "torchrun" else agentd()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.marker = os.urandom(6).hex()
        self.env = {**os.environ, MARK_ENV: self.marker}

    def start(self) -> None:
        err = self.folder / f"{self.launcher}-{len(self.procs)}.err"
        with open(err, "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [*self.base, *self.flags], cwd=self.folder, stderr=out, stdout=out, env=self.env
                )
            )

    def run_two(self) -> None:
        for _ in range(2):
            self.start()
        if not wait_for(lambda: len(list(self.ready.iterdir())) == 2, 90):
            raise SystemExit(f"{self.launcher}'s two-node job never ran")

    def stop(self, procs: list[subprocess.Popen[bytes]]) -> list[int]:
        """SIGTERM ``procs``: their exit statuses."""
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        return [proc.wait(timeout=60) for proc in procs]

    def end(self) -> None:
        end_run(self.procs, MARK_ENV, self.marker)


def third_node(folder: Path, launcher: str, most: int) -> tuple[float, list[int]]:
    """Seconds from the third node's start to its world of 3's rank 2 worker, and the
    three launchers' exit statuses once stopped."""
    job = TwoNodes(folder, launcher, most, "--rdzv-id", "grow")
    try:
        job.run_two()
        began = time.monotonic()
        job.start()
        if not wait_for(lambda: (job.ready / "ready_2").exists(), ADMIT_WITHIN):
            return float("inf"), []
        took = time.monotonic() - began
        return took, job.stop(job.procs)
    finally:
        job.end()


def replaced_node(folder: Path, launcher: str, most: int) -> tuple[float, list[int]]:
    """Two nodes of ``2:MOST`` run; the second is SIGKILLed and a new node started: seconds
    from its start to a worker of rank 1 in a world of 2, and the two launchers' exit
    statuses once stopped. ``--max-restarts 3``: the one left waits for a replacement."""
    job = TwoNodes(folder, launcher, most, "--max-restarts", "3", "--rdzv-id", "replace")
    try:
        job.run_two()
        time.sleep(1.0)  # its guardian runs (agentd), its keep-alives flow (torchrun)
        job.procs[1].send_signal(signal.SIGKILL)
        job.procs[1].wait()
        (job.ready / "ready_1").unlink()
        began = time.monotonic()
        job.start()
        if not wait_for(lambda: (job.ready / "ready_1").exists(), ADMIT_WITHIN):
            return float("inf"), []
        took = time.monotonic() - began
        return took, job.stop([job.procs[0], job.procs[2]])
    finally:
        job.end()


def shown(median: float, runs: int) -> str:
    """A median of seconds as a figure; never within :data:`ADMIT_WITHIN`: says so."""
    if median == float("inf"):
        return f"none within {ADMIT_WITHIN:g} s (median of {runs} runs)"
    return f"{median:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--most", type=int, default=4, help="the job's MAX nodes (3 or more)")
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--record", action="store_true")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="two nodes run, one is SIGKILLed and a new one started in its place",
    )
    args = parser.parse_args()
    launchers = tuple(args.launchers.split(","))
    if not set(launchers) <= {"agentd", "torchrun"}:
        parser.error(f"--launchers: {args.launchers!r} names others than agentd, torchrun")
    if args.record and len(launchers) < 2:
        parser.error("--record: needs both launchers (the figures are compared)")
    if args.most < 3:
        parser.error(f"--most: {args.most} leaves no room for a third node (3 or more)")
    measure, what = third_node, f"a third node joins a running 2:{args.most} job"
    if args.replace:
        measure, what = replaced_node, f"a node of a 2:{args.most} job of two replaced"
    with tempfile.TemporaryDirectory(prefix="bench-grow-") as tmp:
        folder = Path(tmp)
        medians = timed_runs(
            what,
            lambda f, launcher: measure(f, launcher, args.most),
            folder,
            args.runs,
            launchers,
        )
    if args.record and args.replace:
        record_replaced(medians, args.runs, args.most)
    elif args.record:
        sys.path.insert(0, str(Path(__file__).parent))
        from figures import record

        record(
            "grow_third_node",
            shown(medians["agentd"], args.runs),
            COMMAND,
            f"median seconds from a third node's start to its worker in a world of 3 "
            f"(--nnodes 2:{args.most}, c10d)",
        )
        record(
            "grow_third_node_torchrun",
            shown(medians["torchrun"], args.runs),
            COMMAND,
            "the same, torchrun, in the same run",
        )
    return 0


def record_replaced(medians: dict[str, float], runs: int, most: int) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from figures import record

    command = f".venv/bin/python bench/bench_grow.py --replace --most {most} --runs {runs} --record"
    record(
        "replace_lost_node",
        shown(medians["agentd"], runs),
        command,
        f"median seconds from a replacement's start to its worker of rank 1 in a world of 2 "
        f"(--nnodes 2:{most}, two nodes, one SIGKILLed; c10d)",
    )
    record(
        "replace_lost_node_torchrun",
        shown(medians["torchrun"], runs),
        command,
        "the same, torchrun, in the same run",
    )


if __name__ == "__main__":
    sys.exit(main())
