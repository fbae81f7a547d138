"""A crash-looping job, left to run: does anything of the launcher's grow per restart?

    python bench/bench_soak.py [--restarts 1000] [--torch-restarts 100]

Two workers that exit 1 at once, restarted ``--restarts`` times with an event log. While
it runs, the launcher's RSS and open descriptors are sampled by restart count; at the
end, its log dir (bytes and files) and event log are measured. torchrun runs the same job
(``--torch-restarts`` times: its restarts are slower) where torch is installed. The
target: RSS and descriptors flat (within 1 MiB) from restart 100 on, the log dir and the
event log bounded.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

CRASH = ["--no-python", "sh", "-c", "echo boom >&2; exit 1"]


def launchers() -> dict[str, list[str]]:
    found = {"agentd": [sys.executable, "-m", "agentd", "run", "--event-log", "{events}"]}
    if importlib.util.find_spec("torch") is not None:
        found["torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    return found


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files and directories) under ``path``."""
    entries = list(path.rglob("*"))
    return sum(p.stat().st_size for p in entries if p.is_file()), len(entries)


def soak(cmd: list[str], restarts: int, tmp: Path) -> dict[str, object]:
    events = tmp / "events.jsonl"
    argv = [part.replace("{events}", str(events)) for part in cmd]
    argv += [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        "--log-dir",
        str(tmp / "logs"),
        "--redirects",
        "3",
        *CRASH,
    ]
    err = tmp / "stderr"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    began = time.monotonic()
    with open(err, "wb") as fp:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=fp, stdin=subprocess.DEVNULL, env=env
        )
    agent = psutil.Process(proc.pid)
    samples: dict[int, tuple[float, int]] = {}
    step = max(1, restarts // 10)
    agentd_line = re.compile(rb"\(restart (\d+) of")  # agentd: "(restart 12 of 1000)"
    while proc.poll() is None:
        try:
            rss, fds = agent.memory_info().rss, agent.num_fds()
        except psutil.Error:
            break
        log = err.read_bytes()
        counts = [int(n) for n in agentd_line.findall(log[-4096:])]
        if b"failed (exitcode" in log:  # torchrun logs one such line per attempt
            counts.append(log.count(b"failed (exitcode") - 1)
        if counts:
            samples.setdefault(max(counts) // step * step, (rss / 2**20, fds))
        time.sleep(0.02)
    proc.wait()
    logs, files = tree_size(tmp / "logs")
    return {
        "seconds": time.monotonic() - began,
        "samples": samples,
        "log_bytes": logs,
        "log_files": files,
        "event_bytes": sum(p.stat().st_size for p in tmp.glob("events.jsonl*")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=1000)
    parser.add_argument("--torch-restarts", type=int, default=100)
    args = parser.parse_args()
    for name, cmd in launchers().items():
        restarts = args.restarts if name == "agentd" else args.torch_restarts
        with tempfile.TemporaryDirectory() as tmp:
            found = soak(cmd, restarts, Path(tmp))
        samples: dict[int, tuple[float, int]] = found["samples"]  # type: ignore[assignment]
        print(
            f"{name}: {restarts} restarts in {found['seconds']:.1f}s; log dir "
            f"{found['log_bytes'] / 2**10:.0f} KiB in {found['log_files']} entries; "
            f"event log {found['event_bytes'] / 2**10:.0f} KiB"
        )
        for count, (rss, fds) in sorted(samples.items()):
            print(f"  restart {count:>5}: RSS {rss:6.1f} MiB, {fds:3d} fds")
        warm = restarts // 10  # after the first tenth: caches and histories are full
        steady = [sample for count, sample in sorted(samples.items()) if count >= warm]
        if len(steady) >= 2:
            grown = steady[-1][0] - steady[0][0]
            per_100 = grown / max(1, max(samples) - warm) * 100
            fds = [sample[1] for sample in steady]
            print(
                f"  from restart {warm} on: RSS {grown:+.2f} MiB ({per_100:+.3f} MiB per 100 "
                f"restarts); open descriptors between {min(fds)} and {max(fds)}"
            )


if __name__ == "__main__":
    main()
