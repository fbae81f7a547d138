"""A node started at the endpoint after the store's host was lost: does it find the job?

    python bench/bench_seed_back.py [--runs 3] [--after 0,3]
        [--launchers agentd,agentd-given,torchrun] [--new-host] [--record]
    python bench/bench_seed_back.py --both-lost [--local-addrs] [--runs 3] [--after 0,3]
        [--launchers agentd,agentd-given] [--record]

Three nodes of ``--nnodes 2:4`` run on 127.0.0.1 with one ``--rdzv-endpoint`` and the
defaults (one worker each, ``member_worker.py``); the node serving the store is SIGKILLed,
and ``--after`` seconds later a fourth node starts with the same command line (a restarted
pod or unit of the lost host, or a node added). The figure is the time from the fourth
node's start to its worker in a world of 3, beside the two survivors; none within
:data:`WITHIN` counts as never. The fourth node shares the lost host's temporary
directory, where that host kept its store's last round and candidate list
(agentd/rendezvous/host_memory.py): the host restarted. With ``--new-host`` it has one of
its own: a node added on another machine, or the pod replaced without its volume. The
launchers:

* ``agentd``: no token given: on loopback the seed makes one and publishes it for this
  user (agentd/store/token_file.py), and the members standing by keep a copy for a store
  started at the endpoint later;
* ``agentd-given``: ``AGENTD_STORE_TOKEN`` shared by all four;
* ``torchrun``: its c10d rendezvous (needs torch).

``--both-lost``: once the two survivors run at world 2, the one serving the store after
the failover is SIGKILLed too, and ``--after`` seconds later both killed nodes start
again with their command lines; the figure is the time from their start to the three at
work in a world of 3 (``--record``: the slowest, all on 127.0.0.1, for ``agentd`` and
``agentd-given``). All three share 127.0.0.1 unless ``--local-addrs`` gives each
its own loopback address (as hosts of their own: a member stands by on the seed's port
there, so a restarted node stands by where it stood before).

Each run gets a private ``XDG_RUNTIME_DIR``, so no token of another run is found. With
BENCH_SEED_BACK_KEEP=1 set, each run's folder (the nodes' logs, `node<N>.err`) is kept;
a run slower than 5 s keeps a copy of it all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench_failover import TOKEN, WORKER, reports
from run_control import end_run, free_port, wait_for

MARK_ENV = "BENCH_SEED_BACK_RUN"
"""Marks every process of one run: a SIGKILLed torchrun leaves its worker behind."""
WITHIN = 30.0
"""Seconds the fourth node is given to work in a world of 3."""
COMMAND = ".venv/bin/python bench/bench_seed_back.py --runs 3 --record"
NEW_HOST_COMMAND = (
    ".venv/bin/python bench/bench_seed_back.py --new-host --launchers agentd,agentd-given "
    "--runs 3 --record"
)
BOTH_LOST_COMMAND = ".venv/bin/python bench/bench_seed_back.py --both-lost --runs 3 --record"


class Job:
    """Nodes of one ``--nnodes 2:4`` job on this machine, started by ``launcher`` in
    ``folder`` (each a worker reporting to ``node<N>/``, its output in ``node<N>.err``);
    ``addrs``: node N on 127.0.0.N+1 (``--local-addr``), as on hosts of their own."""

    def __init__(self, folder: Path, launcher: str, addrs: bool = False) -> None:
        self.folder = folder
        self.addrs = addrs
        runtime = folder / "runtime"
        runtime.mkdir(mode=0o700)
        self.stop = folder / "stop"
        self.marker = os.urandom(6).hex()
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONWARNINGS": "ignore"}
        self.env["TMPDIR"] = str(self.disk("tmp"))  # the hosts' disk: records of this run
        self.env[MARK_ENV] = self.marker
        if launcher == "agentd-given":
            self.env["AGENTD_STORE_TOKEN"] = TOKEN
        self.base = (
            [sys.executable, "-m", "torch.distributed.run"]
            if launcher == "torchrun"
            else [sys.executable, "-m", "agentd", "run"]
        )
        self.flags = ["--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-id", "seed-back"]
        self.flags += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
        self.procs: list[subprocess.Popen[bytes]] = []

    def disk(self, name: str) -> Path:
        """A temporary directory of the run's, for the nodes that share it."""
        folder = self.folder / name
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def start(self, host: int, tmpdir: Path | None = None) -> Path:
        """Start a node on host ``host`` (its address with ``addrs``), with a temporary
        directory of its own if ``tmpdir`` is given: where it reports."""
        index = len(self.procs)
        out = self.folder / f"node{index}"
        out.mkdir()
        own = ["--local-addr", f"127.0.0.{host + 1}"] if self.addrs else []
        argv = [*self.base, *self.flags, *own, WORKER, str(out), str(self.stop)]
        log = self.folder / f"node{index}.err"
        env = self.env if tmpdir is None else {**self.env, "TMPDIR": str(tmpdir)}
        with open(log, "wb") as err:
            self.procs.append(
                subprocess.Popen(argv, env=env, stdout=err, stderr=err, cwd=self.folder)
            )
        return out

    def three(self) -> list[Path]:
        """Three nodes at work in a world of 3, the first serving the store."""
        outs = [self.start(0)]
        time.sleep(0.5)  # the first one serves the store
        outs += [self.start(1), self.start(2)]
        if not wait_for(lambda: all(at_world(out, 3) for out in outs), 90):
            raise SystemExit("the three-node job never ran")
        time.sleep(1.0)  # the others stand by as the round forms (agentd)
        return outs

    def kill(self, index: int) -> float:
        """SIGKILL node ``index``: when (epoch seconds)."""
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait()
        return time.time()

    def log(self, index: int) -> str:
        return (self.folder / f"node{index}.err").read_text(errors="replace")

    def end(self) -> None:
        """Kill what is left of the run, by pid: launchers and every marked process."""
        end_run(self.procs, MARK_ENV, self.marker)


def run_once(launcher: str, after: float, new_host: bool) -> tuple[float, list[int | None]]:
    """Seconds from the fourth node's start to its worker in a world of 3 (inf: never),
    and the exit statuses of the survivors and the fourth once stopped. ``new_host``:
    the fourth has a temporary directory of its own."""
    with run_folder() as tmp:
        job = Job(Path(tmp), launcher)
        try:
            job.three()
            killed = job.kill(0)
            time.sleep(after)
            began = time.time()
            fourth = job.start(0, job.disk("new-host") if new_host else None)
            if not wait_for(lambda: at_world(fourth, 3, killed), WITHIN):
                return keep_if_slow(tmp, float("inf")), []
            took = max(r["started"] for r in reports(fourth) if r["world"] == 3) - began
            keep_if_slow(tmp, took)
            job.stop.touch()
            return took, [proc.wait(60) for proc in job.procs[1:]]
        finally:
            job.end()


def both_lost(launcher: str, after: float, addrs: bool) -> tuple[float, list[int | None]]:
    """The store's host killed; once the two others run at world 2, the one serving the
    store now killed too; ``after`` seconds later both restarted with their command lines:
    seconds from their start to the three at work in a world of 3 (inf: never)."""
    with run_folder() as tmp:
        job = Job(Path(tmp), launcher, addrs)
        try:
            outs = job.three()
            first = job.kill(0)
            if not wait_for(lambda: all(at_world(out, 2, first) for out in outs[1:]), WITHIN):
                return float("inf"), []
            [serving] = [i for i in (1, 2) if "now serving" in job.log(i)]
            time.sleep(1.0)
            second = job.kill(serving)
            time.sleep(after)
            left = outs[3 - serving]
            began = time.time()
            outs = [left, job.start(0), job.start(serving)]
            if not wait_for(lambda: all(at_world(out, 3, second) for out in outs), WITHIN):
                return keep_if_slow(tmp, float("inf")), []
            took = max(r["started"] for o in outs for r in reports(o) if r["world"] == 3) - began
            keep_if_slow(tmp, took)
            job.stop.touch()
            return took, [proc.wait(60) for proc in job.procs if proc.returncode is None]
        finally:
            job.end()


KEEP_ENV = "BENCH_SEED_BACK_KEEP"
"""Set (to anything): each run's folder, the nodes' logs in it, is kept and named."""
SLOW = 5.0
"""A run slower than this keeps a copy of its folder all the same: its logs say why."""


def keep_if_slow(folder: str, took: float) -> float:
    """Copy the run's ``folder`` aside (and name it) if it took over :data:`SLOW`
    seconds and is not kept anyway; ``took``, returned."""
    if took > SLOW and not os.environ.get(KEEP_ENV):
        copy = shutil.copytree(
            folder, tempfile.mkdtemp(prefix="bench-seed-back-slow-"), dirs_exist_ok=True
        )
        print(f"  (a run took {shown(took).strip()}: its folder, copied: {copy})", flush=True)
    return took


@contextlib.contextmanager
def run_folder() -> Iterator[str]:
    """A run's folder: removed after it, unless :data:`KEEP_ENV` is set."""
    if not os.environ.get(KEEP_ENV):
        with tempfile.TemporaryDirectory(prefix="bench-seed-back-") as tmp:
            yield tmp
        return
    tmp = tempfile.mkdtemp(prefix="bench-seed-back-")
    print(f"  (the run's folder, kept: {tmp})", flush=True)
    yield tmp


def at_world(out: Path, world: int, after: float = 0.0) -> bool:
    """Whether the node whose worker reports to ``out`` ran one in a world of ``world``
    started after ``after`` (epoch seconds)."""
    return any(r["world"] == world and r["started"] > after for r in reports(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--after", default="0,3", help="seconds after the kill, e.g. 0,3")
    parser.add_argument("--launchers", default="agentd,agentd-given,torchrun")
    parser.add_argument("--record", action="store_true", help="write docs/figures.json")
    parser.add_argument(
        "--new-host",
        action="store_true",
        help="the fourth node has a temporary directory of its own (no record of the store)",
    )
    parser.add_argument(
        "--both-lost",
        action="store_true",
        help="agentd alone: the host, then the node serving after it, killed; both restarted",
    )
    parser.add_argument(
        "--local-addrs", action="store_true", help="with --both-lost: a loopback address each"
    )
    args = parser.parse_args()
    if args.both_lost:
        return report_both_lost(args)
    launchers = args.launchers.split(",")
    if not set(launchers) <= {"agentd", "agentd-given", "torchrun"}:
        parser.error(f"--launchers: {args.launchers!r} names others than the three")
    if "torchrun" in launchers and importlib.util.find_spec("torch") is None:
        print("torch is not installed: torchrun is left out")
        launchers.remove("torchrun")
    delays = [float(d) for d in args.after.split(",")]
    disk = fourth_disk(args)
    print(
        "store host SIGKILLed in a 3-node --nnodes 2:4 job on 127.0.0.1, a fourth node "
        f"({disk}) started S s later: its start -> its worker in a world of 3 ({args.runs} "
        f"runs, {os.cpu_count()} CPUs; none within {WITHIN:g} s: never)"
    )
    slowest: dict[str, float] = {}
    for launcher in launchers:
        for delay in delays:
            results = [run_once(launcher, delay, args.new_host) for _ in range(args.runs)]
            slowest[launcher] = max(slowest.get(launcher, 0.0), row(launcher, delay, results))
    if args.record:
        record(args, slowest, delays)
    return 0


def fourth_disk(args: argparse.Namespace) -> str:
    """Where the fourth node's temporary directory is, in words."""
    return "a temporary directory of its own" if args.new_host else "the lost host's disk"


def report_both_lost(args: argparse.Namespace) -> int:
    """``--both-lost``: each agentd launcher, at each delay (torchrun's job does not
    outlive the first kill)."""
    where = "a loopback address each" if args.local_addrs else "all on 127.0.0.1"
    print(
        "store host SIGKILLed in a 3-node --nnodes 2:4 job, then the node serving after it; "
        f"both restarted S s later ({where}): their start -> the three in a world of 3 "
        f"({args.runs} runs, {os.cpu_count()} CPUs; none within {WITHIN:g} s: never)"
    )
    slowest: dict[str, float] = {}
    for launcher in [name for name in args.launchers.split(",") if name != "torchrun"]:
        for delay in (float(d) for d in args.after.split(",")):
            results = [both_lost(launcher, delay, args.local_addrs) for _ in range(args.runs)]
            slowest[launcher] = max(slowest.get(launcher, 0.0), row(launcher, delay, results))
    if args.record:
        record_both_lost(args, slowest)
    return 0


def row(launcher: str, delay: float, results: list[tuple[float, list[int | None]]]) -> float:
    """Print one launcher's runs at one delay: the median, the slowest (returned) and the
    exit statuses seen."""
    took = [t for t, _ in results]
    codes = sorted({str(c) for _, cs in results for c in cs})
    print(
        f"  {launcher:<13} after {delay:3g} s: median {shown(statistics.median(took))}"
        f"  max {shown(max(took))}  (exit statuses: {', '.join(codes) or 'none'})",
        flush=True,
    )
    return max(took)


def shown(seconds: float) -> str:
    return "never" if seconds == float("inf") else f"{seconds:5.2f} s"


def record(args: argparse.Namespace, slowest: dict[str, float], delays: list[float]) -> None:
    """The default: the fourth node on the lost host's disk, each launcher (torchrun keeps
    nothing there). ``--new-host``: the two agentd launchers."""
    needed = {"agentd", "agentd-given"} | (set() if args.new_host else {"torchrun"})
    if set(slowest) != needed:
        raise SystemExit(f"--record: needs the launchers {','.join(sorted(needed))}")
    after = ", ".join(f"{d:g}" for d in delays)
    disk = fourth_disk(args)
    what = (
        f"the slowest of {args.runs} runs at each delay ({after} s): the store's host "
        f"SIGKILLed, a fourth node ({disk}) started then: its start -> its worker in a "
        "world of 3"
    )
    if args.new_host:
        names = {
            "agentd": "seed_back_new_host_published_token",
            "agentd-given": "seed_back_new_host_given_token",
        }
        write_figures(names, slowest, NEW_HOST_COMMAND, what)
        return
    names = {"agentd": "seed_back_published_token", "agentd-given": "seed_back_given_token"}
    write_figures({**names, "torchrun": "seed_back_torchrun"}, slowest, COMMAND, what)


def record_both_lost(args: argparse.Namespace, slowest: dict[str, float]) -> None:
    if set(slowest) != {"agentd", "agentd-given"} or args.local_addrs:
        raise SystemExit("--both-lost --record: needs both agentd launchers, on 127.0.0.1")
    what = (
        f"the slowest of {args.runs} runs at each delay ({args.after} s): the store's host "
        "SIGKILLed, then the node serving after it, both restarted (all on 127.0.0.1): "
        "their start -> the three in a world of 3"
    )
    names = {
        "agentd": "seed_back_both_lost_published_token",
        "agentd-given": "seed_back_both_lost_given_token",
    }
    write_figures(names, slowest, BOTH_LOST_COMMAND, what)


def write_figures(
    names: dict[str, str], slowest: dict[str, float], command: str, what: str
) -> None:
    """Record each launcher's slowest run as the figure ``names`` gives it."""
    from figures import record as write

    for launcher, name in names.items():
        seconds = slowest[launcher]
        text = f"none within {WITHIN:g} s" if seconds == float("inf") else f"{seconds:.2f} s"
        write(name, text, command, f"{what} ({launcher})")


if __name__ == "__main__":
    sys.exit(main())
