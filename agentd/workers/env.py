"""The environment a worker starts with: torchrun's contract, minus agentd's secrets.

A worker inherits the agent's environment and the spec's ``env``, plus torch's variables
(``RANK`` ... ``TORCHELASTIC_ERROR_FILE``) and agentd's own (``AGENTD_OWNER``,
``AGENTD_ATTEMPT``). The agent's secrets never reach it: the store token and the etcd
password are removed, and a ``password=`` item is cut out of an inherited
``--rdzv-conf`` variable, so neither a worker nor anything it prints can leak them.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from agentd.group import Worker, WorkerGroup
from agentd.hygiene import orphans
from agentd.spec import WorkerSpec
from agentd.support.secrets import without_secrets
from agentd.wire.control import CONTROL_ENV
from agentd.wire.progress import DUMP_SIGNAL, DUMP_SIGNAL_ENV, PIPE_ENV, STACK_FILE_ENV

SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


class WorkerEnvContext(NamedTuple):
    """What the agent knows that goes into every worker's environment."""

    run_id: str
    restart_count: int
    max_restarts: int
    use_agent_store: bool
    owner_mark: str
    attempt: int
    timer_file: str | None = None
    progress_pipe: str | None = None
    stack_file: str | None = None
    control_file: str | None = None


def common_env(spec: WorkerSpec) -> dict[str, str]:
    """What every worker of ``spec`` starts with before its own variables (a preload
    zygote's environment)."""
    env = without_secrets(os.environ)
    env.update(spec.env)
    env.pop(orphans.OWNER_ENV, None)
    for name in (PIPE_ENV, STACK_FILE_ENV, DUMP_SIGNAL_ENV, CONTROL_ENV):  # an outer agent's
        env.pop(name, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault(SIGNALS_ENV, DEFAULT_SIGNALS)  # what the agent stops on, as torchrun says
    return env


def worker_env(
    group: WorkerGroup,
    worker: Worker,
    error_file: str,
    ctx: WorkerEnvContext,
    common: dict[str, str] | None = None,
) -> dict[str, str]:
    """The full environment of ``worker`` of ``group`` for this attempt; ``common`` is
    :func:`common_env` of the group's spec where the caller made it already."""
    spec = group.spec
    env = dict(common) if common is not None else common_env(spec)
    env.update(
        {
            "RANK": str(worker.global_rank),
            "LOCAL_RANK": str(worker.local_rank),
            "GROUP_RANK": str(group.group_rank),
            "ROLE_RANK": str(worker.role_rank),
            "ROLE_NAME": spec.role,
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "WORLD_SIZE": str(worker.world_size),
            "GROUP_WORLD_SIZE": str(group.group_world_size),
            "ROLE_WORLD_SIZE": str(worker.role_world_size),
            "MASTER_ADDR": str(group.master_addr),
            "MASTER_PORT": str(group.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(ctx.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
            "TORCHELASTIC_RUN_ID": ctx.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(ctx.use_agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
            ),
            "TORCHELASTIC_ERROR_FILE": error_file,
            orphans.OWNER_ENV: ctx.owner_mark,
            "AGENTD_ATTEMPT": str(ctx.attempt),
        }
    )
    if ctx.timer_file is not None:
        env["TORCHELASTIC_TIMER_FILE"] = ctx.timer_file
    if ctx.control_file is not None:
        env[CONTROL_ENV] = ctx.control_file
    if ctx.progress_pipe is not None:
        env[PIPE_ENV] = ctx.progress_pipe
        env[DUMP_SIGNAL_ENV] = str(int(DUMP_SIGNAL))
        if ctx.stack_file is not None:
            env[STACK_FILE_ENV] = ctx.stack_file
    if spec.virtual_local_rank:  # torch's: device 0 of a one-GPU view is this worker's GPU
        visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
        rank = worker.local_rank
        env["CUDA_VISIBLE_DEVICES"] = (
            visible[rank] if rank < len(visible) and visible[0] else str(rank)
        )
        env["LOCAL_RANK"] = "0"
    return env
