"""The README's quick start, run again and again beside busy cores: how many of its jobs end
in exit 0 with the learned weights, under agentd and under torchrun.

    python bench/bench_quickstart.py [--runs 40] [--hogs 1] [--launchers agentd,torchrun]
                                     [--without-teardown]

Each run is ``--standalone --nproc-per-node 2 examples/train.py`` while HOGS busy loops
load the cores. ``--without-teardown`` runs a copy of the example without its last lines
(``del model, optimizer`` and ``gc.collect()`` before ``destroy_process_group()``): so
written, the quick start failed 7 times in 42 under one hog with torch 2.13, under both
launchers, after training had succeeded: gloo aborted the worker (SIGABRT, "terminate
called without an active exception") at interpreter exit.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_files import write_report
from run_control import end_run, tally

EXAMPLE = Path(__file__).parents[1] / "examples" / "train.py"
TEARDOWN = ("    del model, optimizer\n", "    gc.collect()  # the model's reference cycles too\n")
LAUNCHERS = {
    "agentd": [sys.executable, "-m", "agentd", "run"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
MARK = "BENCH_AGENTD_QUICKSTART"


def without_teardown(folder: Path) -> Path:
    """A copy of the example without the lines that free DDP before the process group."""
    text = EXAMPLE.read_text()
    for line in TEARDOWN:
        if line not in text:
            sys.exit(f"--without-teardown: {EXAMPLE} no longer has the line {line.strip()!r}")
        text = text.replace(line, "")
    copy = folder / "train_without_teardown.py"
    write_report(copy, text)
    return copy


def run_job(launcher: list[str], script: Path, run: int, timeout: float) -> tuple[bool, float, str]:
    """(exit 0 with the learned weights, wall seconds, else the lines that say why)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", MARK: str(run)}
    began = time.monotonic()
    proc = subprocess.Popen(
        [*launcher, "--standalone", "--nproc-per-node", "2", str(script)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_run([proc], MARK, str(run))
        out = proc.communicate()[0] + f"\n(killed after {timeout:g} s)"
    wall = time.monotonic() - began
    ok = proc.returncode == 0 and "learned weight [2.0, -3.0]" in out
    if ok:
        return True, wall, ""
    lines = out.strip().splitlines()
    cause = [ln for ln in lines if "SIGABRT" in ln or "terminate called" in ln][:3] or lines[-4:]
    return False, wall, f"exit {proc.returncode}:\n" + "\n".join(cause)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--hogs", type=int, default=1, help="busy-loop processes beside the jobs")
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    parser.add_argument(
        "--without-teardown",
        action="store_true",
        help="the example without freeing DDP before the group",
    )
    args = parser.parse_args()
    if args.runs < 1:
        sys.exit(f"--runs: {args.runs} must be >= 1")
    if args.hogs < 0:
        sys.exit(f"--hogs: {args.hogs} must be >= 0")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("bench_quickstart needs torch (pip install torch==2.13.0)")
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    unknown = set(launchers) - set(LAUNCHERS)
    if unknown:
        sys.exit(f"--launchers: unknown {sorted(unknown)}, expected some of {sorted(LAUNCHERS)}")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-quickstart-") as tmp:
            script = without_teardown(Path(tmp)) if args.without_teardown else EXAMPLE
            print(
                f"{args.runs} quick starts ({script.name}) per launcher, {args.hogs} busy "
                f"loop(s) beside them"
            )
            print(f"{'launcher':<14} {'succeeded':>10} {'median s':>9}")
            for name in launchers:
                job = functools.partial(run_job, LAUNCHERS[name], script, timeout=args.timeout)
                tally(name, args.runs, job)
    finally:
        end_run(hogs)


if __name__ == "__main__":
    main()
