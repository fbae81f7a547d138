"""A rank hangs: how soon is it found, named and dumped, and the job training again?

    python bench/bench_hang.py [--step 1] [--hang-at 12] [--collective-timeout 30]
                               [--skip-cost] [--launchers agentd,torchrun]

**Hang.** Four gloo DDP workers (``hang_worker.py``) take steps of about ``--step``
seconds and heartbeat once per step, with no timeout configured. At step ``--hang-at``
of the first attempt rank 1 sleeps inside its step; the other three wait for it in DDP's
gradient all_reduce. Under agentd the figures are: the time from the hang to its
detection, over the learned step interval (the target is at most 3x); whether rank 1 was
named; how many ranks' stacks were written; the time until every rank trains again after
the restart. torchrun runs the same job in the same run: it only learns of the hang when
the collective times out (``--collective-timeout``; torch's default is 30 minutes).

**Cost.** Four workers call ``heartbeat()`` 1,000 times a second each for ``--seconds``
(``beat_worker.py``): the agent's CPU use with heartbeats, without (the same workers not
calling it) and torchrun's with the same workers; and the CPU cost of one ``heartbeat()``
call (ns) and of one ``section()`` entered and left (µs), measured inside the workers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from report_files import reports

BENCH = Path(__file__).parent
HANG_WORKER = str(BENCH / "hang_worker.py")
BEAT_WORKER = str(BENCH / "beat_worker.py")


def launcher_argv(launcher: str, log_dir: Path) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--log-dir",
        str(log_dir),
        "--event-log",
        str(log_dir / "events.jsonl"),
    ]


def read_float(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def hang_once(launcher: str, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        out, logs = Path(tmp) / "out", Path(tmp) / "logs"
        out.mkdir()
        logs.mkdir()
        argv = [
            *launcher_argv(launcher, logs),
            "--nproc-per-node",
            "4",
            "--max-restarts",
            "1",
            HANG_WORKER,
            str(out),
            "--step",
            str(args.step),
            "--hang-at",
            str(args.hang_at),
            "--collective-timeout",
            str(args.collective_timeout),
        ]
        limit = args.hang_at * args.step + args.collective_timeout + 180
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        hang_at = read_float(out / "hang_at")
        resumed = [t for r in range(4) if (t := read_float(out / f"resumed_{r}")) is not None]
        found: dict[str, object] = {"exit": done.returncode, "hang_at": hang_at}
        if hang_at is not None and len(resumed) == 4:
            found["training_again"] = max(resumed) - hang_at
        if launcher == "torchrun":
            failed = [t for r in range(4) if (t := read_float(out / f"failed_at_{r}"))]
            if hang_at is not None and failed:
                found["detected"] = min(failed) - hang_at
            if done.returncode != 0:
                errors = [ln for ln in done.stderr.splitlines() if "RuntimeError" in ln]
                found["last_error"] = errors[-1][-160:] if errors else "?"
            return found
        events = [json.loads(line) for line in (logs / "events.jsonl").read_text().splitlines()]
        hangs = [e["metadata"] for e in events if e["name"] == "hang"]
        if hangs and hang_at is not None:
            hang = hangs[0]
            found.update(
                detected=hang["detected_at"] - hang_at,
                named=hang["rank"],
                interval=hang["learned_interval"],
                timeout=hang["timeout"],
                source=hang["timeout_source"],
            )
            found["stacks"] = sum(
                "most recent call first" in Path(r["stack"]["file"]).read_text()
                for r in hang["ranks"]
                if r["stack"]
            )
            found["waiting_in"] = sorted(
                {
                    r["stack"]["waiting_in"] or "-"
                    for r in hang["ranks"]
                    if r["rank"] != hang["rank"] and r["stack"]
                }
            )
        return found


def cost_once(launcher: str, args: argparse.Namespace, beats: bool) -> dict[str, float]:
    """The agent's CPU seconds per second of the run's middle, and the workers' costs."""
    with tempfile.TemporaryDirectory(prefix="bench-beat-") as tmp:
        out, logs = Path(tmp) / "out", Path(tmp) / "logs"
        out.mkdir()
        logs.mkdir()
        argv = [
            *launcher_argv(launcher, logs),
            "--nproc-per-node",
            "4",
            BEAT_WORKER,
            str(out),
            "--rate",
            "1000",
            "--seconds",
            str(args.seconds),
        ]
        if not beats:
            argv.append("--no-beats")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        agent = psutil.Process(proc.pid)
        window = max(1.0, args.seconds - 4.0)
        time.sleep(3.0)  # started: workers import and begin
        before = sum(agent.cpu_times()[:2])
        time.sleep(window)
        used = sum(agent.cpu_times()[:2]) - before
        proc.wait(timeout=args.seconds + 120)
        costs = [json.loads(p.read_text()) for p in reports(out, "cost_*.json")]
        return {
            "agent_cpu": used / window,
            "beats_per_s": sum(c["beats"] for c in costs) / args.seconds,
            "heartbeat_ns": statistics.median(c["heartbeat_ns"] for c in costs),
            "section_us": statistics.median(c["section_us"] for c in costs),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step", type=float, default=1.0)
    parser.add_argument("--hang-at", type=int, default=12)
    parser.add_argument("--collective-timeout", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="of the cost runs")
    parser.add_argument("--launchers", default="agentd,torchrun")
    parser.add_argument("--skip-cost", action="store_true")
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    if importlib.util.find_spec("torch") is None:
        sys.exit("bench_hang needs torch (pip install torch==2.13.0)")
    print(
        f"Hang: 4 gloo DDP workers, steps of {args.step:g}s, rank 1 hangs at step "
        f"{args.hang_at}; collective timeout {args.collective_timeout:g}s"
    )
    results = {launcher: hang_once(launcher, args) for launcher in launchers}
    for launcher, found in results.items():
        print(
            f"  {launcher}: "
            + ", ".join(f"{k}={_fmt(v)}" for k, v in found.items() if k != "hang_at")
        )
    agentd, torchrun = results.get("agentd", {}), results.get("torchrun", {})
    if isinstance(agentd.get("detected"), float) and isinstance(agentd.get("interval"), float):
        ratio = agentd["detected"] / agentd["interval"]
        print(
            f"  agentd detected the hang in {agentd['detected']:.2f}s = {ratio:.2f}x the "
            f"learned step interval {agentd['interval']:.2f}s (target <= 3x)"
        )
    if isinstance(torchrun.get("detected"), float):
        print(
            f"  torchrun learned of it when the collective timed out, "
            f"{torchrun['detected']:.1f}s after the hang"
        )
    if isinstance(agentd.get("training_again"), float) and isinstance(
        torchrun.get("training_again"), float
    ):
        print(
            f"  training again after the hang: agentd {agentd['training_again']:.1f}s, "
            f"torchrun {torchrun['training_again']:.1f}s "
            f"({torchrun['training_again'] / agentd['training_again']:.1f}x longer)"
        )
    if args.skip_cost:
        return
    print(f"Cost: 4 workers x 1000 heartbeat() calls/s for {args.seconds:g}s")
    rows = [("agentd, heartbeats", "agentd", True), ("agentd, no heartbeats", "agentd", False)]
    if "torchrun" in launchers:
        rows.append(("torchrun, same workers", "torchrun", True))
    for label, launcher, beats in rows:
        cost = cost_once(launcher, args, beats)
        print(
            f"  {label}: agent CPU {cost['agent_cpu'] * 100:.2f}% of a core, "
            f"{cost['beats_per_s']:.0f} beats/s; heartbeat() {cost['heartbeat_ns']:.0f} ns, "
            f"section() {cost['section_us']:.2f} us"
        )


def _fmt(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
