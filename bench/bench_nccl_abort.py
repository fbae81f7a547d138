"""NCCL's abort, timed alone, and what a restart that does not wait for it gains.

    python bench/bench_nccl_abort.py [--rounds 4] [--env NAME=VALUE,...]... [--record]

One process, one rank, one GPU, each case in a new process (NCCL reads its variables at
start): the group is made (eager: ``device_id``), all-reduces once, and is torn down by

- ``abort``: torch's ``_abort_process_group`` (what ``AGENTD_INPROCESS_NCCL_ABORT=wait``
  makes a park do);
- ``destroy``: ``destroy_process_group`` (NCCL's finalize, then destroy: it waits for
  peers, which is why a park never uses it);
- ``background``: agentd's park (``agentd.inprocess.teardown``): torch forgets the groups
  and a thread aborts them, while the next group is made and all-reduces; ROUNDS times.

each with NCCL's defaults, with ``NCCL_CUMEM_ENABLE=0`` and under each ``--env``
setting. It prints each case's seconds, and for ``background`` the next all-reduce's time
after the park began, the abort's own and the GPU memory used meanwhile and after.
``--record`` writes the figures (on a GPU only) to docs/figures.json. Without CUDA it
says so and exits 0."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("abort", "destroy", "background")
SETTINGS = {"NCCL's defaults": {}, "NCCL_CUMEM_ENABLE=0": {"NCCL_CUMEM_ENABLE": "0"}}


def child(case: str, rounds: int) -> None:
    """One case, in this process: one JSON line per teardown."""
    import torch
    import torch.distributed as dist

    from agentd.inprocess import teardown

    torch.cuda.set_device(0)

    def start(value: float) -> torch.Tensor:
        dist.init_process_group(
            "nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0)
        )
        tensor = torch.full((1 << 20,), value, device="cuda")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        return tensor

    def used_mib() -> int:
        free, total = torch.cuda.mem_get_info()
        return (total - free) >> 20

    start(1.0)
    if case != "background":
        began = time.perf_counter()
        if case == "abort":
            dist.distributed_c10d._abort_process_group()
        else:
            dist.destroy_process_group()
        print(json.dumps({"seconds": time.perf_counter() - began, "after_mib": used_mib()}))
        return
    os.environ["AGENTD_INPROCESS_NCCL_ABORT"] = "background"
    for n in range(rounds):
        began = time.perf_counter()
        teardown.destroy_process_groups()
        parked = time.perf_counter() - began
        tensor = start(float(n + 2))
        ready = time.perf_counter() - began
        meanwhile = used_mib()
        aborting = [t for t in threading.enumerate() if t.name == "agentd-nccl-abort"]
        for thread in aborting:
            thread.join()
        line = {
            "park": parked,
            "next_all_reduce": ready,
            "abort": time.perf_counter() - began if aborting else None,
            "value_ok": float(tensor[0]) == n + 2,
            "meanwhile_mib": meanwhile,
            "after_mib": used_mib(),
        }
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()


def ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:,.0f} ms "
        f"({min(values) * 1000:,.0f}-{max(values) * 1000:,.0f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="teardowns of each case")
    parser.add_argument("--record", action="store_true", help="write docs/figures.json")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="one more setting to time every case under (repeatable)",
    )
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for setting in args.env:
        pairs = [item.partition("=") for item in setting.split(",")]
        if not all(name and sep for name, sep, _ in pairs):
            parser.error(f"--env: {setting!r} must be NAME=VALUE[,NAME=VALUE...]")
        SETTINGS[setting] = {name: value for name, _, value in pairs}
    if args.child:
        child(args.child, args.rounds)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_nccl_abort: no CUDA GPU here: nothing to measure")
        return 0
    device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    print(f"NCCL {nccl}'s abort of one rank's group on {device}, {args.rounds} rounds a case")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    results: dict[tuple[str, str], list[dict]] = {}
    for setting, extra in SETTINGS.items():
        for case in CASES:
            runs: list[dict] = []
            for _ in range(1 if case == "background" else args.rounds):
                done = subprocess.run(
                    [sys.executable, __file__, "--child", case, "--rounds", str(args.rounds)],
                    env={**env, **extra},
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                if done.returncode != 0 or not lines:
                    print(f"  {setting}, {case}: failed (exit {done.returncode})")
                    print("    " + done.stderr.strip()[-800:].replace("\n", "\n    "))
                    break
                runs += [json.loads(ln) for ln in lines]
            results[(setting, case)] = runs
            if not runs:
                continue
            if case == "background":
                print(
                    f"  {setting}, background: park {ms([r['park'] for r in runs])}; the next "
                    f"group's all-reduce done {ms([r['next_all_reduce'] for r in runs])} after "
                    f"the park began; the abort ended {ms([r['abort'] for r in runs])} after; "
                    f"values right {sum(r['value_ok'] for r in runs)}/{len(runs)}; GPU MiB "
                    f"used meanwhile {'/'.join(str(r['meanwhile_mib']) for r in runs)}, after "
                    f"{'/'.join(str(r['after_mib']) for r in runs)}"
                )
            else:
                print(f"  {setting}, {case}: {ms([r['seconds'] for r in runs])}")
    if args.record:
        record(results, device, nccl, args.rounds)
    return 0


def record(results: dict, device: str, nccl: str, rounds: int) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from figures import record as store

    command = f"bash bench/gpu_check.sh (bench/bench_nccl_abort.py --rounds {rounds})"
    default, no_cumem = SETTINGS
    for name, key, field, what in (
        ("gpu_nccl_abort", (default, "abort"), "seconds", "torch's _abort_process_group"),
        ("gpu_nccl_abort_no_cumem", (no_cumem, "abort"), "seconds", "the abort, cuMem off"),
        ("gpu_nccl_destroy", (default, "destroy"), "seconds", "destroy_process_group"),
        (
            "gpu_nccl_next_group_while_aborting",
            (default, "background"),
            "next_all_reduce",
            "a park that aborts in the background, to the next group's first all-reduce",
        ),
    ):
        runs = results.get(key) or []
        if not runs:
            continue
        values = [r[field] for r in runs]
        note = f"one NCCL {nccl} rank, {key[0]}: {what}, {ms(values)}, {len(values)} runs"
        if key[1] == "background":
            note += (
                f"; the abort itself ended {ms([r['abort'] for r in runs])} after the park "
                f"began; GPU MiB used meanwhile {runs[0]['meanwhile_mib']}, after "
                f"{runs[0]['after_mib']}"
            )
        store(
            name,
            f"{statistics.median(values) * 1000:,.0f} ms",
            command,
            note,
            device=device,
        )


if __name__ == "__main__":
    sys.exit(main())
