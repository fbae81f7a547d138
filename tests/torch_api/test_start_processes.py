"""torch's ``start_processes``: the process contexts frameworks drive themselves."""

from __future__ import annotations

import os
import signal
import sys

from tests.torch_api.conftest import elastic


def rank_times_ten(rank: int) -> int:
    return rank * 10


def fail_on_one(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 gave up")


def _envs(n: int) -> dict[int, dict[str, str]]:
    return {r: {"LOCAL_RANK": str(r), "PATH": os.environ["PATH"]} for r in range(n)}


def test_a_function_returns_its_values_by_local_rank(impl, tmp_path):
    mp = elastic(impl, "multiprocessing")
    context = mp.start_processes(
        "fn",
        rank_times_ten,
        {0: (0,), 1: (1,)},
        _envs(2),
        mp.DefaultLogsSpecs(log_dir=str(tmp_path)),
    )
    try:
        result = context.wait()
        assert not result.is_failed() and result.return_values == {0: 0, 1: 10}
        assert set(context.pids()) == {0, 1}
    finally:
        context.close()


def test_a_multiprocess_context_takes_torchs_arguments_start_method_among_them(impl, tmp_path):
    """torch's order puts ``start_method`` before ``logs_specs``: agentd's context had no
    such argument, so a torch user's call failed (by keyword) or misplaced the log specs."""
    mp = elastic(impl, "multiprocessing")
    context = mp.MultiprocessContext(
        name="fn",
        entrypoint=rank_times_ten,
        args={0: (0,), 1: (1,)},
        envs=_envs(2),
        start_method="spawn",
        logs_specs=mp.DefaultLogsSpecs(log_dir=str(tmp_path)),
    )
    try:
        context.start()
        result = context.wait()
        assert not result.is_failed() and result.return_values == {0: 0, 1: 10}
    finally:
        context.close()


def test_a_failing_rank_is_reported_with_its_error_file(impl, tmp_path):
    mp = elastic(impl, "multiprocessing")
    context = mp.start_processes(
        "fn", fail_on_one, {0: (0,), 1: (1,)}, _envs(2), mp.DefaultLogsSpecs(log_dir=str(tmp_path))
    )
    try:
        result = context.wait()
        assert result.is_failed() and set(result.failures) == {1}
        assert "rank 1 gave up" in str(result.failures[1].message)  # torch: the error dict
    finally:
        context.close()


def test_a_command_still_running_after_the_timeout_waits_then_closes(impl, tmp_path):
    mp = elastic(impl, "multiprocessing")
    args = {0: ("-c", "import time; time.sleep(60)")}
    context = mp.start_processes(
        "cmd", sys.executable, args, _envs(1), mp.DefaultLogsSpecs(log_dir=str(tmp_path))
    )
    pid = context.pids()[0]
    assert context.wait(timeout=0.2) is None
    context.close(signal.SIGTERM)
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
