"""What --preload buys at the first start, and what forked workers share (copy-on-write).

    python bench/bench_preload.py [--runs 3] [--nproc 4]

1. First start: the command starts -> all NPROC workers past ``import torch`` and a model
   step, for agentd spawned (--no-preload), agentd with no flags (--preload auto: the
   workers import torch, so a zygote preloads it), agentd --preload torch and torchrun,
   against the floor of one ``import torch`` plus agentd's own launch of trivial workers
   (the rendezvous).
2. Memory: the workers' resident memory split into what they share and what is private
   to each (``/proc/<pid>/smaps_rollup``), and the sum of their proportional shares (PSS,
   the zygote's included): what the group really costs the host.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_files import reports, wait_reports

HERE = Path(__file__).parent
WORKER = str(HERE / "torch_start_worker.py")
TRIVIAL = str(HERE / "worker.py")
AGENTD = [sys.executable, "-m", "agentd", "run"]
COMMANDS = {
    "agentd-spawn": [*AGENTD, "--no-preload"],
    "agentd": AGENTD,
    "agentd-preload": [*AGENTD, "--preload", "torch"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def launch(cmd: list[str], nproc: int, script_args: list[str]) -> subprocess.Popen[bytes]:
    argv = [*cmd, "--standalone", "--nproc-per-node", str(nproc), *script_args]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )


def wait_files(out: Path, prefix: str, count: int, timeout: float = 120) -> list[str]:
    """The texts of ``count`` reports ``prefix_*`` in ``out``, once all are written."""

    def enough() -> list[Path]:
        found = reports(out, f"{prefix}_*")
        return found if len(found) >= count else []

    return wait_reports(enough, timeout, what=f"{count} workers")


def finish(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def first_start(cmd: list[str], nproc: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        began = time.time()
        proc = launch(cmd, nproc, [WORKER, tmp])
        stamps = wait_files(Path(tmp), "ready", nproc)
        finish(proc)
        return max(float(s.split()[0]) for s in stamps) - began


def trivial_launch(nproc: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        began = time.time()
        proc = launch(AGENTD, nproc, [TRIVIAL, "exit", tmp])
        stamps = wait_files(Path(tmp), "start_0", nproc)
        finish(proc)
        return max(float(s) for s in stamps) - began


def import_torch() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=ENV)
    return time.perf_counter() - began


def rollup(pid: int) -> dict[str, int]:
    """kB figures of one process's smaps_rollup."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as fp:
        for line in fp:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1])
    return values


def memory(cmd: list[str], nproc: int) -> dict[str, float]:
    """MiB: resident, shared and private per worker (mean), and the group's total PSS."""
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        proc = launch(cmd, nproc, [WORKER, tmp, "60"])
        try:
            pids = [int(s.split()[1]) for s in wait_files(Path(tmp), "ready", nproc)]
            time.sleep(0.5)
            figures = [rollup(pid) for pid in pids]
            workers = set(pids)
            helpers = [
                p.pid
                for p in psutil.Process(proc.pid).children(recursive=True)
                if p.pid not in workers and "zygote" in " ".join(p.cmdline())
            ]
            zygote_pss = sum(rollup(pid)["Pss"] for pid in helpers)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            finish(proc)
    mean = lambda key: statistics.mean(sum(f[k] for k in key) for f in figures) / 1024  # noqa: E731
    return {
        "rss": mean(("Rss",)),
        "shared": mean(("Shared_Clean", "Shared_Dirty")),
        "private": mean(("Private_Clean", "Private_Dirty")),
        "pss_total": (sum(f["Pss"] for f in figures) + zygote_pss) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        sys.exit("bench_preload needs torch (pip install torch==2.13.0)")
    import_torch()  # warm the page cache
    one_import = statistics.median(import_torch() for _ in range(args.runs))
    rendezvous = statistics.median(trivial_launch(args.nproc) for _ in range(args.runs))
    floor = one_import + rendezvous
    print(f"first start of {args.nproc} torch workers ({args.runs} runs, {os.cpu_count()} CPUs)")
    print(
        f"  floor: one import torch {one_import * 1000:.0f} ms + agentd launch of trivial "
        f"workers {rendezvous * 1000:.0f} ms = {floor * 1000:.0f} ms"
    )
    for name, cmd in COMMANDS.items():
        times = [first_start(cmd, args.nproc) for _ in range(args.runs)]
        median = statistics.median(times)
        low, high = min(times) * 1000, max(times) * 1000
        print(
            f"  {name:<14} median {median * 1000:6.0f} ms  min {low:6.0f}  max {high:6.0f}"
            f"  = {median / floor:.2f}x the floor",
            flush=True,
        )
    print(f"\nmemory of {args.nproc} torch workers, MiB (per worker: resident = shared + private)")
    for name in ("agentd-spawn", "agentd"):
        m = memory(COMMANDS[name], args.nproc)
        print(
            f"  {name:<14} resident {m['rss']:6.1f}  shared {m['shared']:6.1f}  private "
            f"{m['private']:6.1f}  group PSS {m['pss_total']:6.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
