"""Helpers for jobs of several real agents: their arguments, and what their workers saw."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import WORKER, AgentProc

TOKEN = "job-secret"
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=60"


def members(agent: AgentProc, attempt: int) -> list[dict[str, str]]:
    """What each worker of the agent's ``attempt`` reported (``member`` mode)."""
    paths = sorted(agent.out_dir.glob(f"member_a{attempt}_*"))
    return [json.loads(p.read_text()) for p in paths if p.suffix != ".tmp"]


def world_sizes(agent: AgentProc, attempt: int) -> set[int]:
    return {int(m["WORLD_SIZE"]) for m in members(agent, attempt)}


def agent_args(
    endpoint: str, nnodes: str, *extra: str, conf: str = FAST + ",is_host=0"
) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "job",
            "--nnodes", nnodes, "--rdzv-conf", conf, *extra]  # fmt: skip


def member_job(stop_file: Path, *extra: str) -> list[str]:
    return [WORKER, "member", "--stop-file", str(stop_file), *extra]
