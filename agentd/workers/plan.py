"""How one worker of an attempt is launched: its directory, environment, argv and output
routes (the arguments of :func:`agentd.workers.processes.spawn_worker`, after the local rank)."""

from __future__ import annotations

import contextlib
import sys
from string import Template
from typing import TYPE_CHECKING, Any

from agentd.group import Worker, WorkerGroup
from agentd.rendezvous.api import agent_serves_store
from agentd.spec import Std, WorkerSpec, std_for
from agentd.wire.progress import STACK_FILE
from agentd.workers.env import WorkerEnvContext, common_env, worker_env
from agentd.workers.output import attempt_dir, disk_problem, ensure_dir, plan_route

if TYPE_CHECKING:
    from agentd.view import AgentView


FUNCTION_WORKER = (sys.executable, "-u", "-m", "agentd.workers.function")
"""How a function entrypoint's worker starts (the call and result files follow)."""


def worker_command(spec: WorkerSpec) -> list[str]:
    """The command line ``spec``'s workers run (with ``${local_rank}`` unsubstituted)."""
    if isinstance(spec.entrypoint, str):
        return [spec.entrypoint, *map(str, spec.args)]
    return [*FUNCTION_WORKER, "CALL", "RESULT"]


def plan_workers(
    agent: AgentView, group: WorkerGroup, staged: bool = False
) -> list[tuple[Any, ...]]:
    """:func:`plan_worker` for every worker of ``group``, with their common environment
    made once; ``staged``: the attempt's directories were made ahead, empty."""
    common = common_env(group.spec)
    return [plan_worker(agent, group, worker, common, staged) for worker in group.workers]


def plan_worker(
    agent: AgentView,
    group: WorkerGroup,
    worker: Worker,
    common: dict[str, str] | None = None,
    staged: bool = False,
) -> tuple[Any, ...]:
    """``(worker, argv, env, stdout route, stderr route, cwd, pass_fds)`` for ``worker`` in
    ``agent``'s current attempt (a function entrypoint's call file is written here);
    ``common`` as for :func:`~agentd.workers.env.worker_env`; ``staged`` as for
    :func:`plan_workers`."""
    spec = group.spec
    rank = worker.local_rank
    wdir = attempt_dir(agent.run_dir, agent.attempt, rank)
    error_file = wdir / "error.json"
    if not staged:
        try:
            ensure_dir(wdir)
        except OSError as exc:  # the worker runs all the same; its output reaches the console
            disk_problem(wdir, exc)
        with contextlib.suppress(FileNotFoundError):
            error_file.unlink()
    agent_store = agent_serves_store(agent.rdzv_handler, group.spec.master_addr)
    env = worker_env(
        group,
        worker,
        str(error_file),
        WorkerEnvContext(
            run_id=agent.run_id,
            restart_count=agent.restart_count,
            max_restarts=spec.max_restarts,
            use_agent_store=agent_store,
            owner_mark=agent.owner_mark,
            attempt=agent.attempt,
            timer_file=agent.timer_file,
            progress_pipe=agent.progress_pipe,
            stack_file=str(wdir / STACK_FILE),
            control_file=agent.control_file,
        ),
        common,
    )
    args = [
        Template(a).safe_substitute(local_rank=rank) if isinstance(a, str) else a for a in spec.args
    ]
    pass_fds: list[int] = []
    if isinstance(spec.entrypoint, str):
        argv = [spec.entrypoint, *map(str, args)]
    else:
        from agentd.workers.function import write_call

        call, result = wdir / "call.pickle", wdir / "return.pickle"
        pass_fds = write_call(call, spec.entrypoint, tuple(args))
        argv = [*FUNCTION_WORKER, str(call), str(result)]
    shown = spec.local_ranks_filter is None or rank in spec.local_ranks_filter
    prefix = spec.log_line_prefix_template.format(
        role=spec.role,
        local_rank=rank,
        rank=worker.global_rank,
        host=agent.hostname,
        node_rank=group.group_rank,
        attempt=agent.attempt,
    )
    routes = [
        plan_route(
            redirect=bool(std_for(spec.redirects, rank) & std),
            tee=bool(std_for(spec.tee, rank) & std),
            shown=shown,
            is_stderr=std is Std.ERR,
            file_path=wdir / name,
            prefix=prefix,
            duplicate_filters=tuple(filters or ()),
            duplicate_path=wdir.parent / f"filtered_{name}",
            times_of=(worker.global_rank, agent.attempt),
        )
        for std, name, filters in (
            (Std.OUT, "stdout.log", spec.duplicate_stdout_filters),
            (Std.ERR, "stderr.log", spec.duplicate_stderr_filters),
        )
    ]
    return worker, argv, env, routes[0], routes[1], None, pass_fds
