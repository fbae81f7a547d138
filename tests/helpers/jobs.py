"""Helpers for jobs of several real agents: their arguments, and what their workers saw."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import WORKER, AgentProc

TOKEN = "job-secret"
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"
STEADY = FAST.replace("keep_alive_max_attempt=4", "keep_alive_max_attempt=20")
"""FAST with a 10 s heartbeat TTL, for a test of something else than a lost node: FAST's 2 s
lapsed once on a loaded 2-core machine (the suite's second run of 2026-12-01), and the
round that re-formed restarted every worker under a test that counted their lines."""
STEADY_MEMBER = STEADY + ",is_host=0"
"""STEADY for an agent of a job whose store runs on its own (``run_store``). Five more
tests of something else than a lost node lost a 2 s lease with the suite run at ``-n 6``
on 2 cores (2026-12-03)."""
ALL_AT_ONCE = STEADY_MEMBER.replace("last_call_timeout=0.5", "last_call_timeout=10")
"""STEADY_MEMBER for agents started together into an elastic job (``MIN:MAX``): the first
round waits 10 s for them, since one slow to start on a loaded machine would otherwise
miss it and attempt 0 would not hold every node; a round of MAX seals at once. Once a
node leaves, its peers seal on their count, not at the last call."""


def members(agent: AgentProc, attempt: int) -> list[dict[str, str]]:
    """What each worker of the agent's ``attempt`` reported (``member`` mode)."""
    paths = sorted(agent.out_dir.glob(f"member_a{attempt}_*"))
    return [json.loads(p.read_text()) for p in paths if p.suffix != ".tmp"]


def world_sizes(agent: AgentProc, attempt: int) -> set[int]:
    return {int(m["WORLD_SIZE"]) for m in members(agent, attempt)}


def agent_args(
    endpoint: str, nnodes: str, *extra: str, conf: str = FAST + ",is_host=0"
) -> list[str]:
    return [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "job",
        "--nnodes",
        nnodes,
        "--rdzv-conf",
        conf,
        *extra,
    ]


def member_job(stop_file: Path, *extra: str) -> list[str]:
    return [WORKER, "member", "--stop-file", str(stop_file), *extra]


def latest_attempt(agent: AgentProc) -> int:
    """The newest attempt whose workers have reported (-1: none yet)."""
    attempts = [
        int(p.name.split("_")[1][1:]) for p in agent.out_dir.glob("member_a*") if p.suffix != ".tmp"
    ]
    return max(attempts, default=-1)


def one_round(agents: list[AgentProc], world: int, after: dict[int, int] | None = None) -> bool:
    """Whether every agent's newest attempt (newer than ``after[pid]``) is one round of
    ``world`` workers: the same size, master and ranks 0..world-1 each held once."""
    places = []
    for agent in agents:
        attempt = latest_attempt(agent)
        if attempt < 0 or (after is not None and attempt <= after.get(agent.pid, -1)):
            return False
        places += members(agent, attempt)
    if {int(m["WORLD_SIZE"]) for m in places} != {world}:
        return False
    if len({(m["MASTER_ADDR"], m["MASTER_PORT"]) for m in places}) != 1:
        return False
    return sorted(int(m["RANK"]) for m in places) == list(range(world))


def result_json(agent: AgentProc) -> dict:
    """The run's result.json (the agent's log dir holds one run)."""
    [path] = agent.log_dir.glob("*/result.json")
    return json.loads(path.read_text())


def one_works_on(folder: Path) -> list[str]:
    """A job whose worker exits at once (success) on every node but one started with
    ``WORKS_ON`` in its environment, whose worker touches ``folder/working`` and works on
    for 120 s: that node is still at work while the others wait in their exit barrier."""
    script = folder / "one_works_on.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "if 'WORKS_ON' in os.environ:\n"
        "    pathlib.Path(sys.argv[1], 'working').touch()\n"
        "    time.sleep(120)\n"
    )
    return [str(script), str(folder)]
