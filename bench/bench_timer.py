"""Timer expiry -> worker dead: agentd vs torchrun's FileTimerServer, in the same run.

    python bench/bench_timer.py [--samples 40] [--torch-runs 8]

A worker acquires a timer due at a random phase and hangs; the benchmark watches the
worker through a pidfd and records when it dies, against the deadline. It also reports
what each launcher does next: agentd restarts the group; torch's FileTimerServer kills
its own agent (no restart) and the sibling workers are left behind.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = str(Path(__file__).with_name("timer_worker.py"))


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict | None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.002)
    return json.loads(path.read_text())  # written atomically (a rename): whole once there


def time_of_death(pid: int, timeout: float = 30) -> float | None:
    """Epoch seconds at which ``pid`` died (seen through a pidfd), None if it was gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return None
        return time.time()
    finally:
        os.close(fd)


def run_launcher(cmd: list[str], impl: str, attempts: int, env: dict[str, str]) -> dict:
    """One launcher run: ``attempts`` timer expiries (fewer if it does not restart)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        args = [
            *cmd,
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            str(attempts),
            WORKER,
            impl,
            str(out),
            str(attempts),
        ]
        log_path = out / "launcher.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        latencies, orphans = [], []
        try:
            for attempt in range(attempts):
                info = wait_file(out / f"timer_{attempt}", proc)
                if info is None:
                    break
                died = time_of_death(info["pid"])
                if died is not None:
                    latencies.append(died - info["deadline"])
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for sibling in out.glob("sibling_*"):  # left behind by a killed agent?
                pid = int(sibling.read_text())
                if os.path.exists(f"/proc/{pid}") and _state(pid) not in ("Z", None):
                    orphans.append(pid)
                    os.kill(pid, signal.SIGKILL)
        restarted = (out / "timer_1").exists() if attempts > 1 else None
        signal_late = [  # agentd logs how late after the deadline it sent each signal
            float(m) / 1000 for m in re.findall(r"\(([0-9.]+) ms late\)", log_path.read_text())
        ]
        return {
            "signal_late": signal_late,
            "latencies": latencies,
            "exit": proc.returncode,
            "orphans": orphans,
            "restarted": restarted,
        }


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def describe(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return (
        f"n={len(ms):3d}  median {statistics.median(ms):7.2f} ms  p99 {p99:7.2f} ms  "
        f"min {ms[0]:7.2f}  max {ms[-1]:7.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=40, help="agentd expiries (one run)")
    parser.add_argument("--torch-runs", type=int, default=8, help="torchrun runs (1 each)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONWARNINGS="ignore", TORCHELASTIC_ENABLE_FILE_TIMER="1")

    agentd = run_launcher([sys.executable, "-m", "agentd", "run"], "agentd", args.samples, env)
    print("timer deadline -> signal sent (agentd's own log)")
    print(f"  agentd    {describe(agentd['signal_late'])}")
    print("timer deadline -> worker dead (random phases, seen through a pidfd)")
    print(f"  agentd    {describe(agentd['latencies'])}")
    print(
        f"            after each expiry: group restarted ({len(agentd['latencies'])} "
        f"expiries in one run), agent exit code {agentd['exit']}, "
        f"orphans {len(agentd['orphans'])}"
    )
    if importlib.util.find_spec("torch") is None:
        print("  torchrun  skipped: torch is not installed (pip install torch==2.13.0)")
        return 0
    torch_latencies, exits, orphans, restarts = [], [], 0, 0
    for _ in range(args.torch_runs):
        run = run_launcher([sys.executable, "-m", "torch.distributed.run"], "torch", 2, env)
        torch_latencies += run["latencies"]
        exits.append(run["exit"])
        orphans += len(run["orphans"])
        restarts += bool(run["restarted"])
    print(f"  torchrun  {describe(torch_latencies)}")
    print(
        f"            after the expiry: restarted in {restarts}/{args.torch_runs} runs, "
        f"agent exit codes {sorted(set(exits))}, sibling workers orphaned: {orphans}"
    )
    ratio = statistics.median(torch_latencies) / statistics.median(agentd["latencies"])
    print(f"  ratio     median torchrun/agentd = {ratio:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
