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
    plans = [plan_worker(agent, group, worker, common, staged) for worker in group.workers]
    if agent.logs_specs is not None:  # agentd's own CLI gives none: nothing to import
        from agentd.workers.logs_specs import overrides_reify

        if overrides_reify(agent.logs_specs):
            reroute(agent, group, plans)
    return plans


def reified_error_files(agent: AgentView, plans: list[tuple[Any, ...]]) -> dict[int, str]:
    """The workers' error files by local rank where the user's log specs chose them
    (:func:`reroute`); empty where agentd's layout did."""
    if agent.logs_specs is None:
        return {}
    from agentd.errors.error_file import ERROR_FILE_ENV
    from agentd.workers.logs_specs import overrides_reify

    if not overrides_reify(agent.logs_specs):
        return {}
    return {worker.local_rank: env.get(ERROR_FILE_ENV, "") for worker, _, env, *_ in plans}


def reroute(agent: AgentView, group: WorkerGroup, plans: list[tuple[Any, ...]]) -> None:
    """Where log specs of the user's own decide the paths (torch's ``LogsSpecs.reify``,
    given every worker's environment at once): each worker's output routes, and the
    ``TORCHELASTIC_ERROR_FILE`` that ``reify`` set in its environment."""
    from agentd.workers.logs_specs import dest_routes

    assert agent.logs_specs is not None
    spec = group.spec
    envs = {worker.local_rank: env for worker, _, env, *_ in plans}
    dest = agent.logs_specs.reify(envs)  # sets the error files in place
    filters = (
        tuple(spec.duplicate_stdout_filters or ()),
        tuple(spec.duplicate_stderr_filters or ()),
    )
    for index, (worker, argv, env, _, _, cwd, pass_fds) in enumerate(plans):
        prefix = worker_prefix(agent, group, worker)  # no line-times files beside theirs
        out, err = dest_routes(dest, worker.local_rank, prefix, None, filters)
        plans[index] = (worker, argv, env, out, err, cwd, pass_fds)


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
    prefix = worker_prefix(agent, group, worker)
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


def worker_prefix(agent: AgentView, group: WorkerGroup, worker: Worker) -> str:
    """The prefix of ``worker``'s console lines (``--log-line-prefix-template``)."""
    spec = group.spec
    return spec.log_line_prefix_template.format(
        role=spec.role,
        local_rank=worker.local_rank,
        rank=worker.global_rank,
        host=agent.hostname,
        node_rank=group.group_rank,
        attempt=agent.attempt,
    )
