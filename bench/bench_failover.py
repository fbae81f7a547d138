"""The store's host is lost mid-job: do the other nodes go on, and how fast?

    python bench/bench_failover.py [--runs 3]
        [--launchers agentd,agentd-candidates,agentd-no-standby,torchrun]
    python bench/bench_failover.py --defaults --after 0,1,3,6 [--runs 3] [--record]
    python bench/bench_failover.py --lost-earlier [--given] [--runs 3] [--record]

Each run starts three launchers on this machine as three nodes of one ``--nnodes 2:3``
job (one worker each, ``member_worker.py``: it records its start and world size, then
runs until a stop file appears), and SIGKILLs the node that serves the rendezvous store
once the job runs at world 3. The figure is the time from the kill to both survivors'
workers running again at world 2; then the stop file is made and the survivors' exit
codes are read. The launchers:

* ``agentd``: ``--rdzv-endpoint 127.0.0.1:P``, torchrun's command line: the store is in the
  first agent and the others stand by to take it over (agentd/store/standby.py);
* ``agentd-candidates``: ``--rdzv-endpoint 127.0.0.1:P,127.0.0.2:P`` (a given list);
* ``agentd-no-standby``: one endpoint with ``standby=0``: a store that dies with its agent;
* ``torchrun``: its c10d rendezvous, whose TCPStore lives in the first agent (needs torch).

All use a heartbeat TTL of 3 s (``keep_alive_interval=1,keep_alive_max_attempt=3``) and a
last call of 1 s, so the target is TTL + 2 s = 5 s.

``--defaults --after 0,1,3,6`` measures ``agentd`` with its default heartbeat (5 s, TTL
15 s) and last call (30 s) instead, killing the host that many seconds after the three
workers run: the moments right after a round, when the other agents have just stood by
as candidates (the protocol's S3, docs/protocol.md: the survivors at world 2 in <= 3 s).

``--lost-earlier`` measures ``agentd`` (TTL 3 s) in a four-node ``--nnodes 2:4`` job, each
node on a loopback address of its own, whose fourth node is frozen first (SIGSTOP: its
candidate takes connections and never answers, as on a lost host); once the other three
run at world 3, and a second more, the store's host is SIGKILLed: the figure is the time
to both survivors at world 2. A search that waited out the silent candidate's 2 s probe
timeout would add those 2 s (docs/protocol.md, the silent candidates named). With
``--given``, the four are given as a list (``--rdzv-endpoint 127.0.0.1:P,...,127.0.0.4:P``)
instead of the one endpoint that grows into one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report_files import reports as finished_reports
from run_control import end_run, wait_for

WORKER = str(Path(__file__).with_name("member_worker.py"))
MARK_ENV = "BENCH_FAILOVER_RUN"
"""Marks a run's processes, so a run that fails kills what its launchers left (torchrun's
workers outlive a killed torchrun)."""
CONF = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=30"
TTL = 3.0
TOKEN = "bench-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(launcher: str, port: int, conf: str = CONF, given: int = 2) -> list[str]:
    """The launcher's command line; ``given``: how many candidates ``agentd-candidates``
    lists (127.0.0.1, .2, ...)."""
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-conf",
            conf,
        ]
    endpoint = f"127.0.0.1:{port}"
    if launcher == "agentd-candidates":
        endpoint = ",".join(f"127.0.0.{i + 1}:{port}" for i in range(given))
    if launcher == "agentd-no-standby":
        conf += ",standby=0"
    return [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        *(["--rdzv-conf", conf] if conf else []),
    ]


def reports(out: Path) -> list[dict[str, float]]:
    """What the workers reported so far (each file whole: written by a rename)."""
    return [json.loads(p.read_text()) for p in finished_reports(out, "member_*.json")]


def run_once(
    launcher: str,
    timeout: float,
    conf: str = CONF,
    after: float = 0.0,
    hosts: bool = False,
    frozen: bool = False,
) -> tuple[float | None, list[int | None]]:
    """(seconds from the kill to world 2 running again, or None; the survivors' exit codes).
    The host is killed ``after`` seconds after the three workers run; ``hosts``: each node
    on a loopback address of its own (127.0.0.1-3, ``--local-addr``), as three hosts;
    ``frozen``: a fourth node, frozen once the four run, and the host killed once the
    other three run again."""
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        out, port = Path(tmp), free_port()
        stop = out / "stop"
        marker = os.urandom(6).hex()
        env = {
            **os.environ,
            MARK_ENV: marker,
            "AGENTD_STORE_TOKEN": TOKEN,
            "PYTHONWARNINGS": "ignore",
            "OMP_NUM_THREADS": "1",
        }
        argv = [
            *command(launcher, port, conf, 4 if frozen else 2),
            "--nnodes",
            "2:4" if frozen else "2:3",
            "--rdzv-id",
            "bench",
            "--max-restarts",
            "3",
            WORKER,
            tmp,
            str(stop),
        ]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            script = argv.index(WORKER)
            for node in range(4 if frozen else 3):  # one after the other: the first serves
                own = ["--local-addr", f"127.0.0.{node + 1}"] if hosts else []
                procs.append(
                    subprocess.Popen(
                        [*argv[:script], *own, *argv[script:]],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        env=env,
                    )
                )
                time.sleep(0.5)
            nodes = len(procs)
            if not wait_for(
                lambda: sum(r["world"] == nodes for r in reports(out)) >= nodes, timeout
            ):
                return None, []
            running = max(r["started"] for r in reports(out))
            if frozen:
                procs[3].send_signal(signal.SIGSTOP)
                stopped = time.time()

                def three() -> list[dict[str, float]]:
                    return [r for r in reports(out) if r["world"] == 3 and r["started"] > stopped]

                if not wait_for(lambda: len(three()) == 3, timeout):
                    return None, []
                running = max(r["started"] for r in three()) + 1.0  # named silent by then
            time.sleep(max(0.0, running + after - time.time()))
            host = procs[0]
            host.send_signal(signal.SIGKILL)
            host.wait()
            killed = time.time()

            def again() -> list[dict[str, float]]:
                return [r for r in reports(out) if r["world"] == 2 and r["started"] > killed]

            recovered = wait_for(lambda: len(again()) == 2, timeout)
            took = max(r["started"] for r in again()) - killed if recovered else None
            stop.touch()
            codes: list[int | None] = []
            for proc in procs[1:3]:
                try:
                    codes.append(proc.wait(timeout))
                except subprocess.TimeoutExpired:
                    codes.append(None)
            return took, codes
        finally:
            end_run(procs, MARK_ENV, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--launchers", default="agentd,agentd-candidates,agentd-no-standby,torchrun"
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="agentd alone, with its default heartbeat and last call (see --after)",
    )
    parser.add_argument(
        "--after", default="0", help="seconds after the workers run to kill the host, e.g. 0,1,3,6"
    )
    parser.add_argument(
        "--lost-earlier",
        action="store_true",
        help="agentd alone, four nodes, one frozen before the store's host is killed",
    )
    parser.add_argument(
        "--given", action="store_true", help="with --lost-earlier: the four given as a list"
    )
    parser.add_argument("--record", action="store_true", help="write docs/figures.json")
    args = parser.parse_args()
    if args.defaults:
        after_round(args)
        return
    if args.lost_earlier:
        lost_earlier(args)
        return
    launchers = args.launchers.split(",")
    if "torchrun" in launchers and importlib.util.find_spec("torch") is None:
        print("torch is not installed: torchrun is left out")
        launchers.remove("torchrun")
    print(
        f"store host SIGKILLed in a 3-node --nnodes 2:3 job -> both survivors at world 2 "
        f"(target TTL + 2 = {TTL + 2:g}s; {args.runs} runs, {os.cpu_count()} CPUs)"
    )
    for name in launchers:
        results = [run_once(name, args.timeout) for _ in range(args.runs)]
        ok = [took for took, _ in results if took is not None]
        finished = sum(codes == [0, 0] for _, codes in results)
        line = (
            f"  {name:<18} went on {len(ok)}/{args.runs}, "
            f"finished with exit 0 {finished}/{args.runs}"
        )
        if ok:
            line += (
                f"  median {statistics.median(ok):5.2f} s  min {min(ok):5.2f}  max {max(ok):5.2f}"
            )
        codes = sorted({str(c) for _, cs in results for c in cs})
        print(line + f"  (survivors' exit codes: {', '.join(codes) or 'none'})", flush=True)


def after_round(args: argparse.Namespace) -> None:
    """The store's host killed at each delay of ``--after``, with agentd's defaults, each
    node on its own loopback address (as under Slurm on three hosts)."""
    delays = [float(d) for d in args.after.split(",")]
    print(
        f"store host SIGKILLed S s after the workers of a 3-node --nnodes 2:3 job run, "
        f"agentd's defaults (heartbeat 5 s, last call 30 s) -> both survivors at world 2 "
        f"(target 3 s; {args.runs} runs, {os.cpu_count()} CPUs)"
    )
    worst: list[float] = []
    for delay in delays:
        results = [
            run_once("agentd", args.timeout, "", delay, hosts=True) for _ in range(args.runs)
        ]
        ok = [took for took, _ in results if took is not None]
        worst.extend(ok if len(ok) == args.runs else [float("inf")])
        line = f"  after {delay:g} s: went on {len(ok)}/{args.runs}"
        if ok:
            line += f"  median {statistics.median(ok):5.2f} s  max {max(ok):5.2f}"
        print(line, flush=True)
    if args.record and worst:
        from figures import record

        record(
            "store_host_lost_after_round",
            f"{max(worst):.1f} s",
            f".venv/bin/python bench/bench_failover.py --defaults --after {args.after} "
            f"--runs {args.runs} --record",
            f"the slowest of {args.runs} runs at each delay ({args.after} s after the "
            "workers run): the store's host SIGKILLed -> both survivors at world 2",
        )


def lost_earlier(args: argparse.Namespace) -> None:
    """The store's host killed after another node was lost (frozen: its candidate silent)."""
    launcher = "agentd-candidates" if args.given else "agentd"
    print(
        "store host SIGKILLed in a 4-node --nnodes 2:4 job after a fourth node froze and the "
        f"others went on at world 3 -> both survivors at world 2 ({launcher}: "
        f"{'a given list' if args.given else 'one endpoint'}; {args.runs} runs, "
        f"{os.cpu_count()} CPUs)"
    )
    results = [run_once(launcher, args.timeout, hosts=True, frozen=True) for _ in range(args.runs)]
    ok = [took for took, _ in results if took is not None]
    line = f"  went on {len(ok)}/{args.runs}"
    if ok:
        line += f"  median {statistics.median(ok):5.2f} s  min {min(ok):5.2f}  max {max(ok):5.2f}"
    print(line, flush=True)
    if args.record and len(ok) == args.runs:
        from figures import record

        given = " --given" if args.given else ""
        record(
            f"store_host_lost_after_a_lost_host{given.replace(' --', '_')}",
            f"{statistics.median(ok):.2f} s",
            f".venv/bin/python bench/bench_failover.py --lost-earlier{given} --runs {args.runs} "
            "--record",
            f"the median of {args.runs} runs: a fourth node frozen, the others at world 3, "
            "then the store's host SIGKILLed -> both survivors at world 2 (TTL 3 s; "
            f"{'a given list of the four' if args.given else 'one endpoint: a growing list'})",
        )


if __name__ == "__main__":
    main()
