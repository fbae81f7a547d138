"""torch's ``start_processes`` and process contexts, over agentd's worker spawning.

``start_processes(name, entrypoint, args, envs, logs_specs)`` starts one process per local
rank (``args`` and ``envs`` keyed by local rank) and returns a started :class:`PContext`:
``pids()``, ``wait(timeout)`` (a :class:`RunProcsResult` once every process succeeded or
one failed, None while they run; a failure stops the others), ``close(death_sig)``. A
command (a ``str`` entrypoint) runs as a :class:`SubprocessContext`, a function as a
:class:`MultiprocessContext` (spawned as agentd's function workers are, return values by
local rank). The processes are agentd's workers: their own process group, the
parent-death signal, output and ``TORCHELASTIC_ERROR_FILE`` where ``logs_specs.reify``
puts them (:mod:`agentd.workers.logs_specs`). They live on a background event loop, so
the calls are synchronous, as torch's.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentd.exceptions import field_error
from agentd.spec import check_start_method
from agentd.support.sync_bridge import BackgroundLoop
from agentd.support.tempdirs import private_dir
from agentd.workers.logs_specs import CONSOLE, LogsSpecs, dest_routes
from agentd.workers.process_failure import ProcessFailure
from agentd.workers.processes import WorkerProcess, spawn_worker, stop_workers
from agentd.workers.release_gate import RELEASE_FDS_ENV, ReleaseGate


@dataclass
class RunProcsResult:
    """What the processes ended with: return values or failures, by local rank."""

    return_values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return len(self.failures) > 0


class PContext:
    """Processes of one ``start_processes`` call (see the module)."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        args: Mapping[int, tuple[Any, ...]],
        envs: Mapping[int, Mapping[str, str]],
        logs_specs: LogsSpecs,
        log_line_prefixes: Mapping[int, str] | None = None,
    ) -> None:
        if set(args) != set(envs):
            rule = f"must name the local ranks of args, {sorted(args)}"
            raise field_error("envs", sorted(envs), rule)
        self.name = name
        self.entrypoint = entrypoint
        self.args = dict(args)
        self.envs = {rank: dict(env) for rank, env in envs.items()}
        self.nprocs = len(self.args)
        dest = logs_specs.reify(self.envs)  # and each env's TORCHELASTIC_ERROR_FILE
        self.stdouts = {r: dest.stdouts.get(r, CONSOLE) for r in self.args}
        self.stderrs = {r: dest.stderrs.get(r, CONSOLE) for r in self.args}
        self.error_files = {r: dest.error_files.get(r, "") for r in self.args}
        self._dest = dest
        self._work: Path | None = None
        """A function's call and return files, by local rank (removed at close)."""
        self._prefixes = dict(log_line_prefixes or {})
        self._loop: BackgroundLoop | None = None
        self._procs: dict[int, WorkerProcess] = {}
        self._gate: ReleaseGate | None = None
        self._result: RunProcsResult | None = None

    def start(self) -> None:
        """Start every process; returns once they all run."""
        if self._loop is None:
            self._loop = BackgroundLoop(f"pcontext-{self.name}")
            self._loop.call(self._start)

    async def _start(self) -> None:
        if not isinstance(self.entrypoint, str):
            self._gate = ReleaseGate(self.nprocs)
        for rank in sorted(self.args):
            argv, pass_fds = self._argv(rank)
            env = dict(self.envs[rank])
            if self._gate is not None:
                env[RELEASE_FDS_ENV] = self._gate.env_value
                pass_fds.extend(self._gate.worker_fds)
            prefix = self._prefixes.get(rank, f"[{self.name}{rank}]:")
            routes = dest_routes(self._dest, rank, prefix)
            self._procs[rank] = await spawn_worker(
                rank, argv, env, routes[0], routes[1], None, pass_fds
            )
        if self._gate is not None:
            self._gate.spawned()

    def _argv(self, rank: int) -> tuple[list[str], list[int]]:
        if isinstance(self.entrypoint, str):
            return [self.entrypoint, *map(str, self.args[rank])], []
        from agentd.workers.function import write_call
        from agentd.workers.plan import FUNCTION_WORKER

        call, result = self._work_files(rank)
        fds = write_call(call, self.entrypoint, tuple(self.args[rank]))
        return [*FUNCTION_WORKER, str(call), str(result)], fds

    def _work_files(self, rank: int) -> tuple[Path, Path]:
        """Local rank ``rank``'s call and return files, in a private directory."""
        if self._work is None:
            self._work = Path(private_dir(f"agentd-pcontext-{self.name}-"))
        return self._work / f"call_{rank}.pickle", self._work / f"return_{rank}.pickle"

    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self._procs.items()}

    def wait(self, timeout: float = -1, period: float = 1) -> RunProcsResult | None:
        """The result once every process succeeded or one failed (the others are then
        stopped); None if they still run after ``timeout`` seconds (< 0: no limit)."""
        if self._result is None and self._loop is not None:
            self._result = self._loop.call(self._wait, timeout)
        return self._result

    async def _wait(self, wait_for: float) -> RunProcsResult | None:
        pending = {proc.exited for proc in self._procs.values() if not proc.exited.done()}
        deadline = None if wait_for < 0 else asyncio.get_running_loop().time() + wait_for
        while pending and not self._any_failed():
            left = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if left is not None and left <= 0:
                return None
            _, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
        failed = {r: p for r, p in self._procs.items() if p.returncode not in (None, 0)}
        if failed:
            await self._stop(signal.SIGTERM, 30.0)
            failures = {
                r: ProcessFailure(r, p.pid, int(p.returncode or -1), self.error_files[r])
                for r, p in failed.items()
            }
            return RunProcsResult({}, failures, self.stdouts, self.stderrs)
        values: dict[int, Any] = {}
        if not isinstance(self.entrypoint, str):
            from agentd.workers.function import read_result

            values = {r: read_result(self._work_files(r)[1]) for r in self.args}
        else:
            values = dict.fromkeys(self.args)
        return RunProcsResult(values, {}, self.stdouts, self.stderrs)

    def _any_failed(self) -> bool:
        return any(p.returncode not in (None, 0) for p in self._procs.values())

    async def _stop(self, death_sig: int, grace: float) -> None:
        await stop_workers(list(self._procs.values()), death_sig, grace)
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    def close(self, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        """Stop whatever still runs (``death_sig``, then SIGKILL after ``timeout``)."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.call(self._stop, int(death_sig or signal.SIGTERM), float(timeout))
        finally:
            loop.close()
            if self._work is not None:
                shutil.rmtree(self._work, ignore_errors=True)


class SubprocessContext(PContext):
    """Processes running a command."""


class MultiprocessContext(PContext):
    """Processes running a function; torch's arguments, ``start_method`` among them
    (every method runs as ``spawn``)."""

    def __init__(
        self,
        name: str,
        entrypoint: Callable[..., Any] | str,
        args: Mapping[int, tuple[Any, ...]],
        envs: Mapping[int, Mapping[str, str]],
        start_method: str,
        logs_specs: LogsSpecs,
        log_line_prefixes: Mapping[int, str] | None = None,
    ) -> None:
        check_start_method(start_method)
        super().__init__(name, entrypoint, args, envs, logs_specs, log_line_prefixes)


def start_processes(
    name: str,
    entrypoint: Callable[..., Any] | str,
    args: Mapping[int, tuple[Any, ...]],
    envs: Mapping[int, Mapping[str, str]],
    logs_specs: LogsSpecs,
    log_line_prefixes: Mapping[int, str] | None = None,
    start_method: str = "spawn",
    **_: Any,
) -> PContext:
    """Start the processes (see the module); every ``start_method`` runs as ``spawn``."""
    context: PContext
    if isinstance(entrypoint, str):
        context = SubprocessContext(name, entrypoint, args, envs, logs_specs, log_line_prefixes)
    else:
        context = MultiprocessContext(
            name, entrypoint, args, envs, start_method, logs_specs, log_line_prefixes
        )
    try:
        context.start()
    except BaseException:
        context.close()
        raise
    return context
