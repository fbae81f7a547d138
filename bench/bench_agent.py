"""agentd vs torchrun on one host, same workers, same run: launch, restart, idle cost.

    python bench/bench_agent.py [--runs 5] [--idle 10]

Measures, for each launcher (torchrun only where torch is installed):
  1. launch: the command starts -> the first of 4 trivial workers runs;
  2. restart: a worker crashes -> the first worker of the next attempt runs;
  3. idle: the agent's peak RSS, CPU time and wake-ups per second while 4 workers sleep,
     the helper processes every agent starts included (the guardian; their RSS is shown
     apart too), and for agentd again with restarts allowed (``-r 3``: the zygote of the
     restarts and its 4 spares come too).
``agentd`` is the default (for these workers: the first attempt spawned, restarts forked
from a bare zygote); ``agentd-spawn`` spawns every worker (``--no-preload``). Prints
median/min/max per figure and the ratios torchrun/agentd.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from report_files import wait_reports

WORKER = str(Path(__file__).with_name("worker.py"))
NPROC = 4


def launcher_commands() -> dict[str, list[str]]:
    agentd = [sys.executable, "-m", "agentd", "run"]
    commands = {"agentd": agentd, "agentd-spawn": [*agentd, "--no-preload"]}
    if importlib.util.find_spec("torch") is not None:
        commands["torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    return commands


def start(cmd: list[str], out: Path, mode: str, *extra: str, restarts: int = 0) -> subprocess.Popen:
    args = [
        *cmd,
        "--standalone",
        "--nproc-per-node",
        str(NPROC),
        "--max-restarts",
        str(restarts),
        WORKER,
        mode,
        str(out),
        *extra,
    ]
    # Byte-code caching on, as for any installed package (torch's were compiled by pip).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def first_start(out: Path, restart: int, proc: subprocess.Popen) -> float:
    """When the first worker of attempt ``restart`` ran (every worker reports)."""
    starts = [out / f"start_{restart}_{rank}" for rank in range(NPROC)]
    return min(map(float, wait_reports(starts, 60, alive=lambda: proc.poll() is None)))


def finish(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure_launch(cmd: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        t0 = time.time()
        proc = start(cmd, out, "exit")
        first = first_start(out, 0, proc)
        finish(proc)
        return first - t0


def measure_restart(cmd: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        proc = start(cmd, out, "crash", restarts=1)
        crash = float(wait_reports([out / "crash_0"], 60)[0])
        first = first_start(out, 1, proc)
        proc.terminate()
        finish(proc)
        return first - crash


def task_stats(proc: psutil.Process) -> tuple[int, int]:
    """Context switches summed over the process's threads, and its peak RSS in bytes."""
    switches = 0
    for tid in os.listdir(f"/proc/{proc.pid}/task"):
        with open(f"/proc/{proc.pid}/task/{tid}/status") as fp:
            for line in fp:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
    with open(f"/proc/{proc.pid}/status") as fp:
        hwm = next(int(line.split()[1]) * 1024 for line in fp if line.startswith("VmHWM"))
    return switches, hwm


def guardians(agent: psutil.Process) -> list[psutil.Process]:
    """The guardian processes an agent started (in sessions of their own, so not its
    children by the time we look): ``guardian_process.py <agent pid>.<...>``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(arg.endswith("guardian_process.py") for arg in cmdline) and any(
            arg.startswith(f"{agent.pid}.") for arg in cmdline
        ):
            found.append(proc)
    return found


def zygotes(agent: psutil.Process) -> list[psutil.Process]:
    """The agent's zygote, where it keeps one (``python -m agentd.preload.zygote``)."""
    found = []
    for child in agent.children():
        with contextlib.suppress(psutil.Error):
            if "agentd.preload.zygote" in child.cmdline():
                found.append(child)
    return found


def spares(zygote: psutil.Process) -> list[psutil.Process]:
    """The zygote's children forked ahead of a restart (``agentd: standby worker ...``)."""
    found = []
    for child in zygote.children():
        with contextlib.suppress(psutil.Error):
            if child.cmdline()[0].startswith("agentd: standby worker"):
                found.append(child)
    return found


def measure_idle(
    cmd: list[str], seconds: float, restarts: int = 0
) -> tuple[float, float, float, float]:
    """(peak RSS MiB of the agent, of its helper processes, CPU seconds, wake-ups per
    second) while its workers sleep. The helpers are the guardian and the zygote, where
    the agent keeps one, the zygote's spares and the guardian's twin, each of these two
    counted by its own pages (USS: the rest is its parent's, shared); CPU and wake-ups
    count the agent and its helpers."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        proc = start(cmd, out, "sleep", str(seconds + 5), restarts=restarts)
        first_start(out, 0, proc)
        time.sleep(1.0)  # settle after the start (the zygote and its spares are up)
        agent = psutil.Process(proc.pid)
        found = zygotes(agent)
        guarding = guardians(agent)
        twins = [p for p in guarding if p.ppid() in {q.pid for q in guarding}]
        own_pages_only = [spare for zygote in found for spare in spares(zygote)] + twins
        primaries = [p for p in guarding if p not in twins]
        watched = [agent, *primaries, *found, *own_pages_only]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in watched)
        sw0 = sum(task_stats(p)[0] for p in watched)
        time.sleep(seconds)
        cpu1 = sum(sum(p.cpu_times()[:2]) for p in watched)
        own = sum(p.memory_full_info().uss for p in own_pages_only)
        stats = [task_stats(p) for p in watched]
        proc.terminate()
        finish(proc)
        sw1 = sum(switches for switches, _ in stats)
        helpers = sum(hwm for _, hwm in stats[1 : len(stats) - len(own_pages_only)]) + own
        return stats[0][1] / 2**20, helpers / 2**20, cpu1 - cpu0, (sw1 - sw0) / seconds


def interpreter_start() -> float:
    """Seconds for this Python to start and exit: the floor of any launch or restart."""
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def summary(values: list[float], unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"median {statistics.median(v):8.1f} {unit}  min {min(v):8.1f}  max {max(v):8.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=10.0, help="idle window, seconds")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the figures the docs quote to docs/figures.json",
    )
    args = parser.parse_args()
    commands = launcher_commands()
    if "torchrun" not in commands:
        print("torch is not installed: measuring agentd alone (pip install torch==2.13.0)")
    floor = interpreter_start()
    print(
        f"{NPROC} workers, {args.runs} runs each, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}; one bare interpreter start takes "
        f"{floor * 1000:.1f} ms (a launch needs two in a row, a restart one)"
    )

    results: dict[str, dict[str, list[float]]] = {
        n: {"launch": [], "restart": []} for n in commands
    }
    for cmd in commands.values():  # warm-up, not counted: byte-code caches, page cache
        measure_launch(cmd)
    for _ in range(args.runs):  # interleave launchers so drift hits both alike
        for name, cmd in commands.items():
            results[name]["launch"].append(measure_launch(cmd))
            results[name]["restart"].append(measure_restart(cmd))
    idle = {name: measure_idle(cmd, args.idle) for name, cmd in commands.items()}
    idle["agentd -r 3"] = measure_idle(commands["agentd"], args.idle, restarts=3)

    for figure, title in (
        ("launch", "launch -> first worker running"),
        ("restart", "worker crash -> next attempt's first worker running"),
    ):
        print(f"\n{title}")
        for name in commands:
            print(f"  {name:14s} {summary(results[name][figure], 'ms', 1000)}")
        if "torchrun" in commands:
            for name in (n for n in commands if n != "torchrun"):
                ratio = statistics.median(results["torchrun"][figure]) / statistics.median(
                    results[name][figure]
                )
                paired = [
                    t / a
                    for t, a in zip(results["torchrun"][figure], results[name][figure], strict=True)
                ]
                print(
                    f"  ratio torchrun/{name} = {ratio:.1f}x "
                    f"(run by run {min(paired):.1f}-{max(paired):.1f}x)"
                )
    print(
        f"\nidle agent, {NPROC} workers sleeping, {args.idle:g}s window (agentd: the agent "
        "and the helper processes it starts, the guardian and any zygote with its spares, "
        "these by their own pages; CPU and wake-ups of all)"
    )
    for name in idle:
        rss, helpers, cpu, wakeups = idle[name]
        print(
            f"  {name:14s} peak RSS {rss + helpers:6.1f} MiB (agent {rss:5.1f}, helpers "
            f"{helpers:4.1f})  CPU {cpu * 1000:6.1f} ms  wake-ups {wakeups:5.1f}/s"
        )
    if "torchrun" in commands:
        total = {name: idle[name][0] + idle[name][1] for name in ("torchrun", "agentd")}
        print(f"  ratio     RSS torchrun/agentd = {total['torchrun'] / total['agentd']:.1f}x")
    if args.record:
        from figures import record

        command = f".venv/bin/python bench/bench_agent.py --runs {args.runs} --record"
        launch = {n: statistics.median(results[n]["launch"]) for n in commands}
        record("launch", f"{launch['agentd'] * 1000:.0f} ms", command)
        record(
            "idle_rss",
            f"{sum(idle['agentd'][:2]):.0f} MiB",
            command,
            "the agent and the helper processes it starts (the guardian; --max-restarts 0)",
        )
        record(
            "idle_rss_restartable",
            f"{sum(idle['agentd -r 3'][:2]):.0f} MiB",
            command,
            "the same with --max-restarts 3: the zygote of the restarts and its 4 spares "
            "(these by their own pages) too",
        )
        restart = results["agentd"]["restart"]
        record(
            "restart",
            f"{statistics.median(restart) * 1000:.0f} ms",
            command,
            f"median of {args.runs} ({min(restart) * 1000:.0f}-{max(restart) * 1000:.0f} ms); "
            f"a worker of 4 crashes -> the next attempt's first worker runs (--standalone)",
        )
        if "torchrun" in commands:
            ratios = [t / a for t, a in zip(results["torchrun"]["restart"], restart, strict=True)]
            record(
                "restart_ratio",
                f"{min(ratios):.1f}-{max(ratios):.1f}x",
                command,
                "torchrun's restart over agentd's, run by run (interleaved, the same run)",
            )
            record("launch_torchrun", f"{launch['torchrun']:.1f} s", command)
            record("idle_rss_torchrun", f"{idle['torchrun'][0]:.0f} MiB", command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
