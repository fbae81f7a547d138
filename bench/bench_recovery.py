"""A real job's start and recovery: launch -> every worker past its first all-reduce (time
to first step), and crash -> every worker of the next attempt past its all-reduce.

    python bench/bench_recovery.py [--runs 5] [--nproc 4] [--model-mb 0] [--device cpu]
        [--launchers agentd-inprocess,agentd,agentd-spawn,torchrun]
        [--library lightning|transformers]

Each run starts one launcher with NPROC gloo workers (``recovery_worker.py``: they import
torch, join the process group and all-reduce); the first figure is the time from the
launcher's start to the last worker past that all-reduce. Rank 0 then crashes, and the
second figure is the time from its crash to the last worker of the next attempt past its
all-reduce. ``agentd`` is ``agentd run`` with no flags (``--preload auto``: the script
imports torch, so a zygote preloads it and forks the workers); ``agentd-spawn`` spawns
each worker (``--no-preload``); ``agentd-preload`` names the preload (``--preload
torch``). ``agentd-inprocess`` does too, and its workers restart in process
(``recovery_inprocess_worker.py``): the survivors keep their process, and rank 0, which
crashes once the standby worker of its slot is there, is replaced by that standby;
``agentd-inprocess-cold`` keeps no standbys (``--standby-workers 0``: the new rank 0 is
forked after the crash) and ``agentd-inprocess-cuda`` keeps standbys whose CUDA is ready
(``--standby-cuda``: rank 0 waits until its standby's is) and hands the state over through
the process group (``AGENTD_SYNC_ROUTE=group``); ``agentd-inprocess-shm`` hands the
survivors' state to the new rank through shared memory rather than the process group
(``AGENTD_SYNC_ROUTE=shared-memory``: with the model on the GPU all ranks share, CUDA
IPC), and ``agentd-inprocess-cuda-ipc`` maps the model from a survivor's GPU memory into a
standby whose CUDA is ready (``--standby-cuda`` alone: its route is ``cuda-ipc`` unless
the environment names one); the route the state took is printed with the new rank's
phases. Each run also checks that the survivors' pids and model checksums did not change
and that the new rank's checksum matches theirs. The launchers take turns, run by run (a
slow spell of the machine hits them all), and each launcher's output goes to a file: a run
that does not recover within the timeout, or whose checks fail, is counted as failed and
printed with its cause (the exit, the ranks that never got past the next all-reduce, the
launcher's last lines).
Prints median/min/max per launcher and the
ratios. ``--model-mb N`` gives every worker a model of N MiB: the
workers started anew read rank 0's checkpoint of it back; the in-process survivors keep
theirs and hand it to the new rank. ``--device cuda`` puts the model on the GPU (the
collectives stay gloo: on one GPU, NCCL allows one rank); the in-process checks then also
want the survivors' CUDA memory unchanged. ``--library lightning`` runs the same job from
a script that imports Lightning first, ``--library transformers`` from one that takes
Hugging Face's ``Trainer`` after torch (``recovery_<library>_worker.py``; not with the
in-process launchers): ``agentd`` then preloads that library too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_control import kill_marked

WORKER = str(Path(__file__).with_name("recovery_worker.py"))
MARK_ENV = "BENCH_RECOVERY_RUN"
INPROCESS_WORKER = str(Path(__file__).with_name("recovery_inprocess_worker.py"))
LIBRARY_WORKERS = {
    library: str(Path(__file__).with_name(f"recovery_{library}_worker.py"))
    for library in ("lightning", "transformers")
}
"""The job's script for ``--library``: it imports that library as its users' scripts do."""
COMMANDS = {
    "agentd-inprocess-cuda-ipc": [
        *(sys.executable, "-m", "agentd", "run", "--preload", "torch", "--standby-cuda")
    ],
    "agentd-inprocess": [sys.executable, "-m", "agentd", "run", "--preload", "torch"],
    "agentd-inprocess-cuda": [
        *(sys.executable, "-m", "agentd", "run", "--preload", "torch", "--standby-cuda")
    ],
    "agentd-inprocess-cold": [
        *(sys.executable, "-m", "agentd", "run", "--preload", "torch", "--standby-workers", "0")
    ],
    "agentd-inprocess-shm": [sys.executable, "-m", "agentd", "run", "--preload", "torch"],
    "agentd-preload": [sys.executable, "-m", "agentd", "run", "--preload", "torch"],
    "agentd": [sys.executable, "-m", "agentd", "run"],
    "agentd-spawn": [sys.executable, "-m", "agentd", "run", "--no-preload"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
ORDER = list(COMMANDS)
"""Fastest first, for the ratios (the standbys' launchers, then the forked and spawned)."""
FIRST_STEPS: dict[str, list[float]] = {}
"""Each launcher's times to first step, of the runs that recovered or not."""


def run_once(
    name: str,
    nproc: int,
    timeout: float,
    model_mb: float,
    device: str = "cpu",
    library: str | None = None,
) -> float | str:
    """Seconds from the crash to the last worker of attempt 1 past its all-reduce, or why
    the job did not recover (the launcher's exit and the last lines it wrote). The time
    to first step goes to :data:`FIRST_STEPS`."""
    inprocess = name.startswith("agentd-inprocess")
    worker = INPROCESS_WORKER if inprocess else LIBRARY_WORKERS.get(library or "", WORKER)
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        argv = [
            *COMMANDS[name],
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            "1",
            worker,
            tmp,
        ]
        marker = os.urandom(6).hex()
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", MARK_ENV: marker}
        if model_mb:
            env["BENCH_MODEL_MB"] = str(model_mb)
        env["BENCH_DEVICE"] = device
        env["BENCH_STANDBY_WAIT"] = STANDBY_WAIT.get(name, "")
        env.update(LAUNCHER_ENV.get(name, {}))
        log = Path(tmp) / "launcher.log"
        with open(log, "wb") as output:
            launched = time.time()
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env
            )
            try:
                code: int | None = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            finally:
                kill_marked(MARK_ENV, marker)
        out = Path(tmp)
        first = [out / f"past_0_{rank}" for rank in range(nproc)]
        if all(p.exists() for p in first):
            first_step = max(float(p.read_text()) for p in first) - launched
            FIRST_STEPS.setdefault(name, []).append(first_step)
        past = [out / f"past_1_{rank}" for rank in range(nproc)]
        if code != 0 or not (out / "crash").exists() or not all(p.exists() for p in past):
            exit_text = f"no exit within {timeout:g}s" if code is None else f"exit {code}"
            missing = [p.name for p in past if not p.exists()]
            return f"{exit_text}; not past the next all-reduce: {missing}; {cause(log)}"
        if inprocess and not kept_in_process(out, nproc):
            return "the in-process checks failed (printed above)"
        crash = float((out / "crash").read_text())
        if inprocess:  # where the new rank's time went, and the route its state took
            phases = json.loads((out / "phases_1_0").read_text())
            for phase, at in phases.items():
                PHASES.setdefault(name, {}).setdefault(phase, []).append(at - crash)
            route = (out / "route_1_0").read_text() if (out / "route_1_0").exists() else "none"
            ROUTES.setdefault(name, []).append(route)
        return max(float(p.read_text()) for p in past) - crash


def cause(log: Path) -> str:
    """What the launcher said went wrong: its last error lines, else its last lines."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    errors = [line for line in lines if "Error" in line or "exitcode" in line]
    return f"it said: {errors[-2:]}" if errors else f"its last lines: {lines[-3:]}"


PHASES: dict[str, dict[str, list[float]]] = {}
"""In-process runs: seconds from the crash to each phase of the new rank 0, by launcher."""
ROUTES: dict[str, list[str]] = {}
"""In-process runs: the route the state took to the new rank 0 (``inprocess.last_sync()``)."""
LAUNCHER_ENV = {
    "agentd-inprocess-shm": {"AGENTD_SYNC_ROUTE": "shared-memory"},
    "agentd-inprocess-cuda": {"AGENTD_SYNC_ROUTE": "group"},
}
"""What a launcher's workers have in their environment besides."""
STANDBY_WAIT = {
    "agentd-inprocess": "1",
    "agentd-inprocess-cuda": "cuda",
    "agentd-inprocess-shm": "1",
    "agentd-inprocess-cuda-ipc": "cuda",
}
"""What rank 0 waits for before it crashes (``recovery_inprocess_worker.py``): the
standby of its slot, with its CUDA ready for ``-cuda``; ``-cold`` keeps none."""


GPU_FIGURES = {
    "agentd-inprocess-cuda-ipc": "gpu_inprocess_standby_ipc",
    "agentd-inprocess-cuda": "gpu_inprocess_standby_cuda",
    "agentd-inprocess": "gpu_inprocess_standby",
    "agentd-inprocess-cold": "gpu_inprocess_cold",
    "agentd": "gpu_default_recovery",
    "agentd-spawn": "gpu_spawn_recovery",
}
"""The figure each launcher's recovery is recorded as with ``--device cuda --record``."""


def gpu_figures(
    medians: dict[str, float], times: dict[str, list[float]], runs: int, model_mb: float
) -> list[tuple[str, str, str]]:
    """(figure, text, note) for each launcher of :data:`GPU_FIGURES` that recovered: the
    median, and in the note the spread, the runs recovered, the model and the route."""
    found = []
    for name, figure in GPU_FIGURES.items():
        if name not in medians:
            continue
        ms = [t * 1000 for t in times[name]]
        note = (
            f"{name}: crash -> all ranks past the next all-reduce, median of {len(ms)} "
            f"({min(ms):,.0f}-{max(ms):,.0f} ms), {len(ms)}/{runs} recovered, "
            f"a {model_mb:g} MiB model on the GPU, gloo"
        )
        if name in ROUTES:
            taken = ROUTES[name]
            note += "; the state by " + ", ".join(
                f"{r} {taken.count(r)}/{len(taken)}" for r in sorted(set(taken))
            )
        found.append((figure, f"{medians[name] * 1000:,.0f} ms", note))
    return found


def record_gpu_figures(
    args: argparse.Namespace, medians: dict[str, float], times: dict[str, list[float]], gpu: str
) -> None:
    """Write :func:`gpu_figures` to docs/figures.json, ``gpu`` (its name, torch's
    version) named as the device."""
    from figures import record

    command = (
        f"bash bench/gpu_check.sh (bench/bench_recovery.py --device {args.device} --model-mb "
        f"{args.model_mb:g} --runs {args.runs} --launchers {args.launchers} --record)"
    )
    for figure, text, note in gpu_figures(medians, times, args.runs, args.model_mb):
        record(figure, text, command, note, device=gpu)


def kept_in_process(out: Path, nproc: int) -> bool:
    """Ranks 1.. kept their pid and checksum; the new rank 0 has theirs (printed if not)."""
    before = [json.loads((out / f"state_0_{r}").read_text()) for r in range(nproc)]
    after = [json.loads((out / f"state_1_{r}").read_text()) for r in range(nproc)]
    survivors_kept = all(before[r] == after[r] for r in range(1, nproc))
    new_matches = after[0]["pid"] != before[0]["pid"] and all(
        abs(after[0]["checksum"] - a["checksum"]) < 1e-9 for a in after[1:]
    )
    if not (survivors_kept and new_matches):
        print(f"    in-process checks failed: before {before}, after {after}", flush=True)
    return survivors_kept and new_matches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--launchers", default="agentd-inprocess,agentd,agentd-spawn,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--give-up-after",
        type=int,
        default=0,
        metavar="N",
        help="run a launcher no more after N runs that did not recover (0: run them all)",
    )
    parser.add_argument("--model-mb", type=float, default=0.0)
    parser.add_argument("--device", default="cpu", help="where the model lives: cpu or cuda")
    parser.add_argument(
        "--library",
        choices=sorted(LIBRARY_WORKERS),
        help="the job's script imports this library as its users' do (not with the "
        "in-process launchers)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write the figures the docs quote to docs/figures.json (with --device cuda: "
        "the gpu_* figures of GPU_FIGURES, the GPU named)",
    )
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        sys.exit("bench_recovery needs torch (pip install torch==2.13.0)")
    if args.library and importlib.util.find_spec(args.library) is None:
        sys.exit(f"bench_recovery --library {args.library}: not installed (pip install it)")
    if args.library and ("inprocess" in args.launchers or args.record):
        sys.exit("bench_recovery --library: not with the in-process launchers or --record")
    model = f", a {args.model_mb:g} MiB model" if args.model_mb else ""
    model += f", a script that imports {args.library}" if args.library else ""
    gpu = ""  # the GPU's name and torch's version, where the model is on one
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            sys.exit(f"bench_recovery --device {args.device} needs a CUDA GPU")
        gpu = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
        model += f" on {gpu}"
    print(
        f"launch -> all {args.nproc} workers past their first all-reduce (time to first "
        f"step), and crash -> all {args.nproc} workers of the next attempt past their "
        f"all-reduce (gloo{model}, {args.runs} runs, {os.cpu_count()} CPUs)"
    )
    medians: dict[str, float] = {}
    names = args.launchers.split(",")
    unknown = set(names) - set(COMMANDS)
    if unknown:
        sys.exit(f"--launchers: unknown {sorted(unknown)}; known: {', '.join(COMMANDS)}")
    times: dict[str, list[float]] = {name: [] for name in names}
    failed: dict[str, int] = {name: 0 for name in names}
    for run in range(args.runs):  # interleaved: a slow spell of the machine hits them all
        for name in names:
            if args.give_up_after and failed[name] >= args.give_up_after:
                continue
            took = run_once(
                name, args.nproc, args.timeout, args.model_mb, args.device, args.library
            )
            if isinstance(took, str):
                print(f"  {name}: run {run + 1} did not recover: {took}", flush=True)
                failed[name] += 1
                if failed[name] == args.give_up_after:
                    print(f"  {name}: given up after {failed[name]} failed runs", flush=True)
            else:
                times[name].append(took)
    firsts = {name: statistics.median(FIRST_STEPS[name]) for name in names if name in FIRST_STEPS}
    print("time to first step:")
    for name in names:
        if name in firsts:
            t = FIRST_STEPS[name]
            print(
                f"  {name:<25} first step  median {firsts[name] * 1000:7.0f} ms  "
                f"min {min(t) * 1000:7.0f}  max {max(t) * 1000:7.0f}",
                flush=True,
            )
    if "torchrun" in firsts:
        for name in names:
            if name in firsts and name != "torchrun":
                print(
                    f"  first-step ratio torchrun/{name} = {firsts['torchrun'] / firsts[name]:.1f}x"
                )
    print("crash -> recovered:")
    for name in names:
        ok = times[name]
        line = f"  {name:<25} recovered {len(ok)}/{args.runs}"
        if ok:
            medians[name] = statistics.median(ok)
            line += (
                f"  median {medians[name] * 1000:7.0f} ms  min {min(ok) * 1000:7.0f}"
                f"  max {max(ok) * 1000:7.0f}"
            )
        print(line, flush=True)
        if name in PHASES:
            steps = ", ".join(
                f"{phase} {statistics.median(t) * 1000:.0f}" for phase, t in PHASES[name].items()
            )
            print(f"    {name}: the new rank, ms after the crash (medians): {steps}", flush=True)
        if name in ROUTES:
            taken = ROUTES[name]
            counts = ", ".join(f"{r} {taken.count(r)}/{len(ok)}" for r in sorted(set(taken)))
            print(f"    {name}: the new rank's state came by: {counts}", flush=True)
    if args.record and args.device != "cpu":
        record_gpu_figures(args, medians, times, gpu)
    if args.record and args.device == "cpu" and not args.model_mb:
        from figures import record

        command = f".venv/bin/python bench/bench_recovery.py --runs {args.runs} --record"
        for name, figure in (
            ("agentd-inprocess", "inprocess_recovery"),
            ("agentd-inprocess-cold", "inprocess_recovery_cold"),
            ("agentd-preload", "preload_recovery"),
            ("agentd", "default_recovery"),
        ):
            if name in medians:
                record(figure, f"{medians[name] * 1000:.0f} ms", command)
        if "agentd" in firsts:
            record("default_first_step", f"{firsts['agentd']:.2f} s", command)
            if "torchrun" in firsts:
                ratio = firsts["torchrun"] / firsts["agentd"]
                record("default_first_step_ratio", f"{ratio:.1f}x", command)
    for i, faster in enumerate(ORDER):
        for slower in ORDER[i + 1 :]:
            if faster in medians and slower in medians:
                print(f"  ratio {slower}/{faster} = {medians[slower] / medians[faster]:.1f}x")


if __name__ == "__main__":
    main()
