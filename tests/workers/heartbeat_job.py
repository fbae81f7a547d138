"""A training loop that heartbeats, for the hang tests: ``heartbeat_job.py [options]``.

Every rank runs ``--steps`` steps of ``--step`` seconds, heartbeating after each; every
``--section-every`` steps it spends ``--section-time`` in the section ``--section``.
Rank ``--hang-rank`` hangs at step ``--hang-at`` (inside the section with
``--hang-in-section``) while the restart count is below ``--until-attempt``, with SIGTERM
blocked where ``--hang-deaf`` (as a rank blocked in native code with a Python handler for
SIGTERM is: the handler never runs); with ``--silent-rank`` that rank never heartbeats.
With ``--exit-time S`` it does not end its heartbeats and its interpreter's exit takes S
seconds, as torch's teardown may (an ``atexit`` handler registered before the first
heartbeat, so it runs after agentd's). At the end the node's ranks wait for each other, as
a job's last collective makes them (a rank cannot finish while a peer hangs), then each
prints ``trained <rank>``.
Writes its progress pipe's path to ``$TEST_AGENTD_OUT/pipe`` (for the foreign-pid test).
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import time

import agentd

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def hang(deaf: bool = False) -> None:
    if deaf:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step", type=float, default=0.1)
    parser.add_argument("--section", default="checkpoint")
    parser.add_argument("--section-every", type=int, default=0)
    parser.add_argument("--section-time", type=float, default=0.5)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=10)
    parser.add_argument("--hang-in-section", action="store_true")
    parser.add_argument("--hang-deaf", action="store_true")
    parser.add_argument("--until-attempt", type=int, default=1)
    parser.add_argument("--silent-rank", type=int, default=-1)
    parser.add_argument("--exit-time", type=float, default=0.0)
    args = parser.parse_args()
    if args.exit_time:
        atexit.register(time.sleep, args.exit_time)
    out = os.environ.get("TEST_AGENTD_OUT")
    if out and RANK == 0:
        with open(os.path.join(out, "pipe"), "w") as fp:
            fp.write(os.environ.get("AGENTD_PROGRESS_PIPE", ""))
    hangs = RANK == args.hang_rank and ATTEMPT < args.until_attempt
    for step in range(1, args.steps + 1):
        time.sleep(args.step)
        if hangs and step == args.hang_at:
            if args.hang_in_section:
                with agentd.section(args.section):
                    hang(args.hang_deaf)
            hang(args.hang_deaf)
        if RANK != args.silent_rank:
            agentd.heartbeat()
        if args.section_every and step % args.section_every == 0:
            with agentd.section(args.section):
                time.sleep(args.section_time)
    if not args.exit_time:
        agentd.end_heartbeats()
    if out:
        wait_for_the_nodes_ranks(os.path.join(out, f"finished_{ATTEMPT}"))
    print(f"trained {RANK}", flush=True)


def wait_for_the_nodes_ranks(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, str(os.environ.get("LOCAL_RANK", RANK))), "w").close()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    while len(os.listdir(folder)) < local_world:
        time.sleep(0.01)


if __name__ == "__main__":
    main()
